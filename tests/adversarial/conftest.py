"""Hostile candidates against the real bwrap sandbox. Each must be contained and fail."""

from __future__ import annotations

import pytest

from flywheel.sandbox import Limits, Verdict, run_tests

TESTS = """
from solution import add

def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-4, 1) == -3
"""

FAST = Limits(wall_s=6.0, call_timeout_s=2.0, cpu_s=4, memory_mb=256)


@pytest.fixture
def run() -> object:
    def run(solution: str, tests: str = TESTS, limits: Limits = FAST) -> Verdict:
        return run_tests(solution, tests, entry_point="add", limits=limits)

    return run
