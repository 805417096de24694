"""Interactions: stored as sent, read back with their feedback, only by their own tenant."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import Interaction
from tests.conftest import Caller

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
