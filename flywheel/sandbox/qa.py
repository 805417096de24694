"""Verifier QA: is a task's verifier worth trusting as a reward?

A task is usable only if its reference solution passes every test in each of several runs
(a pass in some runs only marks the tests flaky), trivial solutions — the bare stub, `pass`,
`return None` — fail, and its tests import and run at all.
"""

from __future__ import annotations

import ast
import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flywheel.errors import InvalidInput
from flywheel.sandbox.execute import run_tests
from flywheel.sandbox.limits import Limits

REFERENCE_RUNS = 3


@dataclass(frozen=True)
class TaskSpec:
    """What QA needs of a task: the prompt (signature and docstring), the reference solution
    (the whole program), the tests and the function they call."""

    task_id: str
    prompt: str
    reference_solution: str
    tests: str
    entry_point: str


@dataclass(frozen=True)
class QaResult:
    task_id: str
    status: Literal["usable", "unusable"]
    reason: str
    is_flaky: bool = False


def check_task(task: TaskSpec, limits: Limits | None = None) -> QaResult:
    """Run the reference REFERENCE_RUNS times and every trivial solution once."""
    limits = limits or Limits()
    verdicts = [
        run_tests(task.reference_solution, task.tests, entry_point=task.entry_point, limits=limits)
        for _ in range(REFERENCE_RUNS)
    ]
    first = verdicts[0]
    if first.reason in {"harness_error", "no_tests"}:
        return _unusable(task, f"tests do not run: {first.reason} {first.detail[-300:]}".strip())
    passes = sum(verdict.is_passed for verdict in verdicts)
    if 0 < passes < REFERENCE_RUNS:
        return QaResult(
            task.task_id,
            "unusable",
            f"flaky: reference passed {passes} of {REFERENCE_RUNS} runs",
            is_flaky=True,
        )
    if passes == 0:
        failed = [
            test.name + ": " + test.message for test in first.tests if test.status != "passed"
        ]
        return _unusable(task, f"reference fails ({first.reason}): {'; '.join(failed)[:300]}")
    for name, trivial in trivial_solutions(task.prompt):
        if run_tests(trivial, task.tests, entry_point=task.entry_point, limits=limits).is_passed:
            return _unusable(task, f"tests accept a trivial solution ({name})")
    return QaResult(task.task_id, "usable", "reference passes, trivial solutions fail")


def _unusable(task: TaskSpec, reason: str) -> QaResult:
    return QaResult(task.task_id, "unusable", reason)


# CPython 3.11 keeps ast.parse's recursion count per interpreter, not per thread: two threads
# parsing at once (verifier QA runs tasks in a thread pool) can fail with "SystemError: AST
# constructor recursion depth mismatch", which stopped a 89-task run here. One at a time.
_PARSE_LOCK = threading.Lock()


def trivial_solutions(prompt: str) -> Iterator[tuple[str, str]]:
    """The stub as given, and with a body of `pass` or `return None` — those that parse."""
    stub = prompt if prompt.endswith("\n") else prompt + "\n"
    for name, code in (
        ("stub", stub),
        ("pass", stub + "    pass\n"),
        ("return None", stub + "    return None\n"),
    ):
        try:
            with _PARSE_LOCK:
                ast.parse(code)
        except SyntaxError:
            continue
        yield name, code


def load_task_file(path: Path) -> list[TaskSpec]:
    """HumanEval-format JSONL (`task_id, prompt, canonical_solution, test, entry_point`),
    optionally gzipped; the reference solution is prompt + canonical_solution."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            return [
                _task_from_line(line, number)
                for number, line in enumerate(lines, 1)
                if line.strip()
            ]
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidInput(f"cannot read {path}: {error}") from error


def _task_from_line(line: str, number: int) -> TaskSpec:
    try:
        record = json.loads(line)
        return TaskSpec(
            task_id=str(record["task_id"]),
            prompt=record["prompt"],
            reference_solution=record["prompt"] + record["canonical_solution"],
            tests=record["test"],
            entry_point=record["entry_point"],
        )
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise InvalidInput(f"line {number}: not a HumanEval-format task ({error!r})") from error
