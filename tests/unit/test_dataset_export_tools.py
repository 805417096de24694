"""Exports of tool-calling conversations: TRL's tool-calling format and OpenAI's with tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flywheel.errors import InvalidInput
from tests.unit.test_dataset_export import ItemStreams, export, lines, pair, sft

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_invoice",
            "description": "Find an invoice.",
            "parameters": {"type": "object", "properties": {"number": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup_invoice", "arguments": '{"number": "INV-7"}'},
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are a billing agent."}]},
    {"role": "user", "content": "Why was INV-7 charged twice?", "name": "ann"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"charges": 2}'},
]


def tool_streams() -> ItemStreams:
    return ItemStreams(
        sft=[sft("s1", messages=CONVERSATION, tools=TOOLS)],
        pairs=[pair("p1", messages=CONVERSATION, tools=TOOLS)],
    )


def test_trl_rows_carry_tool_calls_with_object_arguments_and_a_tools_column(
    tmp_path: Path,
) -> None:
    export(tmp_path, "trl", train=tool_streams())

    (row,) = lines(tmp_path / "export/train/sft.jsonl")
    assert row["tools"] == TOOLS
    messages = row["messages"]
    # TRL (and transformers' chat templates) take a call's arguments as an object.
    assert messages[2]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "lookup_invoice",
                                                           "arguments": {"number": "INV-7"}}}
    ]  # fmt: skip
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": '{"charges": 2}'}
    assert messages[:2] == CONVERSATION[:2]
    assert messages[-1] == {"role": "assistant", "content": sft().completion}
    (dpo,) = lines(tmp_path / "export/train/dpo.jsonl")
    assert dpo["tools"] == TOOLS
    assert dpo["prompt"][2]["tool_calls"][0]["function"]["arguments"] == {"number": "INV-7"}


def test_openai_rows_keep_json_string_arguments_and_tools(tmp_path: Path) -> None:
    export(tmp_path, "openai", train=tool_streams())

    (chat,) = lines(tmp_path / "export/train/chat.jsonl")
    assert chat == {
        "messages": [*CONVERSATION, {"role": "assistant", "content": sft().completion}],
        "tools": TOOLS,
    }
    (preference,) = lines(tmp_path / "export/train/preference.jsonl")
    assert preference["input"] == {"messages": CONVERSATION, "tools": TOOLS}


def test_records_without_tools_write_no_tools_column(tmp_path: Path) -> None:
    export(tmp_path, "trl", train=ItemStreams(sft=[sft("s1", messages=CONVERSATION)]))

    (row,) = lines(tmp_path / "export/train/sft.jsonl")
    assert "tools" not in row


def with_call(**function: Any) -> list[dict[str, Any]]:
    call = {**CALL, "function": {**CALL["function"], **function}}
    return [CONVERSATION[1], {"role": "assistant", "content": None, "tool_calls": [call]},
            CONVERSATION[3]]  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        (with_call(arguments="{not json"), "tool call 0.s arguments must be a JSON object"),
        (with_call(arguments="[1]"), "tool call 0.s arguments must be a JSON object"),
        (with_call(name=""), "tool call 0 needs a function name"),
        ([CONVERSATION[1], {"role": "assistant", "content": None}, CONVERSATION[3]],
         "message 1 content must be"),
        ([CONVERSATION[1], {"role": "tool", "content": "x", "tool_call_id": 5}],
         "tool_call_id must be a non-empty string"),
        ([{"role": "user", "content": "x", "function_call": {}}], "message 0 has unknown keys"),
    ],
)  # fmt: skip
def test_malformed_tool_messages_are_refused_by_item_id(
    tmp_path: Path, messages: list[dict[str, Any]], problem: str
) -> None:
    with pytest.raises(InvalidInput, match=f"item s9: {problem}"):
        export(tmp_path, "trl", train=ItemStreams(sft=[sft("s9", messages=messages)]))


def test_malformed_tools_are_refused(tmp_path: Path) -> None:
    bad = ItemStreams(sft=[sft("s9", messages=CONVERSATION, tools=[{"type": "retrieval"}])])
    with pytest.raises(InvalidInput, match="item s9: tools must be a list of function tools"):
        export(tmp_path, "openai", train=bad)


def test_the_exported_trl_row_renders_with_a_tool_aware_chat_template(tmp_path: Path) -> None:
    from jinja2 import Template

    export(tmp_path, "trl", train=tool_streams())
    (row,) = lines(tmp_path / "export/train/sft.jsonl")
    template = Template(
        "{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "<call {{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}{% endfor %}"
    )
    rendered = template.render(messages=row["messages"], tools=row["tools"])
    assert rendered == '[tool lookup_invoice]<call lookup_invoice {"number": "INV-7"}>'
    assert json.loads(json.dumps(row))  # plain JSON all the way down
