"""Exports of tool-calling conversations: TRL's tool-calling format and OpenAI's with tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flywheel.errors import InvalidInput
from tests.unit.test_dataset_export import ItemStreams, export, lines, pair, sft, task

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


def test_every_rows_tools_are_written_in_one_key_order(tmp_path: Path) -> None:
    """A conversation's tools and a task's tools render the same text through a chat template
    (which writes keys in the order it is given them) whatever order the database returns their
    keys in (PostgreSQL's JSONB sorts them by length, SQLite keeps them): a model trained on
    one and evaluated on the other saw the same prompt. Task rows sorted their keys already."""
    shuffled = [{"function": {"parameters": TOOLS[0]["function"]["parameters"],
                              "name": "lookup_invoice", "description": "Find an invoice."},
                 "type": "function"}]  # fmt: skip
    tasks = [task("t1", task_kind="tool_call", entry_point=None, hidden_tests=None,
                  visible_tests=None, reference_solution=None, tools=TOOLS,
                  expected_calls=[{"name": "lookup_invoice", "arguments": {}}])]  # fmt: skip
    conversation = sft("s1", messages=CONVERSATION, tools=shuffled)
    streams = ItemStreams(sft=[conversation], tasks=tasks,
                          pairs=[pair("p1", messages=CONVERSATION, tools=TOOLS)])  # fmt: skip
    export(tmp_path, "trl", train=streams)

    (row,) = lines(tmp_path / "export/train/sft.jsonl")
    (dpo,) = lines(tmp_path / "export/train/dpo.jsonl")
    (grpo,) = lines(tmp_path / "export/train/grpo.jsonl")
    texts = {json.dumps(row["tools"]), json.dumps(dpo["tools"]), grpo["tools"]}
    assert texts == {json.dumps(TOOLS, sort_keys=True)}


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


# --- completions that call tools -----------------------------------------------------------

FIX = {
    "id": "call_2",
    "type": "function",
    "function": {"name": "lookup_invoice", "arguments": '{"number": "INV-8"}'},
}


def calling_streams() -> ItemStreams:
    return ItemStreams(
        sft=[sft("s1", messages=CONVERSATION[:2], tools=TOOLS, completion="",
                 completion_tool_calls=[FIX])],
        pairs=[pair("p1", messages=CONVERSATION[:2], tools=TOOLS, chosen="", rejected="",
                    chosen_tool_calls=[FIX], rejected_tool_calls=[CALL])],
    )  # fmt: skip


def object_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}


def test_trl_writes_a_tool_calling_completion_as_an_assistant_turn_with_calls(
    tmp_path: Path,
) -> None:
    export(tmp_path, "trl", train=calling_streams())

    (row,) = lines(tmp_path / "export/train/sft.jsonl")
    assert row["messages"][-1] == {"role": "assistant", "tool_calls": [object_call(FIX)]}
    assert row["tools"] == TOOLS
    (dpo,) = lines(tmp_path / "export/train/dpo.jsonl")
    assert dpo["chosen"] == [{"role": "assistant", "tool_calls": [object_call(FIX)]}]
    assert dpo["rejected"] == [{"role": "assistant", "tool_calls": [object_call(CALL)]}]
    assert dpo["tools"] == TOOLS


def test_trls_chat_templating_renders_the_calls_and_tools(tmp_path: Path) -> None:
    """DPOTrainer renders prompt + chosen (and + rejected), SFTTrainer the messages, with the
    row's `tools`: the calls and the tools reach the text a model is trained on."""
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    from tests.unit.test_dataset_export import build_tokenizer, load

    export(tmp_path, "trl", train=calling_streams())
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (
        "{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
        "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} "
        "{{ c.function.arguments | tojson }}>{% endfor %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    (dpo,) = load(tmp_path, "train/dpo.jsonl").to_list()  # what `datasets` reads back
    assert is_conversational(dpo)
    rendered = maybe_apply_chat_template(dpo, tokenizer, tools=dpo["tools"])
    assert rendered["prompt"].startswith("[tool lookup_invoice]")
    assert rendered["chosen"].endswith('<call lookup_invoice {"number": "INV-8"}>')
    assert rendered["rejected"].endswith('<call lookup_invoice {"number": "INV-7"}>')
    (example,) = load(tmp_path, "train/sft.jsonl").to_list()  # SFTTrainer: messages + tools
    text = maybe_apply_chat_template(
        {"messages": example["messages"]}, tokenizer, tools=example["tools"]
    )["text"]
    assert text.startswith("[tool lookup_invoice]")
    assert text.endswith('<|assistant|><call lookup_invoice {"number": "INV-8"}>')


def openai_chat_problems(row: dict[str, Any]) -> list[str]:
    """OpenAI's fine-tuning chat format with tools, as its guide writes it: `messages` (roles
    system/user/assistant/tool; an assistant turn has content or `tool_calls` of
    {id, type "function", function {name, arguments: a JSON string}}; a tool turn answers a
    call by `tool_call_id`), `tools` of function tools, and no other keys."""
    problems = [f"unknown key {key}" for key in set(row) - {"messages", "tools"}]
    called: set[str] = set()
    for message in row["messages"]:
        if message["role"] not in ("system", "user", "assistant", "tool"):
            problems.append(f"role {message['role']}")
        for call in message.get("tool_calls") or ():
            if call.get("type") != "function" or not isinstance(call.get("id"), str):
                problems.append(f"call {call}")
            arguments = call["function"]["arguments"]
            if not isinstance(arguments, str) or not isinstance(json.loads(arguments), dict):
                problems.append(f"arguments {arguments!r}")
            called.add(call["id"])
        if message["role"] == "tool" and message.get("tool_call_id") not in called:
            problems.append("tool turn without a call")
        if message["role"] == "assistant" and not (
            message.get("content") or message.get("tool_calls")
        ):
            problems.append("empty assistant turn")
    for tool in row.get("tools", ()):
        if tool.get("type") != "function" or not tool["function"].get("name"):
            problems.append(f"tool {tool}")
    return problems


def test_openai_writes_tool_calling_completions_in_its_fine_tuning_format(tmp_path: Path) -> None:
    export(tmp_path, "openai", train=calling_streams())

    (chat,) = lines(tmp_path / "export/train/chat.jsonl")
    assert chat["messages"][-1] == {"role": "assistant", "tool_calls": [FIX]}
    assert chat["tools"] == TOOLS
    assert openai_chat_problems(chat) == []
    (preference,) = lines(tmp_path / "export/train/preference.jsonl")
    assert preference["preferred_output"] == [{"role": "assistant", "tool_calls": [FIX]}]
    assert preference["non_preferred_output"] == [{"role": "assistant", "tool_calls": [CALL]}]
    assert preference["input"]["tools"] == TOOLS
    whole = {"messages": preference["input"]["messages"] + preference["preferred_output"]}
    assert openai_chat_problems(whole | {"tools": TOOLS}) == []


def test_a_pair_whose_calls_are_the_same_is_refused(tmp_path: Path) -> None:
    same = ItemStreams(pairs=[pair("p9", chosen="", rejected="", chosen_tool_calls=[CALL],
                                   rejected_tool_calls=[CALL])])  # fmt: skip
    with pytest.raises(InvalidInput, match="item p9: chosen and rejected are the same"):
        export(tmp_path, "trl", train=same)


def test_a_malformed_completion_call_is_refused(tmp_path: Path) -> None:
    bad = {**FIX, "function": {"name": "lookup_invoice", "arguments": "[]"}}
    streams = ItemStreams(sft=[sft("s9", completion="", completion_tool_calls=[bad])])
    with pytest.raises(InvalidInput, match=r"item s9: tool call 0's arguments must be"):
        export(tmp_path, "openai", train=streams)


def test_full_records_carry_the_calls_and_tools(tmp_path: Path) -> None:
    export(tmp_path, "jsonl", train=calling_streams())

    (row,) = lines(tmp_path / "export/train/sft.jsonl")
    assert (row["completion"], row["completion_tool_calls"], row["tools"]) == ("", [FIX], TOOLS)
    (plain,) = lines(tmp_path / "export/train/pairs.jsonl")
    assert plain["chosen_tool_calls"] == [FIX]
