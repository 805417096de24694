"""A completion's tool calls read through real families' chat templates (tiny tokenizers with
the templates TRL ships), the text fallback, and `ToolCallReward` over what was read."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast
from trl import chat_template_utils as trl_templates

from finetune import synthetic, tiny
from finetune.rewards import TaskReward, ToolCallReward
from finetune.toolcalls import ToolCallParser, completion_calls, parse_text_calls
from tests.finetune.conftest import TRAINING

pytestmark = TRAINING

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris and Rome, 3 days?"}]
CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
    {"name": "get_weather", "arguments": {"city": "Rome", "days": 3}},
]
EXPECTED = [
    {"name": "get_weather", "arguments": {"city": ["Rome"], "days": [3]}},
    {"name": "get_weather", "arguments": {"city": ["Paris"], "days": [3, ""]}},
]


def family_tokenizer(name: str) -> PreTrainedTokenizerFast:
    return tiny.build_family_tokenizer(tiny.FAMILIES[name], synthetic.tokenizer_texts(), 300)


def rendered(tokenizer: PreTrainedTokenizerFast, calls: list[dict[str, Any]]) -> tuple[str, str]:
    """The prompt and, after it, an assistant turn making `calls`, as the template writes them."""
    prompt = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": call} for call in calls],
    }
    whole = tokenizer.apply_chat_template([*MESSAGES, turn], tools=TOOLS, tokenize=False)
    assert whole.startswith(prompt)
    return prompt, whole[len(prompt) :]


# Qwen 3 writes <tool_call>{json}</tool_call> blocks; Llama 3.1 a bare {"name", "parameters"}
# object, one call per turn.
FAMILY_CALLS = {"qwen3": CALLS, "qwen2_5": CALLS, "llama3_1": CALLS[:1]}


@pytest.mark.parametrize("family", sorted(FAMILY_CALLS))
def test_calls_read_through_the_template_of_each_family(family: str) -> None:
    tokenizer = family_tokenizer(family)
    parser = ToolCallParser(tokenizer)
    assert parser.has_template()  # TRL's response template for this family was set
    calls = FAMILY_CALLS[family]
    prompt, completion = rendered(tokenizer, calls)
    parsed = parser.parse_text(completion, prompt, TOOLS)
    assert (parsed.calls, parsed.error) == (calls, None)


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
def test_written_types_are_kept_so_text_for_an_integer_still_fails(family: str) -> None:
    tokenizer = family_tokenizer(family)
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}
    prompt, completion = rendered(tokenizer, [call])
    parsed = ToolCallParser(tokenizer).parse_text(completion, prompt, TOOLS)
    assert parsed.calls == [call]  # not typed into 3 by the schema


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
def test_malformed_json_in_a_templated_call_is_an_error_not_a_crash(family: str) -> None:
    tokenizer = family_tokenizer(family)
    prompt, completion = rendered(tokenizer, CALLS[:1])
    broken = completion.replace('"days": 3', '"days": 3,,')
    assert broken != completion
    parsed = ToolCallParser(tokenizer).parse_text(broken, prompt, TOOLS)
    assert parsed.calls == []
    assert parsed.error is not None
    assert parsed.error.startswith("malformed tool call: Expecting property name")


def test_an_xml_template_types_its_text_values_by_the_tools_schemas() -> None:
    # Qwen 3.5 writes every argument as text (<parameter=days>\n3\n</parameter>): only the
    # schema says 3 is an integer and "Paris" a string.
    qwen3 = tiny.FAMILIES["qwen3"]
    family = dataclasses.replace(
        qwen3, name="qwen3_5", chat_template=trl_templates.qwen3_5_nothink_chat_template
    )
    tokenizer = tiny.build_family_tokenizer(family, synthetic.tokenizer_texts(), 300)
    prompt, completion = rendered(tokenizer, CALLS[:1])
    assert "<parameter=days>\n3\n</parameter>" in completion
    parser = ToolCallParser(tokenizer)
    assert parser.parse_text(completion, prompt, TOOLS).calls == CALLS[:1]
    untyped = parser.parse_text(completion, prompt).calls
    assert untyped[0]["arguments"]["days"] == "3"  # without tools, the text as written


def test_calls_survive_trls_plain_decoding_without_a_response_template() -> None:
    # Without a response template GRPOTrainer decodes with skip_special_tokens=True, which
    # drops Qwen's <tool_call> markers (special tokens): the bare JSON is still read.
    tokenizer = family_tokenizer("qwen3")
    _, completion = rendered(tokenizer, CALLS)
    ids = tokenizer.encode(completion, add_special_tokens=False)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert "<tool_call>" not in text
    assert completion_calls([{"role": "assistant", "content": text}]).calls == CALLS


def test_a_template_trl_does_not_know_is_read_by_the_text_fallback() -> None:
    tokenizer = family_tokenizer("phi3")
    parser = ToolCallParser(tokenizer)
    assert not parser.has_template()
    assert parser.parse_text(tagged(CALLS[:1])).calls == CALLS[:1]


def test_the_text_fallback_reads_hermes_blocks_bare_json_and_lists() -> None:
    hermes = "".join(
        f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}", "days": 3}}}}\n'
        "</tool_call>\n"
        for city in ("Paris", "Rome")
    )
    assert parse_text_calls('<think>maybe {"name": "x"}</think>' + hermes).calls == CALLS
    lines = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}\n' + (
        '{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}'
    )
    assert parse_text_calls(lines).calls == CALLS
    listed = '```json\n[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]\n```'
    assert parse_text_calls(listed).calls == CALLS[:1]
    nested = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "x": {"name": 1}}}'
    assert len(parse_text_calls(nested).calls) == 1  # an object inside a call is not a call


def test_an_unclosed_or_truncated_call_is_malformed() -> None:
    assert parse_text_calls('<tool_call>{"name": "get_weather", "arguments": {"ci').error
    assert parse_text_calls('{"name": "get_weather", "arguments": {"city": "Pa').error


def test_structured_calls_on_the_message_win_over_its_text() -> None:
    message = {
        "role": "assistant",
        "content": "calling",
        "tool_calls": [{"type": "function", "function": CALLS[0]}],
    }
    assert completion_calls([message]).calls == CALLS[:1]
    arguments_as_text = {"type": "function", "function": {"name": "f", "arguments": "{bad"}}
    broken = completion_calls([{"role": "assistant", "tool_calls": [arguments_as_text]}])
    assert broken.error is not None
    assert broken.error.startswith("malformed tool call: f: arguments are not JSON")


def test_tool_call_reward_through_a_qwen_template_end_to_end() -> None:
    tokenizer = family_tokenizer("qwen3")
    parser = ToolCallParser(tokenizer)
    prompt, completion = rendered(tokenizer, CALLS[::-1])  # order-free
    parsed = parser.parse_text(completion, prompt, TOOLS)
    message = {"role": "assistant", "content": "", "tool_calls": parsed.calls}
    reward = ToolCallReward(partial_credit=0.5)
    wrong_days = [{**call, "arguments": {**call["arguments"], "days": 4}} for call in CALLS]
    scores = reward(
        [[message], [{"role": "assistant", "content": ""}], str(wrong_days)],
        expected_calls=[EXPECTED] * 3,
        tools=[TOOLS] * 3,
        task_kind=["tool_call"] * 3,
    )
    assert scores == [1.0, 0.0, 0.0]  # str(list) is Python, not JSON: no call read
    partial = reward([tagged(wrong_days)], expected_calls=[EXPECTED], tools=[TOOLS])
    assert partial == [0.5]
    assert reward.last_results[0] is not None
    assert reward.last_results[0].is_partial


def tagged(calls: list[dict[str, Any]]) -> str:
    """`calls` as Qwen / Hermes write them."""
    return "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls)


def test_task_reward_routes_tool_call_rows_and_reads_json_text_columns() -> None:
    reward = TaskReward()
    completion = tagged(CALLS)
    scores = reward(
        [completion, completion, "Answer: 4"],
        task_kind=["tool_call", "tool_call", "answer"],
        expected_calls=[EXPECTED, json.dumps(EXPECTED), None],
        tools=[TOOLS, json.dumps(TOOLS), None],
        answer=[None, None, "4"],
    )
    assert scores == [1.0, 1.0, 1.0]
    guessed = reward([completion], expected_calls=[EXPECTED], tools=[TOOLS])  # no task_kind
    assert guessed == [1.0]


def test_rows_whose_expected_calls_cannot_be_checked_are_unscored_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reward = ToolCallReward()
    completion = tagged(CALLS)
    broken = [
        ([{"arguments": {}}], TOOLS),  # no name
        ([{"name": "get_forecast", "arguments": {}}], TOOLS),  # a tool not offered
        (EXPECTED, None),  # no tools
        ("not json", TOOLS),
    ]
    scores = reward(
        [completion] * len(broken),
        expected_calls=[expected for expected, _ in broken],
        tools=[tools for _, tools in broken],
        task_kind=["tool_call"] * len(broken),
    )
    assert scores == [None] * len(broken)
    assert "tool-call rows left unscored: expected calls name a tool not offered" in caplog.text


@pytest.mark.parametrize(
    "completion",
    [
        '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 3000 + "]" * 3000 + "}}</tool_call>",
        '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 3000,  # cut off mid-way
        '{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}",  # past int's digit limit
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": ' + "9" * 5000 + '}"}</tool_call>',
    ],
)
def test_undecodable_json_is_a_zero_reward_not_a_crash(completion: str) -> None:
    """Brackets nested past the recursion limit and integers of more digits than Python
    parses raised out of the reward (RecursionError, ValueError) and killed the run."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    expected = [{"name": "f", "arguments": {"x": [1]}}]
    reward = ToolCallReward()
    assert reward(
        [completion], expected_calls=[expected], tools=[tools], task_kind=["tool_call"]
    ) == [0.0]
    assert "malformed" in reward.last_results[0].reason
