"""`flywheel eval` scores a candidate only on an eval set it never trained on: its training
dataset version may share no prompt with the eval split, checked before anything is scored."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.items import KINDS
from flywheel.datasets.membership import held_item_ids, prompt_keys
from flywheel.datasets.models import DatasetMember, DatasetVersion
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work
from flywheel.errors import InvalidState
from flywheel.evaluation.lineage import check_lineage
from flywheel.models import ModelVersion, Run, SftExample
from flywheel.tenancy.service import get_domain
from tests.conftest import Caller, run_cli


def store_questions(session: Session, caller: Caller, domain_id: uuid.UUID) -> None:
    for n in range(40):
        session.add(
            SftExample(
                tenant_id=caller.tenant_id, domain_id=domain_id, source_kind="api",
                group_key=f"thread-{n}", content_sha256=f"{n:064x}", ingestor_version="t",
                messages=[{"role": "user", "content": f"question {n}?"}], completion=f"{n}",
            )
        )  # fmt: skip
    session.flush()


def candidate(session: Session, caller: Caller, dataset_id: uuid.UUID | None) -> ModelVersion:
    domain = get_domain(session, caller.tenant_id, "billing")
    run = Run(
        tenant_id=caller.tenant_id, domain_id=domain.id, method="sft", config_sha256="0" * 64,
        mlflow_run_id="r", status="succeeded", dataset_version_id=dataset_id,
    )  # fmt: skip
    session.add(run)
    session.flush()
    version = ModelVersion(
        tenant_id=caller.tenant_id, domain_id=domain.id, training_run_id=run.id,
        registered_model="acme.billing", version="1", adapter_uri="runs:/r/adapter",
        base_model="/models/tiny",
    )  # fmt: skip
    session.add(version)
    session.flush()
    return version


SFT = KINDS[0]


def leaky_copy(session: Session, built: DatasetVersion) -> DatasetVersion:
    """A version as the builder before prompt keys could leave one: `built`'s eval items in
    its train split too (the same questions, here the very items)."""
    leaky = DatasetVersion(
        tenant_id=built.tenant_id, domain_id=built.domain_id, version=0,
        manifest_sha256="f" * 64, eval_sha256="e" * 64, recipe={}, stats={},
    )  # fmt: skip
    session.add(leaky)
    session.flush()
    for position, item_id in enumerate(list(held_item_ids(session, built, SFT, "eval"))):
        session.add(
            DatasetMember(
                id=uuid.uuid4(),
                dataset_version_id=leaky.id,
                split="train",
                group_key="g",
                weight=1.0,
                position=position,
                until_version=1,
                sft_example_id=item_id,
            )
        )  # fmt: skip (a row written for its version only)
    session.flush()
    return leaky


def build(session: Session, caller: Caller) -> DatasetVersion:
    domain = get_domain(session, caller.tenant_id, "billing")
    store_questions(session, caller, domain.id)
    return build_dataset_version(
        session=session, tenant_id=caller.tenant_id, domain_id=domain.id,
        recipe=DatasetRecipe(eval_fraction=0.3),
    ).version  # fmt: skip


def test_a_candidate_trained_on_its_eval_prompts_is_refused_before_scoring(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    with unit_of_work(on_test_database) as session:
        built = build(session, acme)
        leaky = leaky_copy(session, built)
        shared = len(prompt_keys(session, [built.id], "eval"))
        candidate(session, acme, leaky.id)

    code, out, err = run_cli(capsys, "eval", "--domain", "billing")

    assert code != 0
    assert out == ""
    assert (
        f"v1 of billing trained on dataset v0, which shares {shared} prompts with the eval set "
        "of dataset v1: it cannot be scored on it"
    ) in err
    assert len(err.strip().splitlines()) == 1
    with on_test_database() as session:
        assert session.scalars(select(ModelVersion.gate_result)).one() == {}


def test_a_clean_lineage_passes_and_an_unknown_one_is_refused(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    with unit_of_work(sessions) as session:
        built = build(session, acme)
        clean = candidate(session, acme, built.id)
        assert check_lineage(session, clean, built, "billing") == built.id
        clean.training_run_id = None
        with pytest.raises(InvalidState, match="has no recorded training dataset version"):
            check_lineage(session, clean, built, "billing")
