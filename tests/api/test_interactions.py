"""Interactions: stored as sent, read back with their feedback in pages, only by their tenant."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.feedback import pages, service
from flywheel.feedback.service import NewFeedback
from flywheel.models import FeedbackEvent, Interaction
from tests.conftest import Caller, make_caller

INTERACTION = {
    "domain": "billing",
    "messages": [{"role": "user", "content": "Why was I charged twice? ünïcødé ✓"}],
    "response": "I have refunded the duplicate charge.",
    "model": {"name": "acme.billing", "version": "3", "adapter": "models:/acme.billing@champion"},
    "session_id": "s-1",
    "metadata": {"app": "helpdesk", "latency_ms": 412, "tags": ["a", "b"]},
}


def test_post_interaction_stores_the_row(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = client.post("/v1/interactions", json=INTERACTION, headers=acme.headers)

    assert response.status_code == 201, response.text
    body = response.json()
    assert body["domain"] == "billing"
    assert body["created_at"].endswith("Z") or "+00:00" in body["created_at"]
    with sessions() as session:
        row = session.scalars(select(Interaction)).one()
    assert row.id == uuid.UUID(body["id"])
    assert row.tenant_id == acme.tenant_id
    assert row.messages == INTERACTION["messages"]
    assert row.response == INTERACTION["response"]
    assert (row.model_name, row.model_version) == ("acme.billing", "3")
    assert row.adapter == "models:/acme.billing@champion"
    assert row.metadata_ == INTERACTION["metadata"]


def test_prompt_becomes_a_user_message(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {"domain": "billing", "prompt": "hello", "response": "hi"}
    response = client.post("/v1/interactions", json=payload, headers=acme.headers)

    assert response.status_code == 201, response.text
    with sessions() as session:
        row = session.scalars(select(Interaction)).one()
    assert row.messages == [{"role": "user", "content": "hello"}]


def test_get_interaction_returns_it_with_its_feedback(client: TestClient, acme: Caller) -> None:
    created = client.post("/v1/interactions", json=INTERACTION, headers=acme.headers).json()
    rating = {
        "interaction_id": created["id"],
        "kind": "rating",
        "value": {"stars": 4},
        "rater": "u-42",
    }
    assert client.post("/v1/feedback", json=rating, headers=acme.headers).status_code == 201

    response = client.get(f"/v1/interactions/{created['id']}", headers=acme.headers)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == created["id"]
    assert body["messages"] == INTERACTION["messages"]
    assert body["model"] == INTERACTION["model"]
    assert body["metadata"] == INTERACTION["metadata"]
    assert [(item["kind"], item["value"], item["rater"]) for item in body["feedback"]] == [
        ("rating", {"stars": 4}, "u-42")
    ]
    assert body["next_cursor"] is None


def test_unknown_domain_is_404_and_writes_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {**INTERACTION, "domain": "nonexistent"}
    response = client.post("/v1/interactions", json=payload, headers=acme.headers)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    with sessions() as session:
        assert session.scalars(select(Interaction)).all() == []


def test_both_messages_and_prompt_is_422(client: TestClient, acme: Caller) -> None:
    payload = {**INTERACTION, "prompt": "also this"}
    response = client.post("/v1/interactions", json=payload, headers=acme.headers)

    assert response.status_code == 422
    assert "exactly one of 'messages' or 'prompt'" in response.json()["error"]["message"]


# Reading an interaction with many events: bounded pages, cursors, off the event loop.

MANY = 2_500  # three batches: 1,000 + 1,000 + 500 events, each batch sharing one created_at


def add_feedback(
    sessions: sessionmaker[Session], caller: Caller, interaction_id: str, count: int
) -> list[uuid.UUID]:
    """`count` ratings of the interaction, written in bulk batches of 1,000; their ids in
    reading order: by (created_at, id), as stored."""
    target = uuid.UUID(interaction_id)
    for start in range(0, count, 1_000):
        events = [
            NewFeedback(kind="rating", value={"stars": 1 + index % 5}, interaction_id=target)
            for index in range(start, min(count, start + 1_000))
        ]
        with unit_of_work(sessions) as session:
            service.record_feedback_batch(
                session=session, tenant_id=caller.tenant_id, events=events, idempotency_key=None
            )
    with sessions() as session:
        rows = session.execute(
            select(FeedbackEvent.created_at, FeedbackEvent.id).where(
                FeedbackEvent.interaction_id == target
            )
        ).all()
    return [event_id for _, event_id in sorted(rows)]


def create_interaction(client: TestClient, caller: Caller) -> str:
    response = client.post("/v1/interactions", json=INTERACTION, headers=caller.headers)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def ids(items: list[dict[str, Any]]) -> list[uuid.UUID]:
    return [uuid.UUID(item["id"]) for item in items]


def test_interaction_read_embeds_one_bounded_page_and_a_cursor(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction_id = create_interaction(client, acme)
    stored = add_feedback(sessions, acme, interaction_id, MANY)

    response = client.get(f"/v1/interactions/{interaction_id}", headers=acme.headers)

    assert response.status_code == 200, response.text[:500]
    body = response.json()
    assert len(body["feedback"]) == pages.FIRST_PAGE_EVENTS
    assert ids(body["feedback"]) == stored[: pages.FIRST_PAGE_EVENTS]
    assert isinstance(body["next_cursor"], str)
    assert body["messages"] == INTERACTION["messages"]


def test_following_cursors_returns_every_event_once_in_order(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction_id = create_interaction(client, acme)
    stored = add_feedback(sessions, acme, interaction_id, MANY)
    first = client.get(f"/v1/interactions/{interaction_id}", headers=acme.headers).json()
    seen, cursor, pages_read = ids(first["feedback"]), first["next_cursor"], 0

    while cursor is not None:
        response = client.get(
            f"/v1/interactions/{interaction_id}/feedback",
            params={"cursor": cursor, "limit": 333},
            headers=acme.headers,
        )
        assert response.status_code == 200, response.text[:500]
        page = response.json()
        assert 1 <= len(page["items"]) <= 333
        seen += ids(page["items"])
        cursor, pages_read = page["next_cursor"], pages_read + 1

    assert seen == stored  # every event, once, in (created_at, id) order across batches
    assert len(set(seen)) == MANY
    assert pages_read == -(-(MANY - pages.FIRST_PAGE_EVENTS) // 333)


def test_listing_without_a_cursor_starts_at_the_first_event(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction_id = create_interaction(client, acme)
    stored = add_feedback(sessions, acme, interaction_id, 250)

    default = client.get(f"/v1/interactions/{interaction_id}/feedback", headers=acme.headers)
    everything = client.get(
        f"/v1/interactions/{interaction_id}/feedback",
        params={"limit": pages.MAX_PAGE_EVENTS},
        headers=acme.headers,
    )

    assert ids(default.json()["items"]) == stored[:100]
    assert default.json()["next_cursor"] is not None
    assert ids(everything.json()["items"]) == stored
    assert everything.json()["next_cursor"] is None


def test_exactly_one_page_of_events_has_no_cursor(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction_id = create_interaction(client, acme)
    stored = add_feedback(sessions, acme, interaction_id, pages.FIRST_PAGE_EVENTS)

    body = client.get(f"/v1/interactions/{interaction_id}", headers=acme.headers).json()

    assert ids(body["feedback"]) == stored
    assert body["next_cursor"] is None


def cursor_of(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


# Fixed ids: a random uuid in a cursor would make its test id differ between xdist workers.
SOME_ID, OTHER_ID = "87d55f4f-0657-4979-84f9-93e843d1e17b", "b066d471-8775-4ad3-bc1a-c04fe685043b"
BAD_CURSORS = {
    "outside_the_alphabet": "not a cursor!",
    "too_long": "x" * 513,
    "not_base64_of_anything": "abc",
    "json_of_the_wrong_shape": cursor_of({"a": 1}),
    "interaction_not_a_uuid": cursor_of([1, "not-a-uuid", "2026-01-01T00:00:00+00:00", SOME_ID]),
    "time_not_a_time": cursor_of([1, SOME_ID, "yesterday", OTHER_ID]),
    "time_a_number": cursor_of([1, SOME_ID, 7, None]),
}


@pytest.mark.parametrize("cursor", list(BAD_CURSORS.values()), ids=list(BAD_CURSORS))
def test_a_bad_cursor_is_422_json(client: TestClient, acme: Caller, cursor: str) -> None:
    interaction_id = create_interaction(client, acme)

    response = client.get(
        f"/v1/interactions/{interaction_id}/feedback",
        params={"cursor": cursor},
        headers=acme.headers,
    )

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"
    assert "cursor" in response.json()["error"]["message"]


@pytest.mark.parametrize("limit", [0, -1, pages.MAX_PAGE_EVENTS + 1])
def test_a_limit_out_of_bounds_is_422(client: TestClient, acme: Caller, limit: int) -> None:
    interaction_id = create_interaction(client, acme)

    response = client.get(
        f"/v1/interactions/{interaction_id}/feedback",
        params={"limit": limit},
        headers=acme.headers,
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"


def test_a_cursor_is_bound_to_its_interaction(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    one, other = create_interaction(client, acme), create_interaction(client, acme)
    add_feedback(sessions, acme, one, pages.FIRST_PAGE_EVENTS + 1)
    cursor = client.get(f"/v1/interactions/{one}", headers=acme.headers).json()["next_cursor"]

    response = client.get(
        f"/v1/interactions/{other}/feedback", params={"cursor": cursor}, headers=acme.headers
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"


def test_another_tenants_interaction_and_cursor_are_useless(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    theirs = create_interaction(client, acme)
    add_feedback(sessions, acme, theirs, pages.FIRST_PAGE_EVENTS + 1)
    cursor = client.get(f"/v1/interactions/{theirs}", headers=acme.headers).json()["next_cursor"]
    ours = create_interaction(client, globex)
    feedback = f"/v1/interactions/{theirs}/feedback"

    read = client.get(f"/v1/interactions/{theirs}", headers=globex.headers)
    listed = client.get(feedback, headers=globex.headers)
    followed = client.get(feedback, params={"cursor": cursor}, headers=globex.headers)
    borrowed = client.get(
        f"/v1/interactions/{ours}/feedback", params={"cursor": cursor}, headers=globex.headers
    )

    assert (read.status_code, listed.status_code, followed.status_code) == (404, 404, 404)
    assert followed.json()["error"]["code"] == "not_found"
    assert borrowed.status_code == 422
    assert borrowed.json()["error"]["code"] == "invalid_input"


def test_listing_feedback_needs_the_read_scope(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction_id = create_interaction(client, acme)
    writer = make_caller(sessions, tenant="writer-only", scopes=("feedback:write",))

    response = client.get(f"/v1/interactions/{interaction_id}/feedback", headers=writer.headers)

    assert response.status_code == 403


class SlowEvent:
    """A stored event whose `value` can be read only once the test allows it: the read is
    held inside the serialisation of its page for as long as the test wants."""

    def __init__(self, building: threading.Event, released: threading.Event) -> None:
        self.id, self.kind, self.rater, self.event_id = uuid.uuid4(), "rating", None, None
        self.created_at = utcnow()
        self.building, self.released = building, released
        self.was_held_to_the_end = False

    @property
    def value(self) -> dict[str, Any]:
        self.building.set()
        # A page built on the event loop would hold the loop here, so /healthz could not answer
        # and release it: it gives up after a while rather than hang the suite.
        self.was_held_to_the_end = not self.released.wait(timeout=20)
        return {"stars": 5}


def test_a_page_is_built_off_the_event_loop(
    client: TestClient, acme: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an interaction read is held in the middle of serialising its page, /healthz on
    the same app (the same event loop) answers: the page is read and serialised in a worker
    thread. No timing is asserted: /healthz releases the read."""
    building, released = threading.Event(), threading.Event()
    event = SlowEvent(building, released)
    interaction = Interaction(
        id=uuid.uuid4(), messages=[], response="r", metadata_={}, created_at=utcnow()
    )

    def held_read(**_: object) -> tuple[Interaction, str, pages.EventPage]:
        return interaction, "billing", pages.EventPage(events=[event], next_cursor=None)  # type: ignore[list-item]

    monkeypatch.setattr(pages, "get_interaction", held_read)
    with ThreadPoolExecutor(max_workers=1) as pool:
        read = pool.submit(client.get, f"/v1/interactions/{interaction.id}", headers=acme.headers)
        assert building.wait(timeout=30), read.result()
        health = client.get("/healthz")
        released.set()
        response = read.result(timeout=60)

    assert health.status_code == 200
    assert not event.was_held_to_the_end, "the page was serialised on the event loop"
    assert response.status_code == 200, response.text
    assert response.json()["feedback"][0]["value"] == {"stars": 5}


def test_events_stored_while_paging_come_once_after_the_cursor(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction_id = create_interaction(client, acme)
    add_feedback(sessions, acme, interaction_id, 150)
    first = client.get(f"/v1/interactions/{interaction_id}", headers=acme.headers).json()
    stored = add_feedback(sessions, acme, interaction_id, 50)  # now 200, the new ones last

    rest = client.get(
        f"/v1/interactions/{interaction_id}/feedback",
        params={"cursor": first["next_cursor"], "limit": pages.MAX_PAGE_EVENTS},
        headers=acme.headers,
    ).json()

    assert ids(first["feedback"]) + ids(rest["items"]) == stored
    assert rest["next_cursor"] is None
