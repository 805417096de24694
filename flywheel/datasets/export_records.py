"""What an export reads: plain records of a dataset version, and the checks each must pass.

The records are DB-free on purpose: whoever selects a version's items (the dataset service,
a test, a one-off script) hands them over as iterables, and the writers never see a session.
The checks run on every record as it streams past, so one bad item stops the export with an
error naming that item, before any file of the export becomes visible.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flywheel.errors import InvalidInput

# OpenAI's chat format: role and content (text, or text parts), and optionally a name, an
# assistant's tool_calls (content may then be null) or a tool message's tool_call_id.
Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]]  # OpenAI function tools: {"type": "function", "function"}
ToolCalls = Sequence[Mapping[str, Any]]  # {"id", "type": "function", "function": {name, arguments}}
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
Kind = Literal["sft", "pairs", "labels", "tasks"]
KINDS: tuple[Kind, ...] = ("sft", "pairs", "labels", "tasks")

ROLES = frozenset({"system", "user", "assistant", "tool"})
# The completion answers the prompt's last turn: a chat template renders a generation prompt
# after a user or tool turn, and refuses (TRL) or continues (assistant) anything else.
PROMPT_LAST_ROLES = frozenset({"user", "tool"})
TASK_KINDS = frozenset({"code", "answer", "tool_call", "environment"})


@dataclass(frozen=True, slots=True)
class SftRecord:
    """A conversation prefix (`messages`) and the assistant `completion` to learn."""

    messages: Sequence[Message]
    completion: str
    weight: float
    group_key: str
    item_id: str
    tools: Tools | None = None  # the tools the conversation offered, if any
    # the completion's tool calls (OpenAI's `tool_calls`), when it calls tools: `completion`
    # is then its text, "" when it only calls tools
    completion_tool_calls: ToolCalls | None = None


@dataclass(frozen=True, slots=True)
class PairRecord:
    """`chosen` is preferred over `rejected` as the reply to `messages`; `why` says why."""

    messages: Sequence[Message]
    chosen: str
    rejected: str
    weight: float
    why: str
    group_key: str
    item_id: str
    tools: Tools | None = None
    chosen_tool_calls: ToolCalls | None = None
    rejected_tool_calls: ToolCalls | None = None


@dataclass(frozen=True, slots=True)
class LabelRecord:
    """An unpaired judgement (KTO): `completion` was a desirable reply to `messages`, or not."""

    messages: Sequence[Message]
    completion: str
    is_desirable: bool
    weight: float
    group_key: str
    item_id: str
    why: str = ""
    tools: Tools | None = None
    completion_tool_calls: ToolCalls | None = None


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A verifiable task. `hidden_tests` and `reference_solution` are the answer key: they
    travel in the reward channel (or the full-record format), never in a prompt."""

    prompt: str
    entry_point: str | None
    hidden_tests: str | None
    visible_tests: str | None
    reference_solution: str | None
    task_kind: str
    answer: str | None
    difficulty: float | None
    group_key: str
    item_id: str
    weight: float = 1.0
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    expected_calls: list[dict[str, Any]] | None = None
    environment: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ItemStreams:
    """One split's items, per kind. Each iterable is read at most once, front to back."""

    sft: Iterable[SftRecord] = ()
    pairs: Iterable[PairRecord] = ()
    labels: Iterable[LabelRecord] = ()
    tasks: Iterable[TaskRecord] = ()


def refuse(item_id: str, problem: str) -> InvalidInput:
    """The one error shape for a bad record: which item, and what is wrong with it."""
    return InvalidInput(f"item {item_id}: {problem}", details=[{"item_id": item_id}])


def checked_text(value: object, what: str, item_id: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise refuse(item_id, f"{what} must be a non-empty string")
    return value


def checked_weight(weight: object, item_id: str) -> float:
    """Weights scale a loss or a sampling rate: finite and non-negative, nothing else."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight < 0
    ):
        raise refuse(item_id, f"weight must be a finite number >= 0, got {weight!r}")
    return float(weight)


def checked_prompt(messages: object, item_id: str) -> list[dict[str, Any]]:
    """The prompt as OpenAI-format message dicts, ending on the turn the reply answers."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise refuse(item_id, "messages must be a non-empty list of {role, content}")
    checked = [_checked_message(message, index, item_id) for index, message in enumerate(messages)]
    if checked[-1]["role"] not in PROMPT_LAST_ROLES:
        raise refuse(
            item_id,
            f"the prompt ends with a {checked[-1]['role']!r} turn; it must end with a user "
            "(or tool) turn, the one the completion answers",
        )
    return checked


def _checked_message(message: object, index: int, item_id: str) -> dict[str, Any]:
    if not isinstance(message, Mapping) or not {"role"} <= set(message) <= MESSAGE_KEYS:
        unknown = sorted(set(message) - MESSAGE_KEYS) if isinstance(message, Mapping) else []
        raise refuse(item_id, f"message {index} has unknown keys {unknown} (or no role)")
    role = message["role"]
    if role not in ROLES:
        raise refuse(item_id, f"message {index} has role {role!r}; expected one of {sorted(ROLES)}")
    checked = dict(message)
    if role == "assistant" and message.get("tool_calls") is not None:
        checked["tool_calls"] = _checked_calls(message["tool_calls"], item_id)
    elif isinstance(message.get("content"), list):
        _checked_parts(message["content"], f"message {index} content", item_id)
    else:
        checked["content"] = checked_text(
            message.get("content"), f"message {index} content", item_id
        )
    if "tool_call_id" in message:
        checked_text(message["tool_call_id"], "tool_call_id", item_id)
    return checked


def _checked_parts(parts: list[Any], what: str, item_id: str) -> None:
    for part in parts:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise refuse(item_id, f"{what} parts must be text parts")
        checked_text(part.get("text"), what, item_id)


def _checked_calls(calls: object, item_id: str) -> list[dict[str, Any]]:
    if isinstance(calls, tuple):
        calls = list(calls)
    if not isinstance(calls, list) or not calls:
        raise refuse(item_id, "tool_calls must be a non-empty list")
    return [_checked_call(call, index, item_id) for index, call in enumerate(calls)]


def _checked_call(call: object, index: int, item_id: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(call, Mapping) or not isinstance(name, str) or not name:
        raise refuse(item_id, f"tool call {index} needs a function name")
    assert isinstance(function, Mapping)  # a name was found in it
    if not isinstance(_json_or_none(function.get("arguments")), dict):
        raise refuse(item_id, f"tool call {index}'s arguments must be a JSON object (as a string)")
    return dict(call)


def _json_or_none(text: object) -> object:
    if not isinstance(text, str):
        return None
    try:
        parsed: object = json.loads(text)
    except ValueError:
        return None
    return parsed


def checked_tools(tools: object, item_id: str) -> list[dict[str, Any]] | None:
    """The record's tools as OpenAI function tools, or None when it has none; their keys in
    sorted order at every depth, as task rows write them. A chat template renders a tool's
    keys in the order it is given them, and the database decides that order (PostgreSQL's
    JSONB sorts keys by length, SQLite keeps them as written): in one order, the same domain's
    tools are the same prompt text in every row and on every database."""
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or not all(_is_function_tool(tool) for tool in tools):
        raise refuse(item_id, "tools must be a list of function tools {type, function{name}}")
    canonical: list[dict[str, Any]] = json.loads(json.dumps(list(tools), sort_keys=True))
    return canonical


def _is_function_tool(tool: object) -> bool:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    return (
        isinstance(tool, Mapping)
        and tool.get("type") == "function"
        and isinstance(function, Mapping)
        and isinstance(function.get("name"), str)
    )


def assistant_turn(
    text: object, what: str, item_id: str, tool_calls: object = None
) -> list[dict[str, Any]]:
    """A completion as TRL's and OpenAI's conversational formats want it: one assistant turn,
    with its `tool_calls` when it calls tools (and then its text only when it has one)."""
    if tool_calls is None:
        return [{"role": "assistant", "content": checked_text(text, what, item_id)}]
    if not isinstance(text, str):
        raise refuse(item_id, f"{what} must be a string")
    calls = _checked_calls(tool_calls, item_id)
    said = {"content": text} if text.strip() else {}
    return [{"role": "assistant", **said, "tool_calls": calls}]


def check_task(task: TaskRecord) -> None:
    """Refuse a task that is malformed or whose answer key shows in its prompt."""
    checked_text(task.prompt, "prompt", task.item_id)
    if task.task_kind not in TASK_KINDS:
        raise refuse(
            task.item_id, f"task_kind {task.task_kind!r} is not one of {sorted(TASK_KINDS)}"
        )
    difficulty = task.difficulty
    if difficulty is not None and not (
        isinstance(difficulty, float | int) and 0 <= difficulty <= 1
    ):
        raise refuse(task.item_id, f"difficulty must be a pass rate in [0, 1], got {difficulty!r}")
    refuse_leaked_tests(task)


def refuse_leaked_tests(task: TaskRecord) -> None:
    """Hidden tests in the prompt would let the model fit the grader instead of the task.

    Checked as a whole and line by line: one leaked `assert f(2) == 5` hands over an expected
    value. An assert that is also among the visible tests is not secret, so it may appear.
    """
    hidden = (task.hidden_tests or "").strip()
    if not hidden:
        return
    leaked = hidden if hidden in task.prompt else _leaked_assert(hidden, task)
    if leaked:
        raise refuse(
            task.item_id,
            f"the prompt contains its hidden tests ({leaked.splitlines()[0][:80]!r}); "
            "refusing to export a task whose grader the model can read",
        )


def _leaked_assert(hidden: str, task: TaskRecord) -> str | None:
    visible = task.visible_tests or ""
    for line in hidden.splitlines():
        probe = line.strip()
        if probe.startswith("assert ") and probe not in visible and probe in task.prompt:
            return probe
    return None


def task_tests(task: TaskRecord) -> str | None:
    """The tests a reward runs: visible then hidden, joined as the verifier joins them."""
    parts = [part for part in (task.visible_tests, task.hidden_tests) if part and part.strip()]
    return "\n\n".join(parts) or None
