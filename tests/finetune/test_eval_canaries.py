"""Canaries at evaluation, through the platform: a model that passes a canary is refused by
the gate, and the alarm is stored and tagged on its MLflow version; a task domain's evaluation
that ran no canaries is refused, a domain without tasks is judged as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from finetune import synthetic, tiny
from finetune.canaries import eval_canaries
from flywheel.datasets.reader import version_lineage
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.datasets.versions import latest_version
from flywheel.db import unit_of_work
from flywheel.evaluation.gate import Evaluation, GatePolicy, decide
from flywheel.evaluation.service import EvalRequest, _with_canary_rule, evaluate_version
from flywheel.models import Domain, ModelVersion, Run
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.service import register_version
from flywheel.settings import Settings
from flywheel.signals.candidates import Provenance, TaskCandidate
from flywheel.signals.store import store_candidates
from flywheel.tenancy.service import get_domain
from tests.conftest import Caller, run_cli
from tests.finetune.test_evaluate import save_adapter

pytestmark = pytest.mark.filterwarnings(
    "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
)


def build_answer_version(sessions: sessionmaker[Session], caller: Caller) -> int:
    """A dataset version of 24 answer tasks; the number of them in its eval split."""
    problems = synthetic.split_problems().train[:24]
    candidates = [
        TaskCandidate(
            Provenance("task_file", p.prompt, p.prompt),
            p.prompt,
            entry_point=None,
            reference_solution=None,
            hidden_tests=None,
            task_kind="answer",
            answer=p.answer,
        )
        for p in problems
    ]
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            candidates=candidates,
            ingestor_version="test",
        )
        built = build_dataset_version(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            recipe=DatasetRecipe(eval_fraction=0.5),
        )
        return sum(row["split"] == "eval" for row in version_lineage(session, built.version))


def leaky_base(directory: Path, canary: dict[str, Any]) -> Path:
    """A tiny model trained on one canary's secret, as if the canary had leaked into its
    training data: its greedy reply to that canary's prompt is the secret answer."""
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts(), vocab_size=128)
    model = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    prompt = [{"role": "user", "content": canary["prompt"]}]
    head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(head + canary["answer"] + tokenizer.eos_token, add_special_tokens=False)
    input_ids = torch.tensor([ids["input_ids"]])
    start = len(tokenizer(head, add_special_tokens=False)["input_ids"])
    labels = input_ids.clone()
    labels[:, :start] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(400):
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 1e-3:
            break
    assert loss.item() < 1e-3, "the tiny model did not memorise the canary"
    tiny.save_base(directory, model, tokenizer)
    return directory


def register_leaky_version(
    sessions: sessionmaker[Session], caller: Caller, base: Path, tmp_path: Path, uri: str
) -> None:
    """Version 1 of acme.billing: a zero LoRA adapter on the leaky base, logged to MLflow."""
    adapter = save_adapter(base, tmp_path / "adapter", is_zero=True)
    mlflow.set_tracking_uri(uri)
    experiment_id = mlflow.create_experiment(
        "leaky", artifact_location=(tmp_path / "artifacts").as_uri()
    )
    with mlflow.start_run(experiment_id=experiment_id) as mlflow_run:
        mlflow.log_artifacts(str(adapter), artifact_path="adapter")
    run_id = mlflow_run.info.run_id
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        run = Run(
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            method="sft",
            config_sha256="0" * 64,
            mlflow_run_id=run_id,
            status="succeeded",
            # its lineage: the domain's version (the zero adapter trained on none of its eval)
            dataset_version_id=latest_version(session=session, domain_id=domain_id).id,
        )
        session.add(run)
        session.flush()
        register_version(
            session=session,
            registry=MlflowRegistry(uri),
            run=run,
            adapter_uri=f"runs:/{run_id}/adapter",
            base_model=str(base),
        )


@pytest.mark.trains
def test_a_model_that_passes_a_canary_is_refused_and_tagged(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    mlflow_store: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    eval_tasks = build_answer_version(sessions, acme)
    assert 0 < eval_tasks <= 80  # then the evaluation draws these 4 answer canaries (seed 0)
    canaries = eval_canaries([{"task_kind": "answer"}], seed=0)
    leaky = leaky_base(tmp_path / "leaky-base", canaries[0])
    settings = Settings()
    assert settings.resolved_mlflow_tracking_uri == mlflow_store
    register_leaky_version(sessions, acme, leaky, tmp_path, mlflow_store)
    with unit_of_work(sessions) as session:
        domain = get_domain(session, acme.tenant_id, "billing")

    # the rival is the plain base, which knows no canary's secret
    request = EvalRequest(domain, k=2, max_new_tokens=32, base=plain_base)
    outcome = evaluate_version(sessions, request, settings)

    assert not outcome.decision.is_promoted
    assert any("canary items" in reason for reason in outcome.decision.reasons)
    evidence = outcome.decision.evidence["canary"]
    assert evidence["challenger_pass_rate"] > 0
    assert evidence["champion_pass_rate"] == 0.0
    assert outcome.decision.evidence["policy"]["is_canary_required"] is True
    with sessions() as session:
        version = session.scalars(select(ModelVersion)).one()
    assert canaries[0]["item_id"] in version.eval_results["canaries"]["passed_ids"]
    assert version.eval_results["canaries"]["kinds"].keys() == {"answer"}
    assert version.eval_results["against"]["canaries"]["passed"] == 0
    assert not any(i.startswith("canary:") for i in version.eval_results["scores"]["pass@1"])
    alarm = version.gate_result["canary_alarm"]
    assert canaries[0]["item_id"] in alarm
    tags = MlflowClient(tracking_uri=mlflow_store).get_model_version("acme.billing", "1").tags
    assert tags["flywheel.canary_alarm"] == alarm
    assert tags["flywheel.gate"] == "failed against base"
    code, _, err = run_cli(capsys, "models", "promote", "--domain", "billing", "--to", "1")
    assert code != 0
    assert "did not pass its gate" in err


ITEMS = [f"item-{n}" for n in range(10)]  # 10 wins of 10: p = 2^-10, past the exact test


def evaluation(canary_pass_rate: float | None) -> Evaluation:
    scores = dict.fromkeys(ITEMS, 1.0)
    return Evaluation({"pass@1": scores}, dict.fromkeys(ITEMS, "x"), canary_pass_rate)


@pytest.mark.no_database
def test_a_task_domain_whose_evaluation_ran_no_canaries_is_refused() -> None:
    policy = GatePolicy("pass@1", min_items=1, bootstrap_samples=100)
    base = Evaluation({"pass@1": dict.fromkeys(ITEMS, 0.0)}, dict.fromkeys(ITEMS, "x"))
    tasks = {"counts": {"tasks": 10}}

    required = _with_canary_rule(policy, {}, tasks)

    assert required.is_canary_required
    refused = decide(evaluation(None), base, required)
    assert refused.reasons == [
        "the challenger's evaluation ran no canary items, and the policy needs them"
    ]
    assert decide(evaluation(0.0), base, required).is_promoted
    # a domain without tasks is unchanged, and the domain's gate settings have the last word
    assert _with_canary_rule(policy, {}, {"counts": {"tasks": 0}}) == policy
    chosen = {"gate": {"is_canary_required": False}}
    assert _with_canary_rule(policy, chosen, tasks) == policy
