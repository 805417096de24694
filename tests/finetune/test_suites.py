"""`flywheel suites train`: a two-domain suite trains one adapter (one trainer, one MLflow run),
registered as a version of each member's model, gated on each member's own eval set, and
promoted in every member or in none; its per-domain loss is logged at every logging step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from finetune import synthetic
from flywheel.db import unit_of_work
from flywheel.evaluation.gate import Evaluation, GatePolicy, decide
from flywheel.models import Domain, ForgetRequest, ModelVersion, PromotionEvent, Run, SuiteRun
from flywheel.registry.service import taint_models_trained_on
from flywheel.suites.cycle import refusal
from tests.conftest import Caller, run_cli
from tests.finetune.test_train_cli import QUICK
from tests.integration.test_suites import add_domain, fill

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
    ),
    pytest.mark.trains,
]
MEMBERS = ("billing", "shipping")


def configure(sessions: sessionmaker[Session], base: Path, name: str, **gate: Any) -> None:
    config = {
        "base_model": str(base),
        "cycle": {"eval": {"max_new_tokens": 4, "k": 1}},
        "gate": {"min_items": 2} | gate,
    }
    with unit_of_work(sessions) as session:
        session.execute(update(Domain).where(Domain.name == name).values(config=config))


@pytest.fixture
def suite(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> sessionmaker[Session]:
    """billing and shipping, 24 distinct synthetic problems each, in suite `support`."""
    sessions = on_test_database
    add_domain(sessions, acme, "shipping")
    problems = synthetic.split_problems().train
    fill(sessions, acme, "billing", problems[:24])
    fill(sessions, acme, "shipping", problems[24:48])
    for name in MEMBERS:
        configure(sessions, plain_base, name)
    code, _, err = run_cli(capsys, "suites", "create", "support", "--domain", "billing=0.7",
                           "--domain", "shipping=0.3")  # fmt: skip
    assert code == 0, err
    return sessions


def versions(sessions: sessionmaker[Session]) -> dict[str, ModelVersion]:
    with sessions() as session:
        rows = session.execute(select(Domain.name, ModelVersion).join(Domain)).all()
    return {str(name): version for name, version in rows}


def test_a_two_domain_suite_trains_one_adapter_gated_per_member(
    suite: sessionmaker[Session], mlflow_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sessions = suite

    code, out, err = run_cli(capsys, "suites", "train", "support", *QUICK, "--json")

    assert code == 0, err
    result = json.loads(out)
    assert result["status"] in ("succeeded", "refused")
    # one trainer: one MLflow run, one adapter, a version of each member's model
    with sessions() as session:
        runs = session.scalars(select(Run).order_by(Run.created_at)).all()
        suite_run = session.scalars(select(SuiteRun)).one()
    assert len(runs) == 2
    assert {run.mlflow_run_id for run in runs} == {result["mlflow_run_id"]}
    assert {run.config["suite"] for run in runs} == {"support"}
    found = versions(sessions)
    assert set(found) == set(MEMBERS)
    assert {v.adapter_uri for v in found.values()} == {result["adapter_uri"]}
    assert {v.registered_model for v in found.values()} == {"acme.billing", "acme.shipping"}
    client = MlflowClient(tracking_uri=mlflow_store)
    for name, version in found.items():
        tags = client.get_model_version(version.registered_model, version.version).tags
        assert tags["flywheel.suite"] == "support"
        assert tags["flywheel.suite_run_id"] == str(suite_run.id)
        passed = result["status"] == "succeeded"
        assert tags["flywheel.suite_gate"].startswith("passed" if passed else "refused: member")
        # gated on its own eval set, against its own rival
        run = next(r for r in runs if r.id == version.training_run_id)
        assert version.eval_results["dataset_version_id"] == str(run.dataset_version_id)
        assert version.gate_result["against"] == "base"
        assert result["verdicts"][name]["is_promotable"] == version.gate_result["is_promoted"]
    # the suite's verdict is every member's: promoted in both, or in neither
    every = all(v["is_promotable"] for v in result["verdicts"].values())
    assert result["status"] == ("succeeded" if every else "refused")
    assert (suite_run.status, suite_run.result["verdicts"]) == (result["status"],
                                                                result["verdicts"])  # fmt: skip
    with sessions() as session:
        events = session.scalars(select(PromotionEvent)).all()
    assert len(events) == (2 if every else 0)
    assert {event.actor for event in events} <= {f"suite:{suite_run.id}"}
    # per-domain loss at the start and each logging step: in the record and in MLflow
    assert {name: [step for step, _ in curve] for name, curve in result["domain_loss"].items()} \
        == {name: [0, 1, 2] for name in MEMBERS}  # fmt: skip
    history = client.get_metric_history(result["mlflow_run_id"], "domain.shipping.loss")
    assert [point.step for point in history] == [0, 1, 2]
    assert all(point.value > 0 for point in history)


def test_one_member_refused_refuses_the_suite_in_every_member(
    suite: sessionmaker[Session], plain_base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sessions = suite
    # shipping's gate asks for more evidence than its eval set holds: its verdict is a refusal
    configure(sessions, plain_base, "shipping", min_items=10_000)

    code, out, err = run_cli(capsys, "suites", "train", "support", *QUICK, "--json")

    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "refused"
    assert result["verdicts"]["shipping"]["is_promotable"] is False
    assert "billing" in result["verdicts"]  # every member's verdict is recorded
    # billing's own verdict is whatever its (tiny, barely trained) candidate earned; the
    # suite is refused either way, naming shipping, and billing's version with it
    [reason] = result["reasons"]
    assert "shipping" in reason
    assert reason.endswith("one adapter is promoted in every member or in none")
    found = versions(sessions)
    for version in found.values():
        assert version.gate_result["is_promoted"] is False
        assert version.gate_result["suite"]["verdicts"]["shipping"] is False
    with sessions() as session:
        assert session.scalars(select(PromotionEvent)).all() == []
    # billing's version is refused by the promote path too, naming the suite
    code, _, err = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")
    assert code == 1
    assert "did not pass its gate" in err
    assert "suite support: member" in err
    code, out, _ = run_cli(capsys, "suites", "show", "support")
    assert "refused" in out
    assert "shipping refused" in out

    # data forgotten from one member taints the adapter in every member it is a version of
    with unit_of_work(sessions) as session:
        shipping = session.scalars(select(Run).where(Run.domain_id == found["shipping"].domain_id))
        dataset_id = shipping.one().dataset_version_id
        assert dataset_id is not None
        forget = ForgetRequest(tenant_id=found["shipping"].tenant_id, actor="test",
                               subject_kind="rater", subject_sha256="0" * 64)  # fmt: skip
        session.add(forget)
        session.flush()
        tainted = taint_models_trained_on(session, [dataset_id], request_id=forget.id)
    assert set(tainted) == {version.id for version in found.values()}


def test_the_suite_gate_refuses_when_any_members_evaluation_regresses() -> None:
    """The gate's own inputs: billing's candidate matches its champion, shipping's loses
    a third of what its champion gets right."""
    items = [f"item-{n}" for n in range(60)]
    policy = GatePolicy(primary_metric="exact_match", bootstrap_samples=2000)
    same = {item: 1.0 if n % 2 else 0.0 for n, item in enumerate(items)}
    worse = {item: 0.0 if n % 3 == 0 else score for n, (item, score) in enumerate(same.items())}
    slices = dict.fromkeys(items, "all")
    better = dict.fromkeys(items, 1.0)
    verdicts = {
        "billing": decide(Evaluation({"exact_match": better}, slices),
                          Evaluation({"exact_match": same}, slices), policy),
        "shipping": decide(Evaluation({"exact_match": worse}, slices),
                           Evaluation({"exact_match": same}, slices), policy),
    }  # fmt: skip

    assert verdicts["billing"].is_promoted
    assert not verdicts["shipping"].is_promoted
    reason = refusal({name: {"is_promotable": v.is_promoted} for name, v in verdicts.items()})
    assert reason is not None
    assert reason.startswith("member shipping was refused by its gate")
    passing = {name: {"is_promotable": True} for name in MEMBERS}
    assert refusal(passing) is None
