"""Verifier QA runs tasks in a thread pool; on CPython 3.11 two threads in `ast.parse` at once
can fail with "SystemError: AST constructor recursion depth mismatch" (it stopped an 89-task
QA run of the repository benchmark). `trivial_solutions` parses one at a time."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from flywheel.sandbox.qa import trivial_solutions

# A prompt deep enough that a parse spans many thread switches.
PROMPT = (
    "\n".join(f"def helper_{i}(a, b=[1, {{'k': (2, 3)}}]):\n    return [[[a]]]" for i in range(150))
    + "\n\ndef f(x):\n    '''Nested.'''\n    y = "
    + "(" * 60
    + "x"
    + ")" * 60
    + "\n"
)


class Finalised:
    """Garbage whose finaliser runs Python code, so collections switch threads mid-parse."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        [type(self).__name__ for _ in range(3)]


@pytest.fixture
def switch_often() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("switch_often")
def test_threads_find_the_trivial_solutions_at_once_without_a_system_error() -> None:
    errors: list[BaseException] = []
    found: list[int] = []

    def work() -> None:
        try:
            for _ in range(20):
                found.append(len(list(trivial_solutions(PROMPT))))
                [Finalised() for _ in range(50)]
        except SystemError as error:  # the defect; anything else fails the test as itself
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert found == [3] * 8 * 20  # the stub, `pass` and `return None` all parse each time
