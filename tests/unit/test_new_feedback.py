"""`new_feedback` builds the stored event without dumping models it does not need; what it
builds (and so every stored fingerprint) must stay what dumping the models gave."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import TypeAdapter

from flywheel.feedback.service import NewFeedback, new_feedback, request_fingerprint
from flywheel.feedback.values import FeedbackCreate, Message, as_json

EVENTS: list[dict[str, Any]] = [
    {
        "domain": "billing",
        "kind": "rating",
        "prompt": "Why?",
        "response": "Because.",
        "value": {"stars": 4},
    },
    {
        "domain": "billing",
        "kind": "correction",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "response": "Hello there",
        "value": {"text": "Hi!"},
        "rater": "u-1",
        "event_id": "e-1",
    },
    {
        "domain": "billing",
        "kind": "comparison",
        "value": {
            "messages": [{"role": "user", "content": "Q"}],
            "responses": ["A", "B"],
            "tie": True,
        },
    },
    {"interaction_id": str(uuid.UUID(int=7)), "kind": "outcome", "value": {"success": False}},
    {"interaction_id": str(uuid.UUID(int=8)), "kind": "rating", "value": {"thumbs": "up"}},
]


def dumped_models(body: Any) -> NewFeedback:
    """The event as it was built before: every part a dumped model."""
    messages = body.messages
    if body.prompt is not None:
        messages = [Message(role="user", content=body.prompt)]
    return NewFeedback(
        kind=body.kind,
        value=as_json(body.value),
        interaction_id=body.interaction_id,
        domain=body.domain,
        messages=as_json(messages) if messages is not None else None,
        response=body.response,
        rater=body.rater,
        event_id=body.event_id,
    )


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: event["kind"])
def test_new_feedback_is_what_dumping_the_models_gave(event: dict[str, Any]) -> None:
    body = TypeAdapter(FeedbackCreate).validate_python(event)
    built = new_feedback(body)
    assert built == dumped_models(body)
    assert request_fingerprint(built) == request_fingerprint(dumped_models(body))
