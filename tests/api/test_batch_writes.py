"""The batch write path: one COPY for a fresh batch, the conflict-aware path when a
constraint refuses a row. Either way the results are those of deciding event by event."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.schemas import FeedbackBatchCreated
from flywheel.db import unit_of_work
from flywheel.feedback import service
from flywheel.models import FeedbackEvent
from tests.conftest import Caller, count_rows, rating_event

BATCH = "/v1/feedback/batch"


def rating(index: int, stars: int = 3) -> dict[str, Any]:
    return {
        "domain": "billing",
        "kind": "rating",
        "prompt": f"question {index}",
        "response": f"answer {index}",
        "value": {"stars": stars},
        "event_id": f"evt-{index}",
    }


def stored_events(sessions: sessionmaker[Session]) -> dict[str, str | None]:
    """Stored rows: id -> event_id."""
    with sessions() as session:
        rows = session.execute(select(FeedbackEvent.id, FeedbackEvent.event_id))
        return {str(row_id): event_id for row_id, event_id in rows}


def test_the_same_event_twice_in_a_batch_is_stored_once(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    events = [rating(0), rating(1), rating(0)]

    response = client.post(BATCH, json={"events": events}, headers=acme.headers)

    assert response.status_code == 201, response.text
    ids = [item["id"] for item in response.json()["results"]]
    assert ids[0] == ids[2] != ids[1]
    assert stored_events(sessions) == {ids[0]: "evt-0", ids[1]: "evt-1"}


def test_one_event_id_for_two_events_in_a_batch_is_409_and_writes_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    events = [rating(0), rating(1), rating(0, stars=5)]
    headers = {**acme.headers, "Idempotency-Key": "clash"}

    response = client.post(BATCH, json={"events": events}, headers=headers)

    assert response.status_code == 409, response.text
    assert "evt-0" in response.json()["error"]["message"]
    assert count_rows(sessions, "feedback_events") == 0
    assert count_rows(sessions, "feedback_batches") == 0  # the key is free again


def test_a_batch_with_some_events_stored_stores_the_rest(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    """An event stored earlier (the same event_id and event) is replayed, the others are
    written, in the batch's order; the batch's key is claimed and replays the response."""
    earlier = client.post("/v1/feedback", json=rating(1), headers=acme.headers).json()
    headers = {**acme.headers, "Idempotency-Key": "partly-stored"}
    body = {"events": [rating(0), rating(1), rating(2)]}

    first = client.post(BATCH, json=body, headers=headers)
    replay = client.post(BATCH, json=body, headers=headers)

    assert (first.status_code, replay.status_code) == (201, 201), first.text
    ids = [item["id"] for item in first.json()["results"]]
    assert ids[1] == earlier["id"]
    assert stored_events(sessions) == dict(zip(ids, ["evt-0", "evt-1", "evt-2"], strict=True))
    assert "Idempotent-Replayed" not in first.headers  # two of its events are new
    assert replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert count_rows(sessions, "feedback_batches") == 1


def test_a_batch_refused_for_a_conflict_can_be_sent_again_fixed(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    """The refused batch wrote nothing and left its key unclaimed: the fixed batch under the
    same key is stored, and replays from then on."""
    client.post("/v1/feedback", json=rating(1), headers=acme.headers).raise_for_status()
    headers = {**acme.headers, "Idempotency-Key": "retry"}
    clashing = {"events": [rating(0), rating(1, stars=5)]}
    fixed = {"events": [rating(0), rating(3, stars=5)]}

    refused = client.post(BATCH, json=clashing, headers=headers)
    stored = client.post(BATCH, json=fixed, headers=headers)
    replay = client.post(BATCH, json=fixed, headers=headers)

    assert (refused.status_code, stored.status_code, replay.status_code) == (409, 201, 201)
    assert count_rows(sessions, "feedback_events") == 3
    assert replay.json() == stored.json()


def test_the_201_body_is_what_pydantic_writes(client: TestClient, acme: Caller) -> None:
    interaction = client.post(
        "/v1/interactions",
        json={"domain": "billing", "prompt": "p", "response": "r"},
        headers=acme.headers,
    ).json()
    events = [
        rating(0),
        {"interaction_id": interaction["id"], "kind": "outcome", "value": {"success": True}},
    ]
    headers = {**acme.headers, "Idempotency-Key": "bytes"}

    first = client.post(BATCH, json={"events": events}, headers=headers)
    replay = client.post(BATCH, json={"events": events}, headers=headers)  # times from the DB

    for response in (first, replay):
        assert response.status_code == 201, response.text
        written = FeedbackBatchCreated.model_validate_json(response.content).model_dump_json()
        assert response.content == written.encode()
    assert first.json()["results"][1]["interaction_id"] == interaction["id"]


def test_batch_fingerprints_are_those_of_the_events_and_of_the_whole_request() -> None:
    """Stored rows hold these: one pass must hash exactly what `request_fingerprint` does."""
    events = [rating_event(stars) for stars in (1, 2, 3)]
    with_tools = service.NewFeedback(
        kind="rating", value={"stars": 1}, domain="billing", tools=[{"type": "function"}]
    )
    events.append(with_tools)

    each, whole = service.request_fingerprints(events)

    assert each == [service.request_fingerprint(event) for event in events]
    assert whole == service.request_fingerprint(events)


@pytest.mark.postgres_only
@pytest.mark.commits("writers race from threads, each in its own transaction")
def test_concurrent_batches_sharing_events_store_each_once(
    acme: Caller, sessions: sessionmaker[Session]
) -> None:
    """Batches racing with overlapping event ids (no key): the later COPY waits for the
    earlier transaction, is refused, and replays the shared events with the stored ids."""
    writers = 4
    barrier = threading.Barrier(writers)
    results: dict[int, list[uuid.UUID]] = {}
    errors: list[BaseException] = []
    shared = [
        service.NewFeedback(**{**rating_event(stars).__dict__, "event_id": f"shared-{stars}"})
        for stars in (1, 2, 3)
    ]

    def write(writer: int) -> None:
        own = service.NewFeedback(**{**rating_event(4).__dict__, "event_id": f"own-{writer}"})
        try:
            with unit_of_work(sessions) as session:
                barrier.wait()
                recorded = service.record_feedback_batch(
                    session=session,
                    tenant_id=acme.tenant_id,
                    events=[*shared, own],
                    idempotency_key=None,
                )
            results[writer] = [item.id for item in recorded]
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len({tuple(ids[:3]) for ids in results.values()}) == 1
    assert len({ids[3] for ids in results.values()}) == writers
    assert count_rows(sessions, "feedback_events") == 3 + writers
