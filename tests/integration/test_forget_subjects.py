"""`flywheel forget`, every option, through the CLI and the service, on both databases: a
ticket ingested from a real export (its comments, interactions and satisfaction events), a
rater who alone judged a conversation (nothing is left to recompile), wildcard characters in
an id, an id nobody has, `--actor`, `--tenant` and the text output.

Run on SQLite as well as PostgreSQL (`FLYWHEEL_TEST_DB=sqlite`): a forget that left a
conversation with no events made the SQLite compiler insert an empty batch of group keys
("Incorrect number of bindings"), while PostgreSQL took the empty array."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.feedback.forget import forget, subject_sha256
from flywheel.models import (
    FeedbackEvent,
    ForgetRequest,
    Interaction,
    LabeledCompletion,
    PreferencePair,
    SftExample,
)
from tests.conftest import Caller, run_cli
from tests.integration.test_compile import OTHER, Feedback

TICKETS = Path(__file__).parent.parent / "fixtures" / "tickets" / "zendesk_tickets.json"


def ingest_tickets(capsys: pytest.CaptureFixture[str], *, is_compiled: bool) -> None:
    code, _, err = run_cli(
        capsys, "ingest", "tickets", str(TICKETS), "--format", "zendesk", "--domain", "billing"
    )
    assert code == 0, err
    if is_compiled:
        code, _, err = run_cli(capsys, "compile")
        assert code == 0, err


def ticket_rows(sessions: sessionmaker[Session], ticket: str) -> dict[str, int]:
    """How many rows of each kind come from the ticket (its own items, its interactions and
    their events, what was compiled from those)."""
    prefix = f"{ticket}:"
    with sessions() as session:
        ref = Interaction.metadata_["source_ref"].as_string()
        interactions = list(
            session.scalars(
                select(Interaction.id).where(or_(ref == ticket, ref.startswith(prefix)))
            )
        )
        events = session.scalar(
            select(func.count())
            .select_from(FeedbackEvent)
            .where(FeedbackEvent.interaction_id.in_(interactions))
        )
        counts = {"interactions": len(interactions), "feedback_events": events or 0}
        for model in (SftExample, PreferencePair, LabeledCompletion):
            counts[model.__tablename__] = (
                session.scalar(
                    select(func.count())
                    .select_from(model)
                    .where(or_(model.source_ref == ticket, model.source_ref.startswith(prefix)))
                )
                or 0
            )
    return counts


@pytest.mark.parametrize("is_compiled", [False, True], ids=["raw", "compiled"])
def test_forgetting_an_ingested_ticket_through_the_cli(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    is_compiled: bool,
) -> None:
    """The README's own example, on a ticket the Zendesk reader ingested: its satisfaction
    rating is the only event on its conversation."""
    sessions = on_test_database
    ingest_tickets(capsys, is_compiled=is_compiled)
    before = ticket_rows(sessions, "zendesk:4711")
    others = ticket_rows(sessions, "zendesk:4712")
    assert before["interactions"] >= 1
    assert before["feedback_events"] >= 1
    assert before["sft_examples"] >= 1

    code, out, err = run_cli(
        capsys, "forget", "--source-record", "zendesk:4711", "--actor", "dpo@acme", "--json"
    )

    assert code == 0, err
    report = json.loads(out)
    assert report["subject_kind"] == "source_record"
    deleted = report["deleted"]
    assert deleted["interactions"] == before["interactions"]
    assert deleted["feedback_events"] == before["feedback_events"]
    assert deleted["sft_examples"] == before["sft_examples"]
    assert deleted.get("recompiled_items", 0) == 0  # nobody else judged that conversation
    assert set(ticket_rows(sessions, "zendesk:4711").values()) == {0}
    assert ticket_rows(sessions, "zendesk:4712") == others
    with sessions() as session:
        request = session.scalars(select(ForgetRequest)).one()
    assert request.actor == "dpo@acme"
    assert request.subject_sha256 == subject_sha256(acme.tenant_id, "source_record", "zendesk:4711")


@pytest.fixture
def sole_rater(on_test_database: sessionmaker[Session], acme: Caller) -> Feedback:
    """u-9 alone judged one conversation (a thumbs-down and a correction); u-2 judged
    another."""
    ours = Feedback(on_test_database, acme)
    alone = ours.interaction("There is no refund, ever.")
    ours.thumbs(alone, up=False, rater="u-9")
    ours.event("correction", {"text": "Refunds take five days."}, on=alone, rater="u-9")
    ours.thumbs(ours.interaction("C: cancel in settings", messages=OTHER), up=True, rater="u-2")
    ours.compile()
    return ours


def compiled_texts(sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        parts = [
            *session.scalars(select(SftExample.completion)),
            *session.scalars(select(PreferencePair.chosen)),
            *session.scalars(select(LabeledCompletion.completion)),
        ]
    return "\n".join(parts)


def test_forgetting_the_only_rater_of_a_conversation_through_the_cli(
    on_test_database: sessionmaker[Session],
    sole_rater: Feedback,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = on_test_database
    assert "Refunds take five days." in compiled_texts(sessions)

    code, out, err = run_cli(capsys, "forget", "--rater", "u-9", "--tenant", "acme")

    assert code == 0, err
    assert out.startswith("forgot (")
    assert "feedback_events 2" in out
    assert "tainted 0 dataset version(s), 0 model version(s)" in out
    texts = compiled_texts(sessions)
    assert "Refunds take five days." not in texts
    assert "There is no refund, ever." not in texts
    assert "C: cancel in settings" in texts
    with sessions() as session:
        raters = set(session.scalars(select(FeedbackEvent.rater)))
        request = session.scalars(select(ForgetRequest)).one()
    assert raters == {"u-2"}
    assert request.actor.startswith("cli:")
    assert request.subject_kind == "rater"


def as_row_counts(report: dict[str, Any]) -> dict[str, int]:
    return {key: value for key, value in report["deleted"].items() if value}


def table_rows(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model)) or 0
            for model in (Interaction, FeedbackEvent, SftExample, PreferencePair, LabeledCompletion)
        }


@pytest.mark.parametrize(
    ("subject", "is_forgotten"),
    [
        ({"rater": "u-9"}, True),
        ({"rater": "u-%"}, False),  # a LIKE wildcard is a character, not a pattern
        ({"rater": "U-9"}, False),
        ({"source_record": "zendesk:4711"}, True),
        ({"source_record": "zendesk:47_1"}, False),
        ({"source_record": "zendesk:471"}, False),  # a prefix without the colon is another id
    ],
)
def test_the_service_forgets_exactly_its_subject(
    on_test_database: sessionmaker[Session],
    sole_rater: Feedback,
    capsys: pytest.CaptureFixture[str],
    subject: dict[str, str],
    is_forgotten: bool,
) -> None:
    """The report counts exactly the rows that went, and they are the subject's."""
    sessions = on_test_database
    ingest_tickets(capsys, is_compiled=True)
    before = table_rows(sessions)
    other_ticket = ticket_rows(sessions, "zendesk:4712")

    report = forget(sessions, tenant_id=sole_rater.tenant_id, actor="service", **subject)

    after = table_rows(sessions)
    deleted = as_row_counts(report.as_json())
    assert deleted == {
        table: before[table] - after[table] for table in before if after[table] != before[table]
    }
    assert bool(deleted) == is_forgotten
    assert ticket_rows(sessions, "zendesk:4712") == other_ticket
    if subject.get("source_record") == "zendesk:4711":
        assert set(ticket_rows(sessions, "zendesk:4711").values()) == {0}
        assert deleted["interactions"] >= 1
        assert deleted["feedback_events"] >= 1
    if subject.get("rater") == "u-9":
        assert deleted == {"feedback_events": 2, "preference_pairs": 1, "sft_examples": 1}
        assert "Refunds take five days." not in compiled_texts(sessions)
    with sessions() as session:
        request = session.scalars(select(ForgetRequest)).one()
    assert request.actor == "service"
    assert request.counts == report.as_json()["deleted"]


def test_forget_names_the_tenant_when_there_are_several(
    on_test_database: sessionmaker[Session],
    sole_rater: Feedback,
    globex: Caller,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(capsys, "forget", "--rater", "u-9")
    assert code != 0
    assert out == ""
    assert err.strip().splitlines() == [err.strip()]
    assert "--tenant" in err

    code, out, err = run_cli(capsys, "forget", "--rater", "u-9", "--tenant", "globex", "--json")

    assert code == 0, err
    assert as_row_counts(json.loads(out)) == {}
    with on_test_database() as session:
        assert session.scalars(
            select(FeedbackEvent.rater).where(FeedbackEvent.rater == "u-9")
        ).all()


def test_forget_refuses_an_unknown_tenant_in_one_line(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "forget", "--rater", "u-9", "--tenant", "nobody")
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    with on_test_database() as session:
        assert session.scalars(select(ForgetRequest)).all() == []
