"""What a sandboxed test run found, decided by the trusted parent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Reason = Literal[
    "passed",
    "failed_tests",
    "no_tests",
    "timeout",
    "memory",
    "output_limit",
    "crash",
    "harness_error",
]


@dataclass(frozen=True)
class TestResult:
    name: str
    status: Literal["passed", "failed"]
    message: str = ""


@dataclass(frozen=True)
class Verdict:
    """`is_passed` only when every collected test reported a pass and the run finished."""

    is_passed: bool
    reason: Reason
    tests: list[TestResult] = field(default_factory=list)
    duration_s: float = 0.0
    peak_memory_mb: float = 0.0
    detail: str = ""

    @property
    def pass_fraction(self) -> float:
        if not self.tests:
            return 0.0
        return sum(test.status == "passed" for test in self.tests) / len(self.tests)
