"""`insert_new_rows`: the rows and the result `insert_ignoring_conflicts` gives, by one COPY
when nothing conflicts; the values go in exactly as given."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.bulk import insert_new_rows
from flywheel.db import unit_of_work
from flywheel.feedback.service import FEEDBACK_EVENTS
from flywheel.models import Domain, FeedbackEvent
from tests.conftest import Caller, count_rows

AWKWARD = 'tab\there, newline\nthere, \r, back\\slash \\N, "quotes", \\u00e9, é, 日本, 🎉'


def event_row(caller: Caller, domain_id: uuid.UUID, event_id: str, **values: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "created_at": datetime.now(UTC),
        "tenant_id": caller.tenant_id,
        "domain_id": domain_id,
        "interaction_id": None,
        "kind": "correction",
        "value": {"text": AWKWARD},
        "messages": [{"role": "user", "content": AWKWARD}],
        "tools": None,
        "response": AWKWARD,
        "rater": None,
        "event_id": event_id,
        "idempotency_key": None,
        "request_sha256": "0" * 64,
        **values,
    }


def domain_id_of(session: Session, caller: Caller) -> uuid.UUID:
    query = select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
    return session.scalars(query).one()


def test_new_rows_are_stored_exactly(acme: Caller, sessions: sessionmaker[Session]) -> None:
    with unit_of_work(sessions) as session:
        domain_id = domain_id_of(session, acme)
        rows = [
            event_row(acme, domain_id, "plain"),
            event_row(acme, domain_id, "big", value={"n": 2**70, "nested": [{"k": AWKWARD}]}),
            event_row(acme, domain_id, "none", messages=None, response=None),
        ]
        inserted = insert_new_rows(session, FEEDBACK_EVENTS, rows)

    assert inserted == {row["id"] for row in rows}
    with sessions() as session:
        stored = {event.id: event for event in session.scalars(select(FeedbackEvent))}
    for row in rows:
        event = stored[row["id"]]
        assert (event.value, event.messages, event.response) == (
            row["value"],
            row["messages"],
            row["response"],
        )
        assert event.created_at == row["created_at"]


def test_a_conflicting_row_is_skipped_and_the_others_stored(
    acme: Caller, sessions: sessionmaker[Session]
) -> None:
    with unit_of_work(sessions) as session:
        domain_id = domain_id_of(session, acme)
        first = event_row(acme, domain_id, "taken")
        insert_new_rows(session, FEEDBACK_EVENTS, [first])
    with unit_of_work(sessions) as session:
        rows = [event_row(acme, domain_id, name) for name in ("a", "taken", "b", "a")]
        inserted = insert_new_rows(session, FEEDBACK_EVENTS, rows)
        # the refused COPY was rolled back to its savepoint: the transaction goes on
        stored_b = select(FeedbackEvent.id).where(FeedbackEvent.event_id == "b")
        assert session.scalars(stored_b).one() == rows[2]["id"]

    assert inserted == {rows[0]["id"], rows[2]["id"]}
    assert count_rows(sessions, "feedback_events") == 3
