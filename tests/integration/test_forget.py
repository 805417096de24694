"""`flywheel forget`: a rater's events and a source record go, with everything compiled from
them; other raters' judgements are recompiled; dataset and model versions that used the data
are tainted; the request is audited without the identifier; other tenants are untouched."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.membership import version_members
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work
from flywheel.models import (
    DatasetVersion,
    Domain,
    EvalIndexPart,
    FeedbackEvent,
    ForgetRequest,
    LabeledCompletion,
    ModelVersion,
    PreferencePair,
    Run,
    SftExample,
)
from flywheel.signals.candidates import Provenance, SftCandidate
from flywheel.signals.store import store_candidates
from tests.conftest import Caller, run_cli
from tests.integration.test_compile import OTHER, Feedback

ALL_TRAIN = DatasetRecipe(eval_fraction=0.0, replay_fraction=0.0)
SECRET_FIX = "The card fee is 2% and never more, says the corrector."


def build(sessions: sessionmaker[Session], feedback: Feedback) -> DatasetVersion:
    with unit_of_work(sessions) as session:
        built = build_dataset_version(
            session=session,
            tenant_id=feedback.tenant_id,
            domain_id=feedback.domain_id,
            recipe=ALL_TRAIN,
        )
        return built.version


def train_on(sessions: sessionmaker[Session], version: DatasetVersion) -> uuid.UUID:
    """A training run on the version and the model version it produced."""
    with unit_of_work(sessions) as session:
        run = Run(
            tenant_id=version.tenant_id,
            domain_id=version.domain_id,
            dataset_version_id=version.id,
            method="sft",
            config_sha256="0" * 64,
            status="succeeded",
        )
        session.add(run)
        session.flush()
        model = ModelVersion(
            tenant_id=version.tenant_id,
            domain_id=version.domain_id,
            training_run_id=run.id,
            registered_model="acme.billing",
            version="1",
            adapter_uri="runs:/x/adapter",
            base_model="tiny",
        )
        session.add(model)
        session.flush()
        return model.id


def texts_stored(sessions: sessionmaker[Session]) -> str:
    """Every compiled text, to search for what must be gone."""
    with sessions() as session:
        parts = [
            *session.scalars(select(SftExample.completion)),
            *session.scalars(select(PreferencePair.chosen)),
            *session.scalars(select(PreferencePair.rejected)),
            *session.scalars(select(LabeledCompletion.completion)),
        ]
    return "\n".join(parts)


def member_items(sessions: sessionmaker[Session], version_id: uuid.UUID) -> set[uuid.UUID]:
    with sessions() as session:
        version = session.get_one(DatasetVersion, version_id)
        return {held.item_id for held in version_members(session, version)}


@pytest.fixture
def setup(
    on_test_database: sessionmaker[Session], acme: Caller, globex: Caller
) -> tuple[Feedback, Feedback]:
    """acme: u-1 likes A and corrects B; u-2 dislikes B; u-2 alone rates another prompt; a
    ticket's SFT example. globex: its own u-1 rates its own interaction."""
    sessions = on_test_database
    ours, theirs = Feedback(sessions, acme), Feedback(sessions, globex)
    a, b = ours.interaction("A: the fee is 1%"), ours.interaction("B: there is no fee")
    ours.thumbs(a, up=True, rater="u-1")
    ours.event("correction", {"text": SECRET_FIX}, on=b, rater="u-1")
    ours.thumbs(b, up=False, rater="u-2")
    other = ours.interaction("C: cancel in settings", messages=OTHER)
    ours.thumbs(other, up=True, rater="u-2")
    with unit_of_work(sessions) as session:
        ticket = Provenance("ticket", "zendesk:4711", "zendesk:4711")
        store_candidates(
            session=session,
            tenant_id=ours.tenant_id,
            domain_id=ours.domain_id,
            candidates=[
                SftCandidate(ticket, [{"role": "user", "content": "Refund?"}], "Refunded today.")
            ],
            ingestor_version="test",
        )
    theirs.thumbs(theirs.interaction("A: the fee is 1%"), up=True, rater="u-1")
    ours.compile()
    theirs.compile()
    return ours, theirs


def test_forgetting_a_rater_deletes_and_recompiles_and_taints(
    on_test_database: sessionmaker[Session],
    setup: tuple[Feedback, Feedback],
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    ours, theirs = setup
    assert SECRET_FIX in texts_stored(sessions)
    version = build(sessions, ours)
    model_id = train_on(sessions, version)
    their_version = build(sessions, theirs)
    before = member_items(sessions, version.id)

    code, out, _ = run_cli(capsys, "forget", "--rater", "u-1", "--tenant", "acme", "--json")

    assert code == 0
    report = json.loads(out)
    with sessions() as session:
        raters = session.execute(select(FeedbackEvent.tenant_id, FeedbackEvent.rater)).all()
        tainted = session.get(DatasetVersion, version.id)
        untouched = session.get(DatasetVersion, their_version.id)
        model = session.get(ModelVersion, model_id)
        request = session.scalars(select(ForgetRequest)).one()
        labels = session.execute(
            select(LabeledCompletion.completion, LabeledCompletion.is_desirable).where(
                LabeledCompletion.tenant_id == ours.tenant_id, LabeledCompletion.weight > 0
            )
        ).all()
    # the rater's events are gone in this tenant only
    assert (ours.tenant_id, "u-1") not in raters
    assert (theirs.tenant_id, "u-1") in raters
    assert (ours.tenant_id, "u-2") in raters
    # what was compiled from them is gone; u-2's judgements were recompiled into new items
    assert SECRET_FIX not in texts_stored(sessions)
    assert ("A: the fee is 1%", True) not in labels
    assert ("B: there is no fee", False) in labels
    assert ("C: cancel in settings", True) in labels
    assert report["deleted"]["feedback_events"] == 2
    assert report["deleted"]["recompiled_items"] >= 1
    # the version lost exactly the deleted members, kept the others, and is tainted
    after = member_items(sessions, version.id)
    assert after < before
    assert len(before - after) == sum(
        report["deleted"].get(table, 0)
        for table in ("sft_examples", "preference_pairs", "labeled_completions")
    )
    assert tainted is not None
    assert tainted.tainted_at is not None
    assert tainted.tainted_by_id == request.id
    assert model is not None
    assert model.tainted_by_id == request.id
    assert untouched is not None
    assert untouched.tainted_at is None
    assert report["tainted_dataset_versions"] == [str(version.id)]
    assert report["tainted_model_versions"] == [str(model_id)]
    # the audit names the subject only by its hash
    digest = hashlib.sha256(f"{ours.tenant_id}:rater:u-1".encode()).hexdigest()
    assert request.subject_sha256 == digest
    assert request.subject_kind == "rater"
    assert request.actor.startswith("cli:")
    assert "u-1" not in json.dumps([request.counts, request.actor])
    # a new version builds from what remains, untainted, with the recompiled label in it
    rebuilt = build(sessions, ours)
    assert rebuilt.version == version.version + 1
    assert rebuilt.tainted_at is None


def test_forgetting_a_source_record_deletes_its_items(
    on_test_database: sessionmaker[Session],
    setup: tuple[Feedback, Feedback],
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    ours, _ = setup
    version = build(sessions, ours)
    code, out, _ = run_cli(capsys, "dataset", "lineage", str(version.id))
    assert code == 0
    lineage = [json.loads(line) for line in out.splitlines()]
    assert {(row["source_kind"], row["source_ref"]) for row in lineage if row["kind"] == "sft"} >= {
        ("ticket", "zendesk:4711")
    }
    assert all(
        row["source_ref"].startswith("feedback:") for row in lineage if row["kind"] == "pair"
    )

    code, out, _ = run_cli(
        capsys, "forget", "--source-record", "zendesk:4711", "--tenant", "acme", "--json"
    )

    assert code == 0
    assert json.loads(out)["deleted"]["sft_examples"] == 1
    with sessions() as session:
        assert "Refunded today." not in session.scalars(select(SftExample.completion)).all()
        assert session.get(DatasetVersion, version.id).tainted_at is not None  # type: ignore[union-attr]
    assert SECRET_FIX in texts_stored(sessions)  # nobody else's data went
    code, out, err = run_cli(capsys, "dataset", "export", str(version.id), "--out", "x")
    assert code != 0
    assert "tainted" in err


def test_forgetting_deletes_the_tenants_kept_eval_indexes_only(
    on_test_database: sessionmaker[Session],
    setup: tuple[Feedback, Feedback],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A kept eval index holds hashes of its eval items' text (flywheel.datasets.kept_index):
    forgetting anything of a tenant deletes that tenant's, and no other tenant's."""
    sessions = on_test_database
    ours, theirs = setup
    for feedback in (ours, theirs):
        with unit_of_work(sessions) as session:
            domain = session.get_one(Domain, feedback.domain_id)
            domain.config = {"dataset": {"min_eval_items": 100}}  # every group fills eval
            build_dataset_version(
                session=session,
                tenant_id=feedback.tenant_id,
                domain_id=feedback.domain_id,
                recipe=DatasetRecipe(),
            )

    def kept() -> set[uuid.UUID]:
        with sessions() as session:
            return set(session.scalars(select(EvalIndexPart.domain_id)))

    assert kept() == {ours.domain_id, theirs.domain_id}

    code, _, _ = run_cli(capsys, "forget", "--source-record", "zendesk:4711", "--tenant", "acme")

    assert code == 0
    assert kept() == {theirs.domain_id}


@pytest.mark.parametrize(
    "args",
    [
        ("forget",),
        ("forget", "--rater", "u-1", "--source-record", "zendesk:4711"),
        ("forget", "--rater", " "),
    ],
)
def test_forget_needs_exactly_one_subject(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    with on_test_database() as session:
        assert session.scalars(select(ForgetRequest)).all() == []
