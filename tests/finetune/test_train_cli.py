"""`flywheel train`: a dataset version built in the platform database trains through the
subprocess boundary and leaves a recorded run, its MLflow run and the adapter; bad requests
are refused in one line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from finetune import synthetic
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work, utcnow
from flywheel.models import DatasetVersion, Domain, ModelVersion, Run
from flywheel.signals.candidates import LabelCandidate, PairCandidate, Provenance, SftCandidate
from flywheel.signals.store import store_candidates
from tests.conftest import Caller, run_cli

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
    ),
    pytest.mark.trains,
]
EVAL_FRACTION = 0.4
"""The split hashes (random domain id, group): with 24 groups, 0.2 left the eval set empty
0.8^24 = 0.5% of the time (a CI run met it); 0.4 leaves it (or train) empty 5e-6 of runs."""
QUICK = ["max_steps=2", "per_device_train_batch_size=4", "logging_steps=1", "save_steps=1"]


Candidate = SftCandidate | PairCandidate | LabelCandidate


def synthetic_candidates(*, has_labels: bool = False) -> list[Candidate]:
    """An SFT example and a preference pair for each of 24 synthetic training problems, and
    (`has_labels`) a completion labelled desirable (the answer) or not (a wrong one)."""
    problems = synthetic.split_problems().train[:24]
    labels: list[Candidate] = [
        LabelCandidate(
            Provenance("task_file", f"label {p.prompt}", p.prompt),
            synthetic.user(p),
            p.answer if index % 2 else p.wrong_answer,
            bool(index % 2),
            "synthetic",
        )
        for index, p in enumerate(problems)
    ]
    return (
        [
            SftCandidate(Provenance("task_file", p.prompt, p.prompt), synthetic.user(p), p.answer)
            for p in problems
        ]
        + [
            PairCandidate(
                Provenance("task_file", f"pair {p.prompt}", p.prompt),
                synthetic.user(p),
                p.answer,
                p.wrong_answer,
                "synthetic",
            )
            for p in problems
        ]
        + (labels if has_labels else [])
    )


def build_version(
    sessions: sessionmaker[Session], caller: Caller, *, has_labels: bool = False
) -> DatasetVersion:
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            candidates=synthetic_candidates(has_labels=has_labels),
            ingestor_version="test",
        )
        built = build_dataset_version(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            recipe=DatasetRecipe(eval_fraction=EVAL_FRACTION),
        )
        return built.version


@pytest.mark.parametrize("method", ["sft", "dpo", "kto"])
def test_train_runs_the_recipe_on_a_version_and_records_the_run(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
    method: str,
) -> None:
    version = build_version(on_test_database, acme, has_labels=method == "kto")
    version_id = version.id

    code, out, err = run_cli(
        capsys, "train", method, "--domain", "billing", "--base", str(plain_base), *QUICK, "--json"
    )

    assert code == 0, err
    result = json.loads(out)
    with on_test_database() as session:
        run = session.scalars(select(Run)).one()
    assert (run.status, run.method, run.dataset_version_id) == ("succeeded", method, version.id)
    assert run.mlflow_run_id == result["mlflow_run_id"]
    assert run.finished_at is not None
    assert run.config["overrides"] == QUICK
    mlflow.set_tracking_uri(f"sqlite:///{Path(result['run_dir']).parents[1] / 'mlflow.db'}")
    found = MlflowClient().get_run(run.mlflow_run_id)
    assert found.data.tags["flywheel.dataset_version_id"] == str(version.id)
    assert found.data.tags["flywheel.dataset_manifest_sha256"] == version.manifest_sha256
    assert result["adapter_uri"] == f"runs:/{run.mlflow_run_id}/adapter"
    names = {item.path for item in MlflowClient().list_artifacts(run.mlflow_run_id, "adapter")}
    assert "adapter/adapter_model.safetensors" in names
    # registered: the domain's model has it as its challenger, with its lineage
    with on_test_database() as session:
        version = session.scalars(select(ModelVersion)).one()
    assert (version.registered_model, version.version) == ("acme.billing", "1")
    assert result["model_version"] == "1"
    registered = MlflowClient().get_model_version_by_alias("acme.billing", "challenger")
    assert str(registered.version) == "1"
    assert registered.tags["flywheel.dataset_version_id"] == str(version_id)


def test_a_failing_trainer_is_a_failed_run_with_its_reason(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    plain_base: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    build_version(on_test_database, acme)

    code, _, err = run_cli(
        capsys, "train", "sft", "--domain", "billing", "--base", str(plain_base), "lora.rank=2"
    )

    # a config error is bad input: status 2 and one line (the trainer's own goes to the log)
    assert code == 2
    assert err.startswith("error: unknown config key 'lora.rank'")
    assert err.count("\n") == 1
    with on_test_database() as session:
        run = session.scalars(select(Run)).one()
    assert run.status == "failed"
    assert run.error == "unknown config key 'lora.rank'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train", "ppo", "--domain", "billing"), "unknown training method"),
        (("train", "sft", "--domain", "billing", "--dataset-version", "9"), "has no dataset v9"),
        (("train", "sft", "--domain", "billing", "--base", "/nonexistent"), "not a model"),
        (("train", "sft", "--domain", "billing"), "no base model"),
        (("train", "sft", "--domain", "billing", "--dataset-version", "1"), "tainted"),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    version = build_version(on_test_database, acme)
    if message == "tainted":
        with unit_of_work(on_test_database) as session:
            session.execute(
                update(DatasetVersion)
                .where(DatasetVersion.id == version.id)
                .values(tainted_at=utcnow())
            )
        args = (*args, "--base", "/nonexistent")

    code, _, err = run_cli(capsys, *args)

    assert code != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1
    with on_test_database() as session:
        assert session.scalars(select(Run)).all() == []
