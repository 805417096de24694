"""OpenAI chat format as apps send it: tool calls, tool results, tools, names, text parts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import FeedbackEvent, Interaction
from tests.conftest import Caller

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_invoice",
            "description": "Find an invoice by its number.",
            "parameters": {
                "type": "object",
                "properties": {"number": {"type": "string"}},
                "required": ["number"],
            },
        },
    }
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are a billing agent."}]},
    {"role": "user", "content": "Why was invoice INV-7 charged twice?", "name": "ann"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_invoice", "arguments": '{"number": "INV-7"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"charges": 2, "amount": 40}'},
]
INTERACTION: dict[str, Any] = {
    "domain": "billing",
    "messages": MESSAGES,
    "tools": TOOLS,
    "response": "INV-7 was charged twice; I refunded one charge.",
}


def post(client: TestClient, caller: Caller, payload: dict[str, Any]) -> Any:
    return client.post("/v1/interactions", json=payload, headers=caller.headers)


def test_a_tool_calling_conversation_is_stored_and_read_back_as_sent(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    response = post(client, acme, INTERACTION)

    assert response.status_code == 201, response.text
    with sessions() as session:
        row = session.scalars(select(Interaction)).one()
    assert row.messages == MESSAGES
    assert row.tools == TOOLS
    read = client.get(f"/v1/interactions/{response.json()['id']}", headers=acme.headers)
    assert read.status_code == 200, read.text
    assert read.json()["messages"] == MESSAGES
    assert read.json()["tools"] == TOOLS


def test_an_interaction_without_tools_reads_back_null_tools(
    client: TestClient, acme: Caller
) -> None:
    payload = {"domain": "billing", "prompt": "hello", "response": "hi"}
    created = post(client, acme, payload)
    read = client.get(f"/v1/interactions/{created.json()['id']}", headers=acme.headers)

    assert read.json()["tools"] is None
    assert read.json()["messages"] == [{"role": "user", "content": "hello"}]


def with_message(index: int, **changes: Any) -> dict[str, Any]:
    payload = copy.deepcopy(INTERACTION)
    payload["messages"][index].update(changes)
    for key, value in changes.items():
        if value is ...:
            del payload["messages"][index][key]
    return payload


def with_arguments(arguments: Any) -> dict[str, Any]:
    payload = copy.deepcopy(INTERACTION)
    payload["messages"][2]["tool_calls"][0]["function"]["arguments"] = arguments
    return payload


BAD = {
    "arguments not JSON": (with_arguments("{number: INV-7"), "arguments"),
    "arguments a JSON list": (with_arguments("[1, 2]"), "JSON object"),
    "arguments an object, not a string": (with_arguments({"number": "x"}), "string"),
    "arguments with NUL": (with_arguments('{"n": "a\\u0000"}'), "NUL"),
    "tool message without tool_call_id": (with_message(3, tool_call_id=...), "tool_call_id"),
    "tool message answering no call": (with_message(3, tool_call_id="call_9"), "call_9"),
    "assistant with neither content nor calls": (
        with_message(2, tool_calls=...),
        "content or tool_calls",
    ),
    "tool_calls on a user message": (
        with_message(1, tool_calls=MESSAGES[2]["tool_calls"]),
        "tool_calls",
    ),
    "tool_call_id on an assistant message": (
        with_message(2, tool_call_id="call_1"),
        "tool_call_id",
    ),
    "user message without content": (with_message(1, content=None), "content"),
    "unknown field in a message": (with_message(1, function_call={}), "function_call"),
    "unknown content part": (
        with_message(0, content=[{"type": "image_url", "image_url": {"url": "x"}}]),
        "content",
    ),
    "lone surrogate in a name": (with_message(1, name="\ud800"), "name"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_malformed_tool_messages_are_422_json_and_store_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], case: str
) -> None:
    payload, needle = BAD[case]
    body = json.dumps(payload).encode()
    response = client.post(
        "/v1/interactions",
        content=body,
        headers={**acme.headers, "Content-Type": "application/json"},
    )

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"
    assert needle in json.dumps(response.json()["error"])
    with sessions() as session:
        assert session.scalars(select(Interaction)).first() is None


def test_tool_call_ids_are_unique_in_a_conversation(client: TestClient, acme: Caller) -> None:
    payload = copy.deepcopy(INTERACTION)
    call = payload["messages"][2]["tool_calls"][0]
    payload["messages"][2]["tool_calls"].append(copy.deepcopy(call))

    response = post(client, acme, payload)

    assert response.status_code == 422
    assert "call_1" in response.json()["error"]["message"] + json.dumps(
        response.json()["error"].get("details")
    )


BAD_TOOLS = {
    "not a function tool": [{"type": "retrieval"}],
    "unknown field": [{**TOOLS[0], "extra": 1}],
    "no name": [{"type": "function", "function": {"description": "x"}}],
    "too many": TOOLS * 129,
    "parameters not an object": [{"type": "function", "function": {"name": "f", "parameters": []}}],
}


@pytest.mark.parametrize("case", list(BAD_TOOLS), ids=list(BAD_TOOLS))
def test_malformed_tools_are_422(client: TestClient, acme: Caller, case: str) -> None:
    response = post(client, acme, {**INTERACTION, "tools": BAD_TOOLS[case]})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"


def test_tools_are_bounded_in_size(client: TestClient, acme: Caller) -> None:
    tool = copy.deepcopy(TOOLS[0])
    tool["function"]["description"] = "x" * 150_000
    response = post(client, acme, {**INTERACTION, "tools": [tool] * 2})

    assert response.status_code == 422
    assert "tools" in response.json()["error"]["message"]


def test_feedback_with_its_own_conversation_stores_its_tools(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    event = {
        "kind": "rating",
        "value": {"thumbs": "up"},
        "domain": "billing",
        "messages": MESSAGES,
        "tools": TOOLS,
        "response": "Refunded.",
    }
    response = client.post("/v1/feedback", json=event, headers=acme.headers)

    assert response.status_code == 201, response.text
    with sessions() as session:
        row = session.scalars(select(FeedbackEvent)).one()
    assert row.messages == MESSAGES
    assert row.tools == TOOLS


def test_feedback_on_an_interaction_takes_its_tools_from_it(
    client: TestClient, acme: Caller
) -> None:
    created = post(client, acme, INTERACTION)
    event = {
        "kind": "rating",
        "value": {"thumbs": "up"},
        "interaction_id": created.json()["id"],
        "tools": TOOLS,
    }
    response = client.post("/v1/feedback", json=event, headers=acme.headers)

    assert response.status_code == 422


def test_requests_without_tools_keep_the_fingerprints_stored_before_tools_existed() -> None:
    import dataclasses
    import hashlib

    import orjson

    from flywheel.feedback.service import NewFeedback, NewInteraction, request_fingerprint

    interaction = NewInteraction(
        domain="billing", messages=[{"role": "user", "content": "hi"}], response="yo"
    )
    event = NewFeedback(kind="rating", value={"thumbs": "up"}, domain="billing")

    def before(item: Any) -> str:  # the encoding stored rows were fingerprinted with
        fields = dataclasses.asdict(item)
        del fields["tools"]
        fields.pop("response_tool_calls", None)  # an interaction's, added later the same way
        return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()

    assert request_fingerprint(interaction) == before(interaction)
    assert request_fingerprint(event) == before(event)
    with_tools = dataclasses.replace(interaction, tools=TOOLS)
    assert request_fingerprint(with_tools) != request_fingerprint(interaction)


REFUND_CALLS: list[dict[str, Any]] = [
    {
        "id": "call_2",
        "type": "function",
        "function": {"name": "refund", "arguments": '{"invoice": "INV-7", "amount": 40}'},
    }
]


def test_a_response_that_called_tools_is_stored_and_read_back(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    payload = {k: v for k, v in INTERACTION.items() if k != "response"}
    created = post(client, acme, {**payload, "response_tool_calls": REFUND_CALLS})

    assert created.status_code == 201, created.text
    with sessions() as session:
        row = session.scalars(select(Interaction)).one()
    assert (row.response, row.response_tool_calls) == ("", REFUND_CALLS)
    read = client.get(f"/v1/interactions/{created.json()['id']}", headers=acme.headers).json()
    assert (read["response"], read["response_tool_calls"], read["tools"]) == (
        "",
        REFUND_CALLS,
        TOOLS,
    )
    text_only = post(client, acme, {"domain": "billing", "prompt": "hi", "response": "yo"})
    read = client.get(f"/v1/interactions/{text_only.json()['id']}", headers=acme.headers)
    assert read.json()["response_tool_calls"] is None


def test_text_and_tool_calls_together_are_kept(client: TestClient, acme: Caller) -> None:
    body = {**INTERACTION, "response": "Refunding.", "response_tool_calls": REFUND_CALLS}
    created = post(client, acme, body)

    assert created.status_code == 201, created.text
    read = client.get(f"/v1/interactions/{created.json()['id']}", headers=acme.headers).json()
    assert (read["response"], read["response_tool_calls"]) == ("Refunding.", REFUND_CALLS)


@pytest.mark.parametrize(
    "calls",
    [
        [],
        [{**REFUND_CALLS[0], "function": {"name": "refund", "arguments": "not json"}}],
        [{**REFUND_CALLS[0], "function": {"name": "refund", "arguments": "[1]"}}],
        [{**REFUND_CALLS[0], "type": "retrieval"}],
        [{"type": "function", "function": REFUND_CALLS[0]["function"]}],  # no id
        REFUND_CALLS * 2,  # one id twice
        "call refund",
    ],
)
def test_malformed_response_tool_calls_are_422_and_store_nothing(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], calls: Any
) -> None:
    response = post(client, acme, {**INTERACTION, "response_tool_calls": calls})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"]
    with sessions() as session:
        assert session.scalars(select(Interaction)).all() == []


def test_an_interaction_needs_a_response_or_tool_calls(client: TestClient, acme: Caller) -> None:
    payload = {k: v for k, v in INTERACTION.items() if k != "response"}
    assert post(client, acme, payload).status_code == 422


def test_a_correction_may_give_the_tool_calls_the_response_should_have_made(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session]
) -> None:
    created = post(client, acme, {**INTERACTION, "response_tool_calls": REFUND_CALLS})
    fixed = copy.deepcopy(REFUND_CALLS)
    fixed[0]["function"]["arguments"] = '{"invoice": "INV-7", "amount": 20}'
    event = {
        "kind": "correction",
        "interaction_id": created.json()["id"],
        "value": {"tool_calls": fixed},
    }
    response = client.post("/v1/feedback", json=event, headers=acme.headers)

    assert response.status_code == 201, response.text
    with sessions() as session:
        assert session.scalars(select(FeedbackEvent.value)).one() == {"tool_calls": fixed}


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"tool_calls": []},
        {"tool_calls": [{**REFUND_CALLS[0], "function": {"name": "refund", "arguments": "{"}}]},
        {"tool_calls": REFUND_CALLS, "text": ""},
        {"tool_calls": REFUND_CALLS, "calls": 1},
    ],
)
def test_a_malformed_tool_call_correction_is_422(
    client: TestClient, acme: Caller, value: dict[str, Any]
) -> None:
    created = post(client, acme, INTERACTION)
    event = {"kind": "correction", "interaction_id": created.json()["id"], "value": value}
    response = client.post("/v1/feedback", json=event, headers=acme.headers)

    assert response.status_code == 422, response.text
