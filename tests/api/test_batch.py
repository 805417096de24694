"""Batches: all events validated before any is written; bulk insert; per-event results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import FeedbackEvent
from tests.conftest import Caller, count_rows


def rating(index: int) -> dict[str, Any]:
    return {
        "domain": "billing",
        "kind": "rating",
        "prompt": f"question {index}",
        "response": f"answer {index}",
        "value": {"stars": 1 + index % 5},
        "event_id": f"evt-{index}",
    }


def test_batch_writes_every_event_in_order(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    interaction = client.post(
        "/v1/interactions",
        json={"domain": "billing", "prompt": "p", "response": "r"},
        headers=acme.headers,
    ).json()
    events = [
        rating(0),
        {"interaction_id": interaction["id"], "kind": "correction", "value": {"text": "better"}},
        rating(2),
    ]

    response = client.post("/v1/feedback/batch", json={"events": events}, headers=acme.headers)

    assert response.status_code == 201, response.text
    results = response.json()["results"]
    assert [item["kind"] for item in results] == ["rating", "correction", "rating"]
    assert results[1]["interaction_id"] == interaction["id"]
    with sessions() as session:
        rows = {str(row.id): row for row in session.scalars(select(FeedbackEvent))}
    assert set(rows) == {item["id"] for item in results}
    assert rows[results[0]["id"]].event_id == "evt-0"
    assert rows[results[1]["id"]].value == {"text": "better"}


def test_full_batch_of_1000_is_accepted(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = client.post(
        "/v1/feedback/batch",
        json={"events": [rating(i) for i in range(1000)]},
        headers=acme.headers,
    )

    assert response.status_code == 201, response.text[:500]
    assert len(response.json()["results"]) == 1000
    assert count_rows(sessions, "feedback_events") == 1000


def test_batch_of_1001_is_422_and_writes_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = client.post(
        "/v1/feedback/batch",
        json={"events": [rating(i) for i in range(1001)]},
        headers=acme.headers,
    )

    assert response.status_code == 422
    assert "1000" in response.json()["error"]["message"]
    assert count_rows(sessions, "feedback_events") == 0


def test_one_invalid_event_rejects_the_whole_batch(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    events = [rating(i) for i in range(10)]
    events[7]["value"] = {"stars": 9}

    response = client.post("/v1/feedback/batch", json={"events": events}, headers=acme.headers)

    assert response.status_code == 422
    details = response.json()["error"]["details"]
    assert [detail["index"] for detail in details] == [7]
    assert count_rows(sessions, "feedback_events") == 0


def test_one_event_with_an_unknown_target_rejects_the_whole_batch(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    events = [rating(i) for i in range(5)]
    events[3]["domain"] = "no-such-domain"

    response = client.post("/v1/feedback/batch", json={"events": events}, headers=acme.headers)

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["details"] == [
        {"index": 3, "code": "not_found", "message": "domain 'no-such-domain' not found"}
    ]
    assert "nothing was written" in error["message"]
    assert count_rows(sessions, "feedback_events") == 0


def test_empty_batch_is_422(client: TestClient, acme: Caller) -> None:
    response = client.post("/v1/feedback/batch", json={"events": []}, headers=acme.headers)
    assert response.status_code == 422


def test_batch_replay_with_the_same_key(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    body = {"events": [rating(i) for i in range(3)]}
    headers = {**acme.headers, "Idempotency-Key": "batch-1"}

    first = client.post("/v1/feedback/batch", json=body, headers=headers)
    replay = client.post("/v1/feedback/batch", json=body, headers=headers)
    changed = client.post(
        "/v1/feedback/batch", json={"events": [rating(5), *body["events"][1:]]}, headers=headers
    )

    assert (first.status_code, replay.status_code, changed.status_code) == (201, 201, 409)
    assert replay.json() == first.json()
    assert count_rows(sessions, "feedback_events") == 3


def test_batch_with_a_conflicting_event_id_writes_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    assert client.post("/v1/feedback", json=rating(1), headers=acme.headers).status_code == 201
    clash = {**rating(1), "value": {"thumbs": "down"}}

    response = client.post(
        "/v1/feedback/batch", json={"events": [rating(0), clash]}, headers=acme.headers
    )

    assert response.status_code == 409
    assert count_rows(sessions, "feedback_events") == 1


# The batch's Idempotency-Key fingerprints the whole batch, not each event.

BATCH_CHANGES: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "appended": lambda events: [*events, rating(3)],
    "removed": lambda events: events[:-1],
    "edited": lambda events: [events[0], {**events[1], "value": {"thumbs": "down"}}, events[2]],
    "reordered": lambda events: [events[1], events[0], events[2]],
}


def stored_ids(sessions: sessionmaker[Session]) -> set[str]:
    with sessions() as session:
        return {str(event_id) for event_id in session.scalars(select(FeedbackEvent.id))}


@pytest.mark.parametrize("change", list(BATCH_CHANGES))
def test_a_changed_batch_under_the_same_key_is_409_and_writes_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], change: str
) -> None:
    events = [rating(i) for i in range(3)]
    headers = {**acme.headers, "Idempotency-Key": "batch-1"}
    first = client.post("/v1/feedback/batch", json={"events": events}, headers=headers)
    assert first.status_code == 201, first.text

    changed = client.post(
        "/v1/feedback/batch", json={"events": BATCH_CHANGES[change](events)}, headers=headers
    )

    assert changed.status_code == 409, changed.text
    assert changed.json()["error"]["code"] == "conflict"
    assert "Idempotency-Key" in changed.json()["error"]["message"]
    assert stored_ids(sessions) == {item["id"] for item in first.json()["results"]}
    assert count_rows(sessions, "feedback_batches") == 1


def test_an_exact_batch_replay_returns_the_first_response(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    events = [rating(i) for i in range(3)]
    headers = {**acme.headers, "Idempotency-Key": "batch-1"}
    first = client.post("/v1/feedback/batch", json={"events": events}, headers=headers)
    # the same request, spelled differently: canonical JSON ignores key order
    respelled = [dict(reversed(list(event.items()))) for event in events]

    replay = client.post("/v1/feedback/batch", json={"events": respelled}, headers=headers)

    assert (first.status_code, replay.status_code) == (201, 201)
    assert replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert stored_ids(sessions) == {item["id"] for item in first.json()["results"]}
    assert count_rows(sessions, "feedback_batches") == 1


def test_batch_keys_are_scoped_per_tenant(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    key = {"Idempotency-Key": "batch-1"}
    ours = client.post(
        "/v1/feedback/batch", json={"events": [rating(0)]}, headers={**acme.headers, **key}
    )
    theirs = client.post(
        "/v1/feedback/batch",
        json={"events": [rating(0), rating(1)]},
        headers={**globex.headers, **key},
    )

    assert (ours.status_code, theirs.status_code) == (201, 201)
    assert count_rows(sessions, "feedback_events") == 3
    assert count_rows(sessions, "feedback_batches") == 2
