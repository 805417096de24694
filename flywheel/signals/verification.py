"""Verifier QA over stored tasks: mark each verifiable task usable or unusable, with why.

Code tasks run in the sandbox (flywheel.sandbox.qa). A tool-call task is usable when its
expected calls are well formed and name tools it offers, its reference calls (each argument's
first acceptable value, optional ones omitted) match them, and neither an empty call set nor
a wrong one (an argument changed, see `flywheel.sandbox.toolcalls.wrong_calls`) does. An
environment task is usable when its ground-truth calls reach one state in each of three
sandboxed runs and doing nothing does not (`flywheel.sandbox.environment`), and it offers tools.
"""

from __future__ import annotations

import keyword
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from flywheel.sandbox.environment import check_environment_task
from flywheel.sandbox.qa import QaResult, TaskSpec, check_task
from flywheel.sandbox.toolcalls import (
    compare_calls,
    expected_calls_problem,
    reference_calls,
    tools_problem,
    wrong_calls,
)
from flywheel.signals.models import VerifiableTask

QA_KINDS = ("code", "tool_call", "environment")
"""The task kinds verifier QA checks (answer tasks have nothing to run)."""


@dataclass(frozen=True)
class ToolCallSpec:
    """What QA needs of a tool-call task: its expected calls and the tools it offers."""

    task_id: str
    expected_calls: Any
    tools: Any


@dataclass(frozen=True)
class EnvironmentSpec:
    """What QA needs of an environment task: its environment and the tools it offers."""

    task_id: str
    environment: Any
    tools: Any


QaSpec = TaskSpec | ToolCallSpec | EnvironmentSpec

# Names an environment's tools cannot take: a trainer's episode class has them already.
RESERVED_TOOL_NAMES = frozenset({"reset", "get_reward"})


def environment_tools_problem(tools: Any) -> str | None:
    """Why an environment task's tools cannot be trained on, None when they can: well-formed
    tools (`tools_problem`) whose names are Python method names a trainer can give them."""
    if problem := tools_problem(tools):
        return problem
    for tool in tools:
        name = tool.get("function", tool)["name"]
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            return f"tool {name!r} is not a name an environment's method can have"
        if name in RESERVED_TOOL_NAMES:
            return f"tool {name!r} is reserved (an episode's own method)"
    return None


def check_environment_spec(spec: EnvironmentSpec) -> QaResult:
    """QA of one environment task, in the sandbox (see flywheel.sandbox.environment)."""
    if not isinstance(spec.environment, dict):
        return QaResult(spec.task_id, "unusable", "no environment")
    if problem := environment_tools_problem(spec.tools):
        return QaResult(spec.task_id, "unusable", problem)
    found = check_environment_task(spec.environment)
    return QaResult(spec.task_id, found.status, found.reason, is_flaky=found.is_flaky)


def check_tool_call_task(spec: ToolCallSpec) -> QaResult:
    """QA of one tool-call task: well formed, the reference matches, empty and wrong do not.

    >>> tools = [{"type": "function", "function": {"name": "add", "parameters": {
    ...     "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    >>> check_tool_call_task(ToolCallSpec("t", [{"name": "add", "arguments": {"a": [1]}}], tools))
    ... # doctest: +NORMALIZE_WHITESPACE
    QaResult(task_id='t', status='usable',
             reason='reference calls match; empty and wrong calls do not', is_flaky=False)
    >>> check_tool_call_task(ToolCallSpec("t", [{"name": "sub", "arguments": {}}], tools)).reason
    "expected calls name a tool not offered: 'sub'"
    """
    problem = expected_calls_problem(spec.expected_calls, spec.tools)
    if problem:
        return QaResult(spec.task_id, "unusable", problem)
    expected, tools = spec.expected_calls, spec.tools
    reference = compare_calls(reference_calls(expected, tools), expected, tools)
    if not reference.matched:
        return QaResult(spec.task_id, "unusable", f"reference calls fail: {reference.reason}")
    for name, calls in (("an empty", []), ("a wrong", wrong_calls(expected, tools))):
        if compare_calls(calls, expected, tools).matched:
            return QaResult(spec.task_id, "unusable", f"{name} call set matches")
    return QaResult(spec.task_id, "usable", "reference calls match; empty and wrong calls do not")


def pending_tasks(
    *, session: Session, domain_id: uuid.UUID | None, include_checked: bool = False
) -> list[VerifiableTask]:
    """Tasks QA checks (code, tool calls, environments) awaiting it (or all of them), of one
    domain or every domain."""
    query = select(VerifiableTask).where(VerifiableTask.task_kind.in_(QA_KINDS))
    if domain_id is not None:
        query = query.where(VerifiableTask.domain_id == domain_id)
    if not include_checked:
        query = query.where(VerifiableTask.verifier_status == "pending")
    return list(session.scalars(query.order_by(VerifiableTask.created_at)))


def task_spec(task: VerifiableTask) -> QaSpec:
    """What QA needs of a stored task, by its kind."""
    if task.task_kind == "tool_call":
        return ToolCallSpec(str(task.id), task.expected_calls, task.tools)
    if task.task_kind == "environment":
        return EnvironmentSpec(str(task.id), task.environment, task.tools)
    tests = "\n\n".join(part for part in (task.visible_tests, task.hidden_tests) if part)
    return TaskSpec(
        task_id=str(task.id),
        prompt=task.prompt,
        reference_solution=task.reference_solution or "",
        tests=tests,
        entry_point=task.entry_point or "",
    )


def check_spec(spec: QaSpec) -> QaResult:
    """QA of one task of any kind QA checks."""
    if isinstance(spec, ToolCallSpec):
        return check_tool_call_task(spec)
    if isinstance(spec, EnvironmentSpec):
        return check_environment_spec(spec)
    return check_task(spec)


def check_all(
    specs: Iterable[QaSpec], *, workers: int, on_done: Callable[[QaResult], None]
) -> list[QaResult]:
    """QA every task concurrently; `on_done` sees each result as it arrives (progress)."""

    def run(spec: QaSpec) -> QaResult:
        try:
            result = check_spec(spec)
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            # a task malformed in a way no check foresaw: unusable, and the run goes on
            reason = f"QA could not check it: {type(error).__name__}: {error}"[:500]
            result = QaResult(spec.task_id, "unusable", reason)
        on_done(result)
        return result

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, specs))


def record_results(*, session: Session, results: list[QaResult]) -> None:
    """Write each task's QA status and reason, in one bulk UPDATE by primary key."""
    if not results:
        return
    rows = [
        {
            "id": uuid.UUID(result.task_id),
            "verifier_status": result.status,
            "verifier_reason": result.reason,
        }
        for result in results
    ]
    session.execute(update(VerifiableTask), rows)
