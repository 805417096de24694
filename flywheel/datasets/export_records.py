"""What an export reads: plain records of a dataset version, and the checks each must pass.

The records are DB-free on purpose: whoever selects a version's items (the dataset service,
a test, a one-off script) hands them over as iterables, and the writers never see a session.
The checks run on every record as it streams past, so one bad item stops the export with an
error naming that item, before any file of the export becomes visible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from flywheel.errors import InvalidInput

Message = Mapping[str, str]  # {"role": ..., "content": ...}, nothing else
Kind = Literal["sft", "pairs", "labels", "tasks"]
KINDS: tuple[Kind, ...] = ("sft", "pairs", "labels", "tasks")

ROLES = frozenset({"system", "user", "assistant", "tool"})
# The completion answers the prompt's last turn: a chat template renders a generation prompt
# after a user or tool turn, and refuses (TRL) or continues (assistant) anything else.
PROMPT_LAST_ROLES = frozenset({"user", "tool"})
TASK_KINDS = frozenset({"code", "answer"})


@dataclass(frozen=True, slots=True)
class SftRecord:
    """A conversation prefix (`messages`) and the assistant `completion` to learn."""

    messages: Sequence[Message]
    completion: str
    weight: float
    group_key: str
    item_id: str


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


def checked_prompt(messages: object, item_id: str) -> list[dict[str, str]]:
    """The prompt as plain `{"role", "content"}` dicts, ending on the turn the reply answers."""
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


def _checked_message(message: object, index: int, item_id: str) -> dict[str, str]:
    if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
        raise refuse(item_id, f"message {index} must have exactly the keys role and content")
    role = message["role"]
    if role not in ROLES:
        raise refuse(item_id, f"message {index} has role {role!r}; expected one of {sorted(ROLES)}")
    content = checked_text(message["content"], f"message {index} content", item_id)
    return {"role": role, "content": content}


def assistant_turn(text: object, what: str, item_id: str) -> list[dict[str, str]]:
    """A completion as TRL's and OpenAI's conversational formats want it: one assistant turn."""
    return [{"role": "assistant", "content": checked_text(text, what, item_id)}]


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
