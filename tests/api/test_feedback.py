"""Feedback of every kind, about a stored interaction or carrying its own conversation."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import FeedbackEvent
from tests.conftest import Caller, count_rows


@pytest.fixture
def interaction_id(client: TestClient, acme: Caller) -> str:
    payload = {"domain": "billing", "prompt": "refund?", "response": "done"}
    response = client.post("/v1/interactions", json=payload, headers=acme.headers)
    assert response.status_code == 201
    return str(response.json()["id"])


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("rating", {"thumbs": "up"}),
        ("rating", {"thumbs": "down"}),
        ("rating", {"stars": 1}),
        ("rating", {"stars": 5}),
        ("correction", {"text": "the corrected answer"}),
        ("outcome", {"success": False, "reason": "ticket reopened"}),
        ("outcome", {"success": True}),
        ("comparison", {"responses": ["A", "B", "C"], "preferred": 2}),
        ("comparison", {"responses": ["A", "B"], "tie": True}),
    ],
)
def test_feedback_on_an_interaction_is_stored(
    client: TestClient,
    acme: Caller,
    interaction_id: str,
    sessions: sessionmaker[Session],
    kind: str,
    value: dict[str, Any],
) -> None:
    payload = {"interaction_id": interaction_id, "kind": kind, "value": value, "rater": "u-7"}
    response = client.post("/v1/feedback", json=payload, headers=acme.headers)

    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["kind"], body["domain"], body["interaction_id"]) == (
        kind,
        "billing",
        interaction_id,
    )
    with sessions() as session:
        row = session.scalars(select(FeedbackEvent)).one()
    assert str(row.id) == body["id"]
    assert (row.kind, row.rater, str(row.interaction_id)) == (kind, "u-7", interaction_id)
    assert row.value == value
    assert row.tenant_id == acme.tenant_id


def test_comparison_with_its_own_conversation(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {
        "domain": "billing",
        "kind": "comparison",
        "value": {
            "messages": [{"role": "user", "content": "How do I get a refund?"}],
            "responses": ["Ask support.", "Open Settings > Billing > Refund."],
            "preferred": 1,
        },
    }
    response = client.post("/v1/feedback", json=payload, headers=acme.headers)

    assert response.status_code == 201, response.text
    assert response.json()["interaction_id"] is None
    with sessions() as session:
        row = session.scalars(select(FeedbackEvent)).one()
    assert row.value["preferred"] == 1
    assert row.interaction_id is None


def test_rating_with_its_own_prompt_and_response(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {
        "domain": "billing",
        "kind": "rating",
        "prompt": "Where is my invoice?",
        "response": "Under Billing.",
        "value": {"thumbs": "up"},
        "event_id": "evt-1",
    }
    response = client.post("/v1/feedback", json=payload, headers=acme.headers)

    assert response.status_code == 201, response.text
    with sessions() as session:
        row = session.scalars(select(FeedbackEvent)).one()
    assert row.messages == [{"role": "user", "content": "Where is my invoice?"}]
    assert (row.response, row.event_id) == ("Under Billing.", "evt-1")


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"kind": "rating", "value": {"stars": 0}}, "greater than or equal to 1"),
        ({"kind": "rating", "value": {"stars": 6}}, "less than or equal to 5"),
        ({"kind": "rating", "value": {"stars": 4.5}}, "valid integer"),
        ({"kind": "rating", "value": {"stars": "4"}}, "valid integer"),
        ({"kind": "rating", "value": {"thumbs": "sideways"}}, "'up' or 'down'"),
        ({"kind": "rating", "value": {"thumbs": "up", "stars": 3}}, "exactly one of"),
        ({"kind": "rating", "value": {}}, "exactly one of"),
        ({"kind": "comparison", "value": {"responses": ["A", "B"], "preferred": 2}}, "not among"),
        ({"kind": "comparison", "value": {"responses": ["A", "B"], "preferred": -1}}, "greater"),
        ({"kind": "comparison", "value": {"responses": ["A"], "preferred": 0}}, "at least 2"),
        ({"kind": "comparison", "value": {"responses": ["A", "B"]}}, "'tie': true"),
        (
            {"kind": "comparison", "value": {"responses": ["A", "B"], "preferred": 0, "tie": True}},
            "not both",
        ),
        ({"kind": "correction", "value": {"text": ""}}, "at least 1 character"),
        ({"kind": "outcome", "value": {"success": "yes"}}, "valid boolean"),
        ({"kind": "praise", "value": {}}, "does not match any of the expected tags"),
        ({"kind": "rating", "value": {"stars": 3}, "is_internal": True}, "Extra inputs"),
    ],
)
def test_invalid_feedback_is_422_and_writes_nothing(
    client: TestClient,
    acme: Caller,
    interaction_id: str,
    sessions: sessionmaker[Session],
    payload: dict[str, Any],
    fragment: str,
) -> None:
    response = client.post(
        "/v1/feedback", json={"interaction_id": interaction_id, **payload}, headers=acme.headers
    )

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert any(fragment in detail["message"] for detail in error["details"]), error
    assert count_rows(sessions, "feedback_events") == 0


@pytest.mark.parametrize(
    "payload",
    [
        {"kind": "rating", "value": {"thumbs": "up"}},  # neither interaction nor domain
        {"kind": "rating", "value": {"thumbs": "up"}, "domain": "billing"},  # no conversation
        {"kind": "rating", "value": {"thumbs": "up"}, "domain": "billing", "prompt": "p"},
        {
            "kind": "comparison",
            "value": {"responses": ["A", "B"], "tie": True},
            "domain": "billing",
        },
    ],
)
def test_feedback_without_a_target_is_422(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], payload: dict[str, Any]
) -> None:
    response = client.post("/v1/feedback", json=payload, headers=acme.headers)

    assert response.status_code == 422, response.text
    assert count_rows(sessions, "feedback_events") == 0


def test_feedback_on_an_unknown_interaction_is_404(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {
        "interaction_id": "00000000-0000-4000-8000-000000000000",
        "kind": "rating",
        "value": {"thumbs": "up"},
    }
    response = client.post("/v1/feedback", json=payload, headers=acme.headers)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert count_rows(sessions, "feedback_events") == 0
