"""Retention of raw feedback: events and interactions older than N weeks go once compiled;
the compiled signal stays with its provenance (and in the dataset versions holding it); and
forgetting a rater or a source record still removes everything derived from deleted events."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.membership import version_members
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work, utcnow
from flywheel.feedback import retention
from flywheel.feedback.forget import forget
from flywheel.feedback.models import PurgedFeedback, subject_sha256
from flywheel.feedback.retention import purge_raw_events
from flywheel.models import (
    Domain,
    FeedbackEvent,
    Interaction,
    LabeledCompletion,
    PreferencePair,
    SftExample,
)
from flywheel.settings import Settings
from tests.conftest import Caller
from tests.integration.test_compile import OTHER, Feedback

SECRET_FIX = "The card fee is 2% and never more, says the corrector."
THIRD = [{"role": "user", "content": "Where is my invoice?"}]
TICKET = [{"role": "user", "content": "My order is late"}]
WEEKS = 4


def old_interaction(
    feedback: Feedback, response: str, messages: list[dict[str, str]], **extra: Any
) -> uuid.UUID:
    row = Interaction(
        tenant_id=feedback.tenant_id,
        domain_id=feedback.domain_id,
        messages=messages,
        response=response,
        request_sha256="",
        created_at=utcnow() - timedelta(weeks=10),
        **extra,
    )
    with unit_of_work(feedback.sessions) as session:
        session.add(row)
    return row.id


def compiled(sessions: sessionmaker[Session]) -> set[tuple[str, uuid.UUID, str | None, float]]:
    """Every compiled item: (table, id, source_ref, weight)."""
    models: tuple[type[SftExample] | type[PreferencePair] | type[LabeledCompletion], ...]
    models = (SftExample, PreferencePair, LabeledCompletion)
    with sessions() as session:
        return {
            (model.__tablename__, item_id, source_ref, weight)
            for model in models
            for item_id, source_ref, weight in session.execute(
                select(model.id, model.source_ref, model.weight)
            )
        }


def texts(sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        return "\n".join(
            [
                *session.scalars(select(SftExample.completion)),
                *session.scalars(select(PreferencePair.chosen)),
                *session.scalars(select(PreferencePair.rejected)),
                *session.scalars(select(LabeledCompletion.completion)),
            ]
        )


@pytest.fixture
def history(sessions: sessionmaker[Session], acme: Caller, globex: Caller) -> Feedback:
    """acme, ten weeks ago: u-1 likes A and corrects B, u-2 dislikes B; an interaction from
    ticket zendesk:9's comment 1, liked by u-4; u-1 dislikes C2 of another prompt. Today:
    u-3 likes C, of that other prompt.
    globex (never compiled): an old interaction and event. acme is compiled."""
    ours, theirs = Feedback(sessions, acme), Feedback(sessions, globex)
    then = utcnow() - timedelta(weeks=10)
    a = old_interaction(ours, "A: the fee is 1%", [{"role": "user", "content": "Card fee?"}])
    b = old_interaction(ours, "B: there is no fee", [{"role": "user", "content": "Card fee?"}])
    ours.thumbs(a, up=True, rater="u-1", at=then)
    ours.event("correction", {"text": SECRET_FIX}, on=b, rater="u-1", at=then)
    ours.thumbs(b, up=False, rater="u-2", at=then)
    ticket = old_interaction(
        ours, "It ships tomorrow.", TICKET, metadata_={"source_ref": "zendesk:9:1"}
    )
    ours.thumbs(ticket, up=True, rater="u-4", at=then)
    ours.thumbs(
        old_interaction(ours, "C2: settings, then cancel", OTHER), up=False, rater="u-1", at=then
    )
    ours.thumbs(ours.interaction("C: cancel in settings", messages=OTHER), up=True, rater="u-3")
    theirs.thumbs(old_interaction(theirs, "D", THIRD), up=True, rater="u-9", at=then)
    ours.compile()
    return ours


def purge(sessions: sessionmaker[Session], weeks: int | None = WEEKS) -> dict[str, Any]:
    return purge_raw_events(sessions, weeks=weeks, now=utcnow()).as_json()


KNOWN_SUBJECTS = [
    *(("rater", f"u-{n}") for n in range(1, 10)),
    *(("source_record", record) for record in ("zendesk", "zendesk:9", "zendesk:9:1")),
]


def traces(
    sessions: sessionmaker[Session], tenant_id: uuid.UUID, known: Iterable[tuple[str, str]] = ()
) -> set[tuple[str, str]]:
    """The subjects retention kept traces of, named by hashing the known ones (the rows hold
    hashes only); every row must be one of them."""
    named = {
        (kind, subject_sha256(tenant_id, kind, subject)): (kind, subject)
        for kind, subject in [*KNOWN_SUBJECTS, *known]
    }
    with sessions() as session:
        query = select(PurgedFeedback.subject_kind, PurgedFeedback.subject_sha256)
        rows = {(kind, hashed) for kind, hashed in session.execute(query)}
    assert rows <= set(named), rows - set(named)
    return {named[row] for row in rows}


def raters(sessions: sessionmaker[Session]) -> set[str | None]:
    with sessions() as session:
        return set(session.scalars(select(FeedbackEvent.rater)))


def test_old_compiled_events_go_and_the_signal_stays_with_its_provenance(
    sessions: sessionmaker[Session], history: Feedback
) -> None:
    before = compiled(sessions)
    with unit_of_work(sessions) as session:
        version = build_dataset_version(
            session=session,
            tenant_id=history.tenant_id,
            domain_id=history.domain_id,
            recipe=DatasetRecipe(eval_fraction=0.0, replay_fraction=0.0),
        ).version
    with sessions() as session:
        members = len(version_members(session, version))

    report = purge(sessions)

    assert report == {
        "domains": 2,
        "deleted": {"feedback_events": 5, "interactions": 4},
        "failed": {},
    }
    assert raters(sessions) == {"u-3", "u-9"}  # today's, and the never-compiled tenant's
    with sessions() as session:
        kept = session.scalars(select(Interaction.response)).all()
        held = len(version_members(session, version))
    assert sorted(kept) == ["C: cancel in settings", "D"]
    assert compiled(sessions) == before  # same items, same provenance, same weights
    assert SECRET_FIX in texts(sessions)
    assert held == members
    assert traces(sessions, history.tenant_id) == {
        ("rater", "u-1"),
        ("rater", "u-2"),
        ("rater", "u-4"),
        ("source_record", "zendesk"),  # the records above it, so forget finds it by them
        ("source_record", "zendesk:9"),
        ("source_record", "zendesk:9:1"),
    }
    assert purge(sessions)["deleted"] == {}  # nothing more to do


def test_nothing_goes_without_a_retention_setting_or_before_its_weeks(
    sessions: sessionmaker[Session], history: Feedback
) -> None:
    assert purge(sessions, weeks=None) == {"domains": 0, "deleted": {}, "failed": {}}
    assert purge(sessions, weeks=11) == {"domains": 2, "deleted": {}, "failed": {}}
    assert raters(sessions) == {"u-1", "u-2", "u-3", "u-4", "u-9"}


def test_a_domains_own_retention_comes_first(
    sessions: sessionmaker[Session], history: Feedback
) -> None:
    with unit_of_work(sessions) as session:
        session.execute(
            update(Domain)
            .where(Domain.id == history.domain_id)
            .values(config={"retention": {"raw_event_weeks": 12}})
        )
    assert purge(sessions)["deleted"] == {}  # acme keeps 12 weeks; globex was never compiled
    with unit_of_work(sessions) as session:
        session.execute(
            update(Domain)
            .where(Domain.id == history.domain_id)
            .values(config={"retention": {"raw_event_weeks": 0}})
        )
    assert purge(sessions)["deleted"] == {}  # a bad value keeps everything


def test_forgetting_a_rater_reaches_the_signal_of_deleted_events(
    sessions: sessionmaker[Session], history: Feedback
) -> None:
    purge(sessions)
    assert SECRET_FIX in texts(sessions)

    report = forget(sessions, tenant_id=history.tenant_id, rater="u-1", actor="test")

    assert SECRET_FIX not in texts(sessions)
    assert "A: the fee is 1%" not in texts(sessions)
    assert "C: cancel in settings" in texts(sessions)  # other conversations stay
    assert "It ships tomorrow." in texts(sessions)
    counts = report.as_json()["deleted"]
    assert counts.get("feedback_events", 0) == 0  # they were already gone
    assert counts["preference_pairs"] >= 1
    subjects = {subject for _, subject in traces(sessions, history.tenant_id)}
    assert "u-1" not in subjects
    assert {"u-2", "u-4", "zendesk:9:1"} <= subjects


def test_forgetting_a_source_record_reaches_its_deleted_interactions_signal(
    sessions: sessionmaker[Session], history: Feedback
) -> None:
    purge(sessions)
    assert "It ships tomorrow." in texts(sessions)

    forget(sessions, tenant_id=history.tenant_id, source_record="zendesk:9", actor="test")

    assert "It ships tomorrow." not in texts(sessions)
    assert SECRET_FIX in texts(sessions)
    subjects = {subject for _, subject in traces(sessions, history.tenant_id)}
    assert "zendesk:9:1" not in subjects
    assert "u-4" in subjects  # the rater's trace stays until the rater is forgotten


def test_forgetting_a_rater_recompiles_the_conversations_remaining_events(
    sessions: sessionmaker[Session], history: Feedback
) -> None:
    purge(sessions)
    assert "C2: settings, then cancel" in texts(sessions)

    forget(sessions, tenant_id=history.tenant_id, rater="u-1", actor="test")

    assert "C2: settings, then cancel" not in texts(sessions)
    with sessions() as session:  # u-3's judgement of that conversation was recompiled
        liked = session.scalars(
            select(LabeledCompletion.completion).where(
                LabeledCompletion.weight > 0, LabeledCompletion.is_desirable.is_(True)
            )
        )
        assert "C: cancel in settings" in set(liked)


def test_the_setting_refuses_less_than_a_week() -> None:
    with pytest.raises(ValidationError, match="retention_raw_event_weeks"):
        Settings(retention_raw_event_weeks=0)


def test_a_long_source_record_is_kept_as_hashes_and_forget_still_finds_it(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """A source record as long as metadata allows, in a script whose text does not compress:
    kept whole it overflowed the trace column (and the btree's key limit), every day."""
    ours = Feedback(sessions, acme)
    record = "ticket:" + "".join(chr(0x4E00 + (n * 7919) % 20000) for n in range(1500))
    ticket = old_interaction(ours, "Refund sent.", TICKET, metadata_={"source_ref": record})
    ours.thumbs(ticket, up=True, rater="u-5", at=utcnow() - timedelta(weeks=10))
    ours.thumbs(ours.interaction("C", messages=OTHER), up=True, rater="u-3")  # compiled to now
    ours.compile()

    report = purge(sessions)
    assert report["deleted"] == {"feedback_events": 1, "interactions": 1}, report
    assert traces(
        sessions, acme.tenant_id, [("source_record", "ticket"), ("source_record", record)]
    ) == {
        ("rater", "u-5"),
        ("source_record", "ticket"),
        ("source_record", record),
    }
    assert "Refund sent." in texts(sessions)
    forget(sessions, tenant_id=acme.tenant_id, source_record="ticket", actor="test")
    assert "Refund sent." not in texts(sessions)


def test_a_domain_that_fails_to_purge_does_not_stop_the_others(
    sessions: sessionmaker[Session],
    history: Feedback,
    globex: Caller,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    purge_domain = retention.purge_domain

    def failing(session: Session, tenant_id: uuid.UUID, *args: Any, **kwargs: Any) -> Any:
        if tenant_id == history.tenant_id:  # acme's database work fails
            raise OperationalError("DELETE FROM feedback_events", {}, Exception("disk full"))
        return purge_domain(session, tenant_id, *args, **kwargs)

    monkeypatch.setattr(retention, "purge_domain", failing)
    theirs = Feedback(sessions, globex)  # globex, compiled up to now, has something to purge
    theirs.thumbs(theirs.interaction("E", messages=OTHER), up=True, rater="u-8")
    theirs.compile()

    report = purge(sessions)

    assert report["deleted"] == {"feedback_events": 1, "interactions": 1}  # globex's
    assert [str(history.domain_id)] == list(report["failed"])
    assert "disk full" in report["failed"][str(history.domain_id)]
    assert {"u-1", "u-2", "u-4"} <= raters(sessions)  # acme's stay
    assert "u-9" not in raters(sessions)
