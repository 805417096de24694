"""The feedback compiler keeps tool calling: a completion that calls tools stays one (its calls
and the request's tools on the item), a correction of a call's arguments is a pair, hashes and
redaction reach the calls. Runs on PostgreSQL and SQLite (FLYWHEEL_TEST_DB)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.reader import export_dataset_version
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work
from flywheel.models import (
    Domain,
    FeedbackEvent,
    Interaction,
    LabeledCompletion,
    PreferencePair,
    SftExample,
)
from flywheel.signals.compile import compile_feedback
from flywheel.signals.compile.rules import edit_precision
from flywheel.signals.content import content_sha256
from tests.conftest import Caller
from tests.integration.test_compile import Feedback

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an invoice.",
            "parameters": {
                "type": "object",
                "properties": {"invoice": {"type": "string"}, "amount": {"type": "number"}},
            },
        },
    }
]
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "Refund INV-7, it was 40 EUR."}]


def call(arguments: str, call_id: str = "call_1", name: str = "refund") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class ToolFeedback(Feedback):
    def tool_interaction(
        self, calls: list[dict[str, Any]] | None, response: str = "", tools: Any = TOOLS
    ) -> uuid.UUID:
        row = Interaction(
            tenant_id=self.tenant_id,
            domain_id=self.domain_id,
            messages=MESSAGES,
            tools=tools,
            response=response,
            response_tool_calls=calls,
            request_sha256="",
        )
        with unit_of_work(self.sessions) as session:
            session.add(row)
        return row.id


@pytest.fixture
def feedback(sessions: sessionmaker[Session], acme: Caller) -> ToolFeedback:
    return ToolFeedback(sessions, acme)


WRONG = [call('{"invoice": "INV-7", "amount": 400}')]
RIGHT = [call('{"invoice": "INV-7", "amount": 40}')]


def test_a_liked_tool_call_is_a_label_with_its_calls_and_the_tools(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.tool_interaction(RIGHT)
    feedback.thumbs(answer, up=True, rater="u1")

    feedback.compile()

    with sessions() as session:
        label = session.scalars(select(LabeledCompletion)).one()
    assert (label.completion, label.completion_tool_calls, label.tools) == ("", RIGHT, TOOLS)
    assert (label.is_desirable, label.messages) == (True, MESSAGES)


def test_a_correction_of_a_calls_arguments_is_a_pair_and_an_sft_example_of_the_fix(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.tool_interaction(WRONG)
    feedback.event("correction", {"tool_calls": RIGHT}, on=answer, rater="u1")

    report = feedback.compile()

    with sessions() as session:
        pair = session.scalars(select(PreferencePair)).one()
        example = session.scalars(select(SftExample)).one()
    assert (pair.chosen, pair.chosen_tool_calls) == ("", RIGHT)
    assert (pair.rejected, pair.rejected_tool_calls) == ("", WRONG)
    assert (pair.tools, pair.messages, pair.why) == (TOOLS, MESSAGES, "correction")
    assert (example.completion, example.completion_tool_calls, example.tools) == ("", RIGHT, TOOLS)
    assert example.messages == MESSAGES
    # one character of the call's arguments changed: a precise edit, weighed as one
    assert 0.9 < pair.weight == example.weight < 1.0
    # the hash of a text item plus its calls (name, parsed arguments; ids aside) and tools:
    # the same on PostgreSQL and SQLite, whose encodings of the evidence differ
    calls_and_tools = {"tool_calls": [["refund", {"amount": 40, "invoice": "INV-7"}]]}
    calls_and_tools["tools"] = TOOLS  # type: ignore[assignment]
    assert example.content_sha256 == content_sha256("sft", MESSAGES, "", calls_and_tools)
    assert (report.totals.pairs, report.totals.sft) == (1, 1)
    assert feedback.compile().totals.inserted == 0  # compiling again changes nothing


def test_a_text_correction_of_a_tool_call_keeps_the_tools(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.tool_interaction(WRONG)
    feedback.event("correction", {"text": "Which invoice?"}, on=answer, rater="u1")

    feedback.compile()

    with sessions() as session:
        pair = session.scalars(select(PreferencePair)).one()
    assert (pair.chosen, pair.chosen_tool_calls) == ("Which invoice?", None)
    assert (pair.rejected, pair.rejected_tool_calls, pair.tools) == ("", WRONG, TOOLS)


def test_calls_differing_only_in_arguments_are_two_items_and_rated_apart_pair(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    good, bad = feedback.tool_interaction(RIGHT), feedback.tool_interaction(WRONG)
    feedback.thumbs(good, up=True, rater="u1")
    feedback.thumbs(bad, up=False, rater="u1")
    ids = [call('{"amount": 40, "invoice": "INV-7"}', call_id="call_9")]  # same call, respelled
    feedback.thumbs(feedback.tool_interaction(ids), up=True, rater="u2")

    feedback.compile()

    with sessions() as session:
        pair = session.scalars(select(PreferencePair)).one()
        hashes = {row.content_sha256 for row in session.scalars(select(PreferencePair))}
    assert (pair.chosen_tool_calls, pair.rejected_tool_calls) in ((RIGHT, WRONG), (ids, WRONG))
    assert len(hashes) == 1
    assert edit_precision("a", "b") == 0.5  # the rule the weights come from, as a reminder


def test_same_calls_with_other_tools_are_other_items(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    feedback.thumbs(feedback.tool_interaction(RIGHT), up=True, rater="u1")
    other_tools = [{"type": "function", "function": {"name": "refund"}}]
    feedback.thumbs(feedback.tool_interaction(RIGHT, tools=other_tools), up=True, rater="u1")

    feedback.compile()

    with sessions() as session:
        rows = session.scalars(select(LabeledCompletion)).all()

    def key(tools: Any) -> bytes:
        return orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)

    assert sorted(key(row.tools) for row in rows) == sorted([key(TOOLS), key(other_tools)])
    assert len({row.content_sha256 for row in rows}) == 2


def test_an_email_in_corrected_arguments_is_redacted_and_counted(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.tool_interaction([call('{"invoice": "INV-7", "to": "x"}')])
    fixed = [call('{"invoice": "INV-7", "to": "jane.doe@example.com"}')]
    feedback.event("correction", {"tool_calls": fixed}, on=answer, rater="u1")

    feedback.compile()

    with sessions() as session:
        pair = session.scalars(select(PreferencePair)).one()
        example = session.scalars(select(SftExample)).one()
    for calls in (pair.chosen_tool_calls, example.completion_tool_calls):
        assert calls is not None
        arguments = orjson.loads(calls[0]["function"]["arguments"])
        assert re.fullmatch(r"\S+@(?:mail\.)?example\.\w+", arguments["to"]), arguments
        assert "jane" not in arguments["to"]
        assert arguments["invoice"] == "INV-7"
    assert pair.redaction_report == example.redaction_report == {"EMAIL": 1}


def test_plain_text_items_keep_their_content_hashes(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.interaction("The fee is 5%.")
    feedback.thumbs(answer, up=True, rater="u1")

    feedback.compile()

    with sessions() as session:
        label = session.scalars(select(LabeledCompletion)).one()
    assert label.content_sha256 == content_sha256(
        "label", [{"role": "user", "content": "What is the card fee?"}], "The fee is 5%.", True
    )
    assert (label.tools, label.completion_tool_calls) == (None, None)


def test_a_tool_call_corrected_through_the_api_exports_for_trl_and_openai(
    client: TestClient, acme: Caller, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """End to end: POST an interaction whose response called a tool and a correction of its
    arguments; compile; build a version; export it in both formats."""
    body = {"domain": "billing", "messages": MESSAGES, "tools": TOOLS, "response_tool_calls": WRONG}
    created = client.post("/v1/interactions", json=body, headers=acme.headers)
    assert created.status_code == 201, created.text
    correction = {
        "interaction_id": created.json()["id"],
        "kind": "correction",
        "value": {"tool_calls": RIGHT},
        "rater": "u1",
    }
    assert client.post("/v1/feedback", json=correction, headers=acme.headers).status_code == 201
    compile_feedback(sessions, tenant_id=acme.tenant_id)
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(select(Domain.id).where(Domain.tenant_id == acme.tenant_id))
        version = build_dataset_version(
            session=session,
            tenant_id=acme.tenant_id,
            domain_id=domain_id.one(),
            recipe=DatasetRecipe(eval_fraction=0.0, replay_fraction=0.0),
        ).version
        export_dataset_version(session, version, "billing", tmp_path / "trl", "trl")
        export_dataset_version(session, version, "billing", tmp_path / "openai", "openai")

    def rows(path: Path) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in path.read_text().splitlines()]

    right = [
        {
            **RIGHT[0],
            "function": {"name": "refund", "arguments": {"invoice": "INV-7", "amount": 40}},
        }
    ]
    (sft_row,) = rows(tmp_path / "trl/train/sft.jsonl")
    assert sft_row["messages"] == [*MESSAGES, {"role": "assistant", "tool_calls": right}]
    assert sft_row["tools"] == TOOLS
    (dpo,) = rows(tmp_path / "trl/train/dpo.jsonl")
    assert dpo["chosen"] == [{"role": "assistant", "tool_calls": right}]
    assert dpo["rejected"][0]["tool_calls"][0]["function"]["arguments"]["amount"] == 400
    (chat,) = rows(tmp_path / "openai/train/chat.jsonl")
    assert chat == {
        "messages": [*MESSAGES, {"role": "assistant", "tool_calls": RIGHT}],
        "tools": TOOLS,
    }
    listed = client.get("/v1/preference-pairs?domain=billing", headers=acme.headers).json()
    (item,) = listed["items"]
    assert (item["chosen_tool_calls"], item["rejected_tool_calls"]) == (RIGHT, WRONG)
    assert (item["chosen"], item["tools"]) == ("", TOOLS)
    (preference,) = rows(tmp_path / "openai/train/preference.jsonl")
    assert preference["input"] == {"messages": MESSAGES, "tools": TOOLS}
    assert preference["non_preferred_output"] == [{"role": "assistant", "tool_calls": WRONG}]


def test_feedback_with_its_own_conversation_and_tools_keeps_the_tools(
    feedback: ToolFeedback, sessions: sessionmaker[Session]
) -> None:
    event = FeedbackEvent(
        tenant_id=feedback.tenant_id,
        domain_id=feedback.domain_id,
        kind="rating",
        value={"thumbs": "down"},
        messages=MESSAGES,
        tools=TOOLS,
        response="No refunds.",
        rater="u1",
        request_sha256="",
    )
    with unit_of_work(sessions) as session:
        session.add(event)

    feedback.compile()

    with sessions() as session:
        label = session.scalars(select(LabeledCompletion)).one()
    assert (label.completion, label.tools, label.completion_tool_calls) == (
        "No refunds.",
        TOOLS,
        None,
    )
    assert label.is_desirable is False


def test_turns_decode_what_either_backend_encodes_and_texts_stay_texts() -> None:
    from flywheel.signals.compile import turns

    pg = '\x1e{"tools": null, "content": null, "tool_calls": [{"id": "c"}]}'  # jsonb's order
    assert turns.decode(pg) == turns.Turn("", [{"id": "c"}], None)
    assert turns.decode(turns.encode("hi", None, TOOLS)) == turns.Turn("hi", None, TOOLS)
    assert turns.encode("plain", None, None) == "plain"
    assert turns.decode("\x1e{not json") == turns.Turn("\x1e{not json", None, None)
    assert turns.edit_text("a\x1fb") == "a\x1fb"  # a text's edit is measured on all of it
