"""Idempotency-Key and event_id: a replay returns the first response and writes one row."""

from __future__ import annotations

import threading
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.errors import Conflict
from flywheel.feedback import service
from tests.conftest import RATING, Caller, count_rows, rating_event

INTERACTION = {"domain": "billing", "prompt": "p", "response": "r"}
WRITE_ENDPOINTS = pytest.mark.parametrize(
    ("path", "payload", "table"),
    [
        ("/v1/feedback", RATING, "feedback_events"),
        ("/v1/interactions", INTERACTION, "interactions"),
    ],
)


@WRITE_ENDPOINTS
def test_same_key_same_body_replays_the_first_response(
    client: TestClient,
    acme: Caller,
    sessions: sessionmaker[Session],
    path: str,
    payload: dict[str, object],
    table: str,
) -> None:
    headers = {**acme.headers, "Idempotency-Key": "req-1"}
    first = client.post(path, json=payload, headers=headers)
    second = client.post(path, json=payload, headers=headers)

    assert (first.status_code, second.status_code) == (201, 201)
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert count_rows(sessions, table) == 1


@WRITE_ENDPOINTS
def test_same_key_different_body_is_409(
    client: TestClient,
    acme: Caller,
    sessions: sessionmaker[Session],
    path: str,
    payload: dict[str, object],
    table: str,
) -> None:
    headers = {**acme.headers, "Idempotency-Key": "req-1"}
    assert client.post(path, json=payload, headers=headers).status_code == 201

    changed = client.post(path, json={**payload, "response": "different"}, headers=headers)

    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "conflict"
    assert "Idempotency-Key" in changed.json()["error"]["message"]
    assert count_rows(sessions, table) == 1


def test_keys_are_scoped_per_tenant(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    first = client.post(
        "/v1/feedback", json=RATING, headers={**acme.headers, "Idempotency-Key": "k"}
    )
    other = client.post(
        "/v1/feedback", json=RATING, headers={**globex.headers, "Idempotency-Key": "k"}
    )

    assert (first.status_code, other.status_code) == (201, 201)
    assert first.json()["id"] != other.json()["id"]
    assert count_rows(sessions, "feedback_events") == 2


def test_event_id_is_unique_per_tenant(
    client: TestClient, acme: Caller, globex: Caller, sessions: sessionmaker[Session]
) -> None:
    event = {**RATING, "event_id": "evt-9"}
    first = client.post("/v1/feedback", json=event, headers=acme.headers)
    replay = client.post("/v1/feedback", json=event, headers=acme.headers)
    changed = client.post(
        "/v1/feedback", json={**event, "value": {"stars": 1}}, headers=acme.headers
    )
    elsewhere = client.post("/v1/feedback", json=event, headers=globex.headers)

    assert (first.status_code, replay.status_code, changed.status_code) == (201, 201, 409)
    assert replay.json()["id"] == first.json()["id"]
    assert "event_id" in changed.json()["error"]["message"]
    assert elsewhere.status_code == 201
    assert count_rows(sessions, "feedback_events") == 2


@pytest.mark.parametrize("key", ["", "has space", "a#b", "x" * 201, "ünï"])
def test_malformed_idempotency_key_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], key: str
) -> None:
    response = client.post(
        "/v1/feedback",
        json=RATING,
        headers={**acme.headers, "Idempotency-Key": key.encode()},  # type: ignore[dict-item]
    )
    assert response.status_code == 422, response.text
    assert count_rows(sessions, "feedback_events") == 0


def test_two_idempotency_keys_are_422_and_write_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    headers = [*acme.headers.items(), ("Idempotency-Key", "k-1"), ("Idempotency-Key", "k-2")]
    response = client.post("/v1/feedback", json=RATING, headers=headers)
    assert response.status_code == 422, response.text
    assert "one Idempotency-Key" in response.json()["error"]["message"]
    assert count_rows(sessions, "feedback_events") == 0


def test_the_document_declares_the_idempotency_key_of_every_write(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/interactions", "/v1/feedback", "/v1/feedback/batch"):
        headers = [item for item in paths[path]["post"]["parameters"] if item["in"] == "header"]
        assert [item["name"] for item in headers] == ["Idempotency-Key"], path
        assert headers[0]["schema"]["pattern"] == "^[A-Za-z0-9_.:-]{1,200}$"


@pytest.mark.postgres_only
@pytest.mark.commits("writers race from threads, each in its own transaction")
def test_concurrent_duplicates_write_one_row(acme: Caller, sessions: sessionmaker[Session]) -> None:
    """Eight writers race with one key, each in its own transaction: one row, one id."""
    writers = 8
    barrier = threading.Barrier(writers)
    ids: list[uuid.UUID] = []
    errors: list[BaseException] = []
    new = rating_event(stars=5)

    def write() -> None:
        try:
            with unit_of_work(sessions) as session:
                barrier.wait()
                recorded = service.record_feedback(
                    connection=session.connection(),
                    tenant_id=acme.tenant_id,
                    new=new,
                    idempotency_key="race",
                )
            ids.append(recorded.id)
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len(ids) == writers
    assert len(set(ids)) == 1
    assert count_rows(sessions, "feedback_events") == 1


@pytest.mark.postgres_only
@pytest.mark.commits("writers race from threads, each in its own transaction")
def test_concurrent_different_bodies_one_wins_others_conflict(
    acme: Caller, sessions: sessionmaker[Session]
) -> None:
    writers = 6
    barrier = threading.Barrier(writers)
    outcomes: list[str] = []

    def write(stars: int) -> None:
        new = rating_event(stars)
        with unit_of_work(sessions) as session:
            barrier.wait()
            try:
                service.record_feedback(
                    connection=session.connection(),
                    tenant_id=acme.tenant_id,
                    new=new,
                    idempotency_key="race",
                )
                outcomes.append("written")
            except Conflict:
                outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(1 + index % 5,)) for index in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert count_rows(sessions, "feedback_events") == 1
    assert outcomes.count("written") >= 1
    assert len(outcomes) == writers


def forget_batch_fingerprints(sessions: sessionmaker[Session]) -> None:
    """What a batch stored before batches were fingerprinted looks like: its events under
    `<key>#<index>`, no `feedback_batches` row."""
    with unit_of_work(sessions) as session:
        session.execute(text("DELETE FROM feedback_batches"))


@pytest.mark.parametrize(
    ("change", "status"), [("appended", 409), ("removed", 409), ("edited", 409), ("none", 201)]
)
def test_a_batch_stored_before_fingerprints_is_still_checked(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], change: str, status: int
) -> None:
    events = [{**RATING, "value": {"stars": stars}} for stars in (1, 2, 3)]
    headers = {**acme.headers, "Idempotency-Key": "old-batch"}
    first = client.post("/v1/feedback/batch", json={"events": events}, headers=headers)
    assert first.status_code == 201, first.text
    forget_batch_fingerprints(sessions)
    sent = {
        "appended": [*events, {**RATING, "value": {"stars": 4}}],
        "removed": events[:2],
        "edited": [events[0], events[1], {**RATING, "value": {"stars": 5}}],
        "none": events,
    }[change]

    again = client.post("/v1/feedback/batch", json={"events": sent}, headers=headers)

    assert again.status_code == status, again.text
    assert count_rows(sessions, "feedback_events") == 3
    if status == 201:
        assert again.json() == first.json()
        assert count_rows(sessions, "feedback_batches") == 1  # fingerprinted from now on
    else:
        assert again.json()["error"]["code"] == "conflict"
        assert count_rows(sessions, "feedback_batches") == 0


@pytest.mark.postgres_only
@pytest.mark.commits("writers race from threads, each in its own transaction")
def test_concurrent_batches_under_one_key_one_wins_others_conflict(
    acme: Caller, sessions: sessionmaker[Session]
) -> None:
    """Writers race with prefixes of one batch (a truncated or an appended resend): the
    winner's events are stored, every other batch is a Conflict that writes nothing."""
    writers = 4
    barrier = threading.Barrier(writers)
    outcomes: dict[int, str] = {}
    events = [rating_event(stars) for stars in (1, 2, 3, 4)]

    def write(length: int) -> None:
        with unit_of_work(sessions) as session:
            barrier.wait()
            try:
                service.record_feedback_batch(
                    session=session,
                    tenant_id=acme.tenant_id,
                    events=events[:length],
                    idempotency_key="race",
                )
                outcomes[length] = "written"
            except Conflict:
                outcomes[length] = "conflict"

    threads = [threading.Thread(target=write, args=(length,)) for length in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    written = [length for length, outcome in outcomes.items() if outcome == "written"]
    assert len(outcomes) == writers
    assert len(written) == 1
    assert count_rows(sessions, "feedback_events") == written[0]
    assert count_rows(sessions, "feedback_batches") == 1
