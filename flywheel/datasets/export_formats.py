"""The three export formats: which files each writes, and the JSON row each record becomes.

`trl` (one file per trainer, TRL's conversational dataset types; extra columns ride along):

    {split}/sft.jsonl   {"messages": prompt + [assistant completion], "weight"}
    {split}/dpo.jsonl   {"prompt": messages, "chosen": [assistant], "rejected": [assistant],
                         "weight"}
    {split}/kto.jsonl   {"prompt": messages, "completion": [assistant], "label": bool, "weight"}
    {split}/grpo.jsonl  {"prompt": [user task prompt], "task_id", "task_kind", "entry_point",
                         "tests", "answer", "tools", "expected_calls", "environment",
                         "difficulty", "weight"}

  GRPO hands every column but `prompt` to the reward functions as keyword lists, so `tests`
  (visible then hidden, as the verifier joins them) and `entry_point` reach
  `flywheel.sandbox.rewards.CodeReward` and never the policy. The reference solution is not
  exported: GRPO learns from the reward, and a solution column is one bug away from a prompt.
  Tool-call and environment tasks: the prompt is the task's messages (system turns kept),
  `tools`, `expected_calls` and `environment` are JSON text (null for other kinds): the
  expected calls and the environment's ground truth are the answer key, for the reward only.
  Every trl row's `weight` is the item's sampling weight: the recipes draw rows in proportion
  to it (finetune.sampling).
  Tool calling (TRL's tool-calling dataset format): messages keep OpenAI's `tool_calls`
  (each call's `arguments` written as a JSON object, as TRL and transformers' chat templates
  take them), `tool` turns with their `tool_call_id`, names and text parts; a record that
  offered tools gets a `tools` column (OpenAI function tools; SFTTrainer passes it to the chat
  template). Rows without tools have no such column. A completion that calls tools (an SFT
  example's, a pair's chosen or rejected, a label's) is one assistant turn with `tool_calls`
  (object arguments) and its text as `content` only when it has one: TRL's DPOTrainer and
  KTO read the same `tools` column and render prompt + chosen/rejected through the template.

`openai` (OpenAI fine-tuning JSONL; only the fields OpenAI accepts):

    {split}/chat.jsonl        {"messages": prompt + [assistant], "tools"?}       supervised
    {split}/preference.jsonl  {"input": {"messages": prompt, "tools"?},
                               "preferred_output": [assistant], "non_preferred_output": [assistant]}

  Tasks join chat.jsonl as user prompt + reference solution, and only when a reference
  exists (the others are counted as skipped). KTO labels have no OpenAI format and are not
  read (reported as omitted). OpenAI's per-message `weight` is a 0/1 train mask, not a sample
  weight, so item weights are dropped. Tool calls stay as OpenAI sends them (`arguments` a
  JSON string), with the record's `tools`; a tool turn without its tool_call_id is refused.
  A completion that calls tools is an assistant message with `tool_calls` (supervised rows:
  the last message; preference rows: preferred/non_preferred_output).
  Use `train` for the training file and `eval` for validation.

`jsonl` (Flywheel's own full records, every field, hidden tests in their own field):

    {split}/sft.jsonl  {split}/pairs.jsonl  {split}/labels.jsonl  {split}/tasks.jsonl
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from flywheel.datasets.export_records import (
    Kind,
    LabelRecord,
    PairRecord,
    SftRecord,
    TaskRecord,
    assistant_turn,
    check_task,
    checked_prompt,
    checked_text,
    checked_tools,
    checked_weight,
    refuse,
    task_tests,
)

Format = Literal["trl", "openai", "jsonl"]
FORMATS: tuple[Format, ...] = ("trl", "openai", "jsonl")
Row = dict[str, Any]
R = TypeVar("R")


@dataclass(frozen=True)
class Source(Generic[R]):
    """Where a file's rows come from: one kind's stream, each record built into a row
    (or None: not representable in this format, counted as skipped)."""

    kind: Kind
    record_type: type[R]
    build: Callable[[R], Row | None]


@dataclass(frozen=True)
class FileSpec:
    name: str
    sources: tuple[Source[Any], ...]


# --- trl -----------------------------------------------------------------------------------


def trl_sft(record: SftRecord) -> Row:
    prompt = _trl_prompt(record.messages, record.item_id)
    completion = _trl_turn(
        record.completion, "completion", record.item_id, record.completion_tool_calls
    )
    row = {
        "messages": prompt + completion,
        "weight": checked_weight(record.weight, record.item_id),
    }
    return _with_tools(row, record.tools, record.item_id)


def _trl_prompt(messages: object, item_id: str) -> list[dict[str, Any]]:
    """The prompt as TRL's tool-calling format wants it: each call's arguments an object
    (transformers' chat templates render them), the rest as OpenAI writes it."""
    return [_object_arguments(message) for message in checked_prompt(messages, item_id)]


def _trl_turn(text: object, what: str, item_id: str, calls: object) -> list[dict[str, Any]]:
    """A completion as TRL's tool-calling format wants it (a call's arguments an object)."""
    return [_object_arguments(turn) for turn in assistant_turn(text, what, item_id, calls)]


def _object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [_call_with_object_arguments(call) for call in calls]}


def _call_with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}


def _with_tools(row: Row, tools: object, item_id: str) -> Row:
    """The row with a `tools` column when the record offered tools (TRL and OpenAI both)."""
    checked = checked_tools(tools, item_id)
    return row if checked is None else {**row, "tools": checked}


def trl_dpo(record: PairRecord) -> Row:
    item_id = record.item_id
    chosen = (record.chosen, record.chosen_tool_calls)
    if chosen == (record.rejected, record.rejected_tool_calls):
        raise refuse(item_id, "chosen and rejected are the same text; the pair teaches nothing")
    row = {
        "prompt": _trl_prompt(record.messages, item_id),
        "chosen": _trl_turn(record.chosen, "chosen", item_id, record.chosen_tool_calls),
        "rejected": _trl_turn(record.rejected, "rejected", item_id, record.rejected_tool_calls),
        "weight": checked_weight(record.weight, item_id),
    }
    return _with_tools(row, record.tools, item_id)


def trl_kto(record: LabelRecord) -> Row:
    item_id = record.item_id
    if not isinstance(record.is_desirable, bool):
        raise refuse(item_id, f"is_desirable must be a bool, got {record.is_desirable!r}")
    row = {
        "prompt": _trl_prompt(record.messages, item_id),
        "completion": _trl_turn(
            record.completion, "completion", item_id, record.completion_tool_calls
        ),
        "label": record.is_desirable,
        "weight": checked_weight(record.weight, item_id),
    }
    return _with_tools(row, record.tools, item_id)


def trl_grpo(record: TaskRecord) -> Row:
    check_task(record)
    tests = task_tests(record)
    _refuse_unrewardable(record, tests)
    return {
        "prompt": _task_prompt(record),
        "task_id": record.item_id,
        "task_kind": record.task_kind,
        "entry_point": record.entry_point,
        "tests": tests,
        "answer": record.answer,
        # JSON text: their values mix types row to row (an argument's acceptable values are
        # [10] in one task and ["cm", ""] in the next), which a typed column cannot hold.
        "tools": _json_or_none(record.tools),
        "expected_calls": _json_or_none(record.expected_calls),
        "environment": _json_or_none(record.environment),
        "difficulty": record.difficulty,
        "weight": checked_weight(record.weight, record.item_id),
    }


def _refuse_unrewardable(record: TaskRecord, tests: str | None) -> None:
    """A task the reward has nothing to go on for is refused, naming what it lacks."""
    item_id, kind = record.item_id, record.task_kind
    if kind == "code" and not (tests and record.entry_point):
        raise refuse(item_id, "a code task needs tests and an entry point to be rewarded")
    if kind == "answer" and not (record.answer and record.answer.strip()):
        raise refuse(item_id, "an answer task needs its answer to be rewarded")
    if kind == "tool_call" and not (record.tools and record.expected_calls):
        raise refuse(item_id, "a tool_call task needs its tools and expected calls")
    if kind == "environment" and not (record.tools and record.environment):
        raise refuse(item_id, "an environment task needs its tools and environment")


def _task_prompt(record: TaskRecord) -> list[dict[str, Any]]:
    """A task's prompt as chat messages: its own messages when it has them, else one user
    turn."""
    if record.messages is None:
        return [{"role": "user", "content": record.prompt}]
    return _trl_prompt(record.messages, record.item_id)


def _json_or_none(value: object) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


# --- openai --------------------------------------------------------------------------------


def _openai_prompt(messages: object, item_id: str) -> list[dict[str, Any]]:
    prompt = checked_prompt(messages, item_id)
    if any(message["role"] == "tool" and "tool_call_id" not in message for message in prompt):
        raise refuse(item_id, "OpenAI needs a tool_call_id on tool turns; this one has none")
    return prompt


def openai_chat_sft(record: SftRecord) -> Row:
    prompt = _openai_prompt(record.messages, record.item_id)
    completion = assistant_turn(
        record.completion, "completion", record.item_id, record.completion_tool_calls
    )
    return _with_tools({"messages": prompt + completion}, record.tools, record.item_id)


def openai_chat_task(record: TaskRecord) -> Row | None:
    check_task(record)
    reference = record.reference_solution
    if not (reference and reference.strip()):
        return None
    return {
        "messages": [
            {"role": "user", "content": record.prompt},
            {"role": "assistant", "content": reference},
        ]
    }


def openai_preference(record: PairRecord) -> Row:
    trl_dpo(record)  # the same checks; OpenAI wants the same pair in its own shape
    given = {"messages": _openai_prompt(record.messages, record.item_id)}
    return {
        "input": _with_tools(given, record.tools, record.item_id),
        "preferred_output": assistant_turn(
            record.chosen, "chosen", record.item_id, record.chosen_tool_calls
        ),
        "non_preferred_output": assistant_turn(
            record.rejected, "rejected", record.item_id, record.rejected_tool_calls
        ),
    }


# --- jsonl (full records) ------------------------------------------------------------------


def full_sft(record: SftRecord) -> Row:
    row = trl_sft(record)
    return {
        "item_id": record.item_id,
        "group_key": record.group_key,
        "messages": row["messages"][:-1],
        "completion": record.completion,
        "weight": row["weight"],
        **_present(tools=row.get("tools"), completion_tool_calls=record.completion_tool_calls),
    }


def _present(**fields: object) -> Row:
    """The tool-calling fields a full record has (none for a text-only item, as before)."""
    return {name: value for name, value in fields.items() if value is not None}


def full_pair(record: PairRecord) -> Row:
    row = trl_dpo(record)
    return {
        "item_id": record.item_id,
        "group_key": record.group_key,
        "messages": row["prompt"],
        "chosen": record.chosen,
        "rejected": record.rejected,
        "weight": row["weight"],
        "why": record.why,
        **_present(
            tools=row.get("tools"),
            chosen_tool_calls=record.chosen_tool_calls,
            rejected_tool_calls=record.rejected_tool_calls,
        ),
    }


def full_label(record: LabelRecord) -> Row:
    row = trl_kto(record)
    return {
        "item_id": record.item_id,
        "group_key": record.group_key,
        "messages": row["prompt"],
        "completion": record.completion,
        "is_desirable": record.is_desirable,
        "weight": row["weight"],
        "why": record.why,
        **_present(tools=row.get("tools"), completion_tool_calls=record.completion_tool_calls),
    }


def full_task(record: TaskRecord) -> Row:
    check_task(record)
    return {
        "item_id": record.item_id,
        "group_key": record.group_key,
        "task_kind": record.task_kind,
        "prompt": checked_text(record.prompt, "prompt", record.item_id),
        "entry_point": record.entry_point,
        "visible_tests": record.visible_tests,
        "hidden_tests": record.hidden_tests,
        "reference_solution": record.reference_solution,
        "answer": record.answer,
        "difficulty": record.difficulty,
        "weight": checked_weight(record.weight, record.item_id),
        **_present(
            messages=record.messages,
            tools=record.tools,
            expected_calls=record.expected_calls,
            environment=record.environment,
        ),
    }


LAYOUTS: dict[Format, tuple[FileSpec, ...]] = {
    "trl": (
        FileSpec("sft.jsonl", (Source("sft", SftRecord, trl_sft),)),
        FileSpec("dpo.jsonl", (Source("pairs", PairRecord, trl_dpo),)),
        FileSpec("kto.jsonl", (Source("labels", LabelRecord, trl_kto),)),
        FileSpec("grpo.jsonl", (Source("tasks", TaskRecord, trl_grpo),)),
    ),
    "openai": (
        FileSpec(
            "chat.jsonl",
            (
                Source("sft", SftRecord, openai_chat_sft),
                Source("tasks", TaskRecord, openai_chat_task),
            ),
        ),
        FileSpec("preference.jsonl", (Source("pairs", PairRecord, openai_preference),)),
    ),
    "jsonl": (
        FileSpec("sft.jsonl", (Source("sft", SftRecord, full_sft),)),
        FileSpec("pairs.jsonl", (Source("pairs", PairRecord, full_pair),)),
        FileSpec("labels.jsonl", (Source("labels", LabelRecord, full_label),)),
        FileSpec("tasks.jsonl", (Source("tasks", TaskRecord, full_task),)),
    ),
}
