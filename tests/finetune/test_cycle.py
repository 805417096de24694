"""`flywheel cycle`: one full turn through the real parts (compile, dataset build, training
subprocess, evaluation subprocess, gate, MLflow registry), each step recorded on the run;
idempotent on a finished version; a failed cycle resumes at the step that failed; one running
cycle per domain."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.models import Domain, ModelVersion, PromotionEvent, Run
from flywheel.scheduling.cycle import CycleRequest, run_cycle
from flywheel.scheduling.runs import request_cancel
from flywheel.settings import Settings
from tests.conftest import Caller, run_cli
from tests.finetune.test_train_cli import EVAL_FRACTION, QUICK, build_version

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
    ),
    pytest.mark.commits("a running cycle's heartbeat thread writes from its own session"),
    pytest.mark.trains,
]
STEPS = ["compile", "build", "train_sft", "evaluate", "promote"]


def configure(
    sessions: sessionmaker[Session], base: Path, cycle: dict[str, Any] | None = None, **extra: Any
) -> None:
    """A quick cycle on the tiny base; `cycle` replaces keys of its cycle section, `extra`
    top-level keys."""
    quick = {
        "overrides": {"sft": QUICK},
        "recipe": {"eval_fraction": EVAL_FRACTION},
        "eval": {"max_new_tokens": 4, "k": 2},
    }
    config = {
        "base_model": str(base),
        "cycle": quick | (cycle or {}),
        "gate": {"min_items": 2},
    } | extra
    with unit_of_work(sessions) as session:
        session.execute(update(Domain).values(config=config))


def cycles(sessions: sessionmaker[Session]) -> list[Run]:
    with sessions() as session:
        query = select(Run).where(Run.method == "cycle")
        return list(session.scalars(query.order_by(Run.created_at)))


def count(sessions: sessionmaker[Session], model: Any, *where: Any) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where)) or 0


def test_a_cycle_runs_every_step_records_it_and_a_rerun_does_nothing(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    dataset = build_version(sessions, acme)
    configure(sessions, plain_base)

    code, out, err = run_cli(capsys, "cycle", "--domain", "billing", "--json")

    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "succeeded"
    assert list(result["steps"]) == STEPS
    [run] = cycles(sessions)
    assert (run.status, run.dataset_version_id, run.error) == ("succeeded", dataset.id, None)
    for name in STEPS:
        step = run.steps[name]
        assert step["status"] == "succeeded", name
        assert step["duration_s"] >= 0
        assert step["started_at"] <= step["finished_at"]
    assert run.steps["build"]["result"]["dataset_version"] == dataset.version
    trained = run.steps["train_sft"]["result"]
    assert trained["status"] == "succeeded"
    with sessions() as session:
        version = session.scalars(select(ModelVersion)).one()
    assert trained["model_version"] == version.version == "1"
    assert version.eval_results["dataset_version"] == dataset.version
    gate = run.steps["evaluate"]["result"]
    assert gate["is_promotable"] == version.gate_result["is_promoted"]
    promoted = run.steps["promote"]["result"]
    assert promoted["promoted"] == gate["is_promotable"]
    assert count(sessions, PromotionEvent) == (1 if gate["is_promotable"] else 0)
    assert "[cycle] train_sft ..." in err  # progress, step by step

    # the same version again: nothing to do, nothing trained
    code, out, err = run_cli(capsys, "cycle", "--domain", "billing", "--json")

    assert code == 0, err
    again = json.loads(out)
    assert again["status"] == "skipped"
    assert "already cycled" in again["error"]
    assert list(again["steps"]) == ["compile", "build"]
    assert count(sessions, Run, Run.method == "sft") == 1
    assert count(sessions, ModelVersion) == 1


def test_a_failed_cycle_resumes_at_the_step_that_failed(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    build_version(sessions, acme)
    configure(sessions, plain_base, gate={"min_items": 2, "no_such_setting": 1})

    code, _, err = run_cli(capsys, "cycle", "--domain", "billing")

    assert code == 1
    assert "unknown gate settings" in err
    [failed] = cycles(sessions)
    assert failed.status == "failed"
    assert failed.steps["evaluate"]["status"] == "failed"
    assert "promote" not in failed.steps
    trained_at = failed.steps["train_sft"]["finished_at"]

    configure(sessions, plain_base)  # fixed; run again
    code, out, err = run_cli(capsys, "cycle", "--domain", "billing", "--json")

    assert code == 0, err
    assert json.loads(out)["run_id"] == str(failed.id)  # the same run, resumed
    [resumed] = cycles(sessions)
    assert resumed.status == "succeeded"
    assert resumed.steps["train_sft"]["finished_at"] == trained_at  # not trained again
    assert count(sessions, Run, Run.method == "sft") == 1
    assert resumed.steps["evaluate"]["status"] == "succeeded"
    assert "train_sft: done in an earlier attempt" in err


def test_one_running_cycle_per_domain(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    build_version(sessions, acme)
    configure(sessions, plain_base)
    with unit_of_work(sessions) as session:
        domain = session.scalars(select(Domain)).one()
        alive = Run(
            tenant_id=domain.tenant_id, domain_id=domain.id, method="cycle", config={},
            config_sha256="0" * 64, status="running", started_at=utcnow(), heartbeat_at=utcnow(),
        )  # fmt: skip
        session.add(alive)

    code, _, err = run_cli(capsys, "cycle", "--domain", "billing")

    assert code == 1
    assert f"a cycle of billing is running (run {alive.id}" in err
    assert len(cycles(sessions)) == 1

    # its process died: no heartbeat for longer than cycle_stale_after_s -> taken over
    with unit_of_work(sessions) as session:
        session.execute(update(Run).values(heartbeat_at=utcnow() - timedelta(hours=1)))
    code, out, err = run_cli(capsys, "cycle", "--domain", "billing", "--json")

    assert code == 0, err
    assert json.loads(out)["run_id"] == str(alive.id)  # resumed, not a second one
    assert [run.status for run in cycles(sessions)] == ["succeeded"]


def test_cancelling_a_running_cycle_stops_its_training(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    tmp_path: Path,
) -> None:
    sessions = on_test_database
    build_version(sessions, acme)
    configure(sessions, plain_base, cycle={"overrides": {"sft": ["max_steps=100000"]}})
    settings = Settings(home=tmp_path / "home", cycle_heartbeat_s=0.2)
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            run_cycle(sessions, CycleRequest(acme.tenant_id, "billing"), settings)
        )
    )
    worker.start()
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline
        and count(sessions, Run, Run.method == "sft", Run.status == "running") == 0
    ):
        time.sleep(0.2)
    [run] = cycles(sessions)
    with unit_of_work(sessions) as session:
        request_cancel(session, tenant_id=acme.tenant_id, run_id=run.id)
    worker.join(timeout=120)

    assert not worker.is_alive()
    assert outcome[0].status == "cancelled"
    [run] = cycles(sessions)
    assert run.status == "cancelled"
    assert run.steps["train_sft"]["status"] == "cancelled"
    with sessions() as session:
        training = session.scalars(select(Run).where(Run.method == "sft")).one()
    assert training.status == "cancelled"  # SIGTERMed: checkpointed and stopped


def test_a_later_method_adapts_the_earlier_stage_merged_into_the_base(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    build_version(sessions, acme)
    configure(
        sessions,
        plain_base,
        cycle={"methods": ["sft", "dpo"], "overrides": {"sft": QUICK, "dpo": QUICK}},
    )

    code, out, err = run_cli(capsys, "cycle", "--domain", "billing", "--json")

    assert code == 0, err
    steps = json.loads(out)["steps"]
    assert list(steps) == ["compile", "build", "train_sft", "train_dpo", "evaluate", "promote"]
    sft, dpo = steps["train_sft"]["result"], steps["train_dpo"]["result"]
    assert sft["base"] == str(plain_base.resolve())
    merged = Path(sft["run_dir"]) / "merged"
    assert dpo["base"] == str(merged)
    assert (merged / "config.json").is_file()
    assert (merged / "model.safetensors").is_file()
    with sessions() as session:
        versions = {v.version: v for v in session.scalars(select(ModelVersion))}
    assert versions[dpo["model_version"]].base_model == str(merged)
    # the candidate is the last stage; with no champion it is measured against the domain's
    # own base, not against the merged SFT model it adapts
    assert steps["evaluate"]["result"]["version"] == dpo["model_version"]
    assert steps["evaluate"]["result"]["against"] == "base"
    scored = Path(os.environ["FLYWHEEL_HOME"]) / "evals" / f"acme.billing-v{dpo['model_version']}"
    ours = json.loads((scored / "ours.json").read_text(encoding="utf-8"))
    rival = json.loads((scored / "base.json").read_text(encoding="utf-8"))
    assert ours["model"]["base"] == str(merged)
    assert rival["model"] == {"base": str(plain_base.resolve()), "adapter": None}


def test_a_cycle_trains_kto_on_the_versions_labels(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    dataset = build_version(sessions, acme, has_labels=True)
    configure(
        sessions,
        plain_base,
        cycle={"methods": ["sft", "kto"], "overrides": {"sft": QUICK, "kto": QUICK}},
    )

    code, out, err = run_cli(capsys, "cycle", "--domain", "billing", "--json")

    assert code == 0, err
    steps = json.loads(out)["steps"]
    assert list(steps) == ["compile", "build", "train_sft", "train_kto", "evaluate", "promote"]
    assert steps["build"]["result"]["train"].get("label", 0) > 0
    trained = steps["train_kto"]["result"]
    with sessions() as session:
        run = session.scalars(select(Run).where(Run.method == "kto")).one()
    assert (run.status, run.dataset_version_id) == ("succeeded", dataset.id)
    assert (Path(trained["run_dir"]) / "dataset" / "train" / "kto.jsonl").is_file()
    assert steps["evaluate"]["result"]["version"] == trained["model_version"]
