"""Verifiable tasks from a snapshot: a tested function, its program and its hidden tests.

A function becomes a task when at least one of the repository's tests calls it and can run
in the sandbox; the tests that call it are its hidden tests. Which ones run is decided
statically here; whether the task is sound (the reference passes every time, the stub
fails) is verifier QA's call, made before a task is marked usable.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from flywheel.redaction import find_spans
from flywheel.signals.candidates import Provenance, TaskCandidate
from ingest.framework import Rejected
from ingest.repo.codebase import Codebase, Symbol
from ingest.repo.discover import SOLUTION, FoundTest, discover_tests
from ingest.repo.program import Program, build_program, check_returns


@dataclass(frozen=True)
class Origin:
    """Where tasks come from, for their provenance."""

    repo: str  # the repository's name
    revision: str  # a short commit id, or a content hash for a plain directory
    group_key: str  # one repository never straddles train and eval
    names: tuple[str, ...] = ()  # people the source names (commit authors)

    def provenance(self, path: str, function: str) -> Provenance:
        return Provenance(
            source_kind="repository",
            source_ref=f"{self.repo}@{self.revision}:{path}::{function}",
            group_key=self.group_key,
            names=self.names,
        )


class RepoTests:
    """The snapshot's tests, looked up by the source function they call."""

    def __init__(self, codebase: Codebase, paths: list[str] | None = None) -> None:
        self.tests = list(discover_tests(codebase, paths))

    def for_function(self, module: str, name: str) -> list[FoundTest]:
        """The tests that use `module.name` (whatever the tests found it to be)."""
        return [
            test
            for test in self.tests
            if any(s.module == module and s.name == name for s in test.targets)
        ]


def function_task(
    codebase: Codebase, index: RepoTests, module: str, name: str, origin: Origin
) -> TaskCandidate:
    """The task for module-level function `module.name`, or Rejected saying why there is none."""
    check_returns(codebase, module, name)  # before its tests, which cannot run for that either
    tests = runnable(without_pii(index.for_function(module, name), origin.names), name)
    program = program_for(codebase, module, name, tests)
    check_no_pii(program.reference, f"the code of {name}", origin.names)
    return task(origin, codebase.path_of_module[module], name, program.prompt, program, tests)


def without_pii(tests: list[FoundTest], names: Sequence[str] = ()) -> list[FoundTest]:
    """The tests, those holding a value redaction would replace left out (`holds_pii`).

    The signal store redacts a task's code as any text (names in free text excepted, the
    people its source names included: `names`, the commit authors): an
    email or a card number a test checks would become a surrogate, another value, and the
    test would fail, or pass for another reason. So such a test is not kept, and what it
    holds is never stored. Measured on five held-out libraries: 13 of 49 validators tasks
    failed verifier QA after redaction, none of them before it.
    """
    return [_checked_for_pii(test, names) if test.reason is None else test for test in tests]


def _checked_for_pii(test: FoundTest, names: Sequence[str]) -> FoundTest:
    kinds = pii_kinds("\n".join([test.code, *(code for _, code in test.setup)]), names)
    if not kinds:
        return test
    return replace(test, reason="holds_pii", detail=f"redaction would replace its {kinds}")


def check_no_pii(code: str, what: str, names: Sequence[str] = ()) -> None:
    """Rejected (`holds_pii`) if redaction would change `code`."""
    kinds = pii_kinds(code, names)
    if kinds:
        raise Rejected("holds_pii", f"redaction would replace the {kinds} in {what}")


def pii_kinds(code: str, names: Sequence[str] = ()) -> str:
    """What the store's redaction of code finds in it (`flywheel.signals.store` redacts code
    with the source's `names` and no free-text names): "EMAIL, CARD", "" for nothing."""
    found = find_spans(code, names=names, people=False)
    return ", ".join(sorted({kind for _, _, kind in found}))


def runnable(tests: list[FoundTest], name: str) -> list[FoundTest]:
    """The tests that can run in the sandbox; Rejected with the commonest reason if none."""
    usable = [test for test in tests if test.reason is None]
    if usable:
        return usable
    if not tests:
        raise Rejected("no_tests", f"no test of the repository calls {name}")
    reasons = Counter(test.reason for test in tests)
    reason = reasons.most_common(1)[0][0] or "no_tests"
    example = next(test for test in tests if test.reason == reason)
    raise Rejected(reason, f"{len(tests)} tests call {name}; {example.origin}: {example.detail}")


def program_for(codebase: Codebase, module: str, name: str, tests: list[FoundTest]) -> Program:
    """The program, keeping the other functions the tests call as context."""
    extra = {symbol for test in tests for symbol in test.targets}
    return build_program(codebase, module, name, extra - {Symbol(module, name, "function")})


def task(
    origin: Origin, path: str, name: str, prompt: str, program: Program, tests: list[FoundTest]
) -> TaskCandidate:
    return TaskCandidate(
        provenance=origin.provenance(path, name),
        prompt=prompt,
        entry_point=name,
        reference_solution=program.reference,
        hidden_tests=render_tests(tests),
    )


def render_tests(tests: list[FoundTest]) -> str:
    """One test module for the sandbox: `import solution`, the statements the tests need,
    then the tests. A test whose setup would clash with an earlier one's (two files both
    defining `CASES`) is left out; test names are made unique."""
    setup: list[str] = []
    bound: dict[str, str] = {}
    functions: list[str] = []
    names: Counter[str] = Counter()
    for test in tests:
        if any(bound.get(name, text) != text for names_, text in test.setup for name in names_):
            continue
        for names_, text in test.setup:
            bound.update(dict.fromkeys(names_, text))
            if text not in setup:
                setup.append(text)
        names[test.name] += 1
        code = test.code
        if names[test.name] > 1:
            code = code.replace(f"def {test.name}(", f"def {test.name}_{names[test.name]}(", 1)
        functions.append(code)
    imports = [f"import {SOLUTION}"]
    if re.search(r"\bpytest\.", "\n".join(functions)) and "import pytest" not in setup:
        imports.insert(0, "import pytest")
    return "\n\n\n".join(["\n".join([*imports, *setup]), *functions]) + "\n"
