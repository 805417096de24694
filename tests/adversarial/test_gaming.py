"""Attempts to win a pass without solving the task: none may yield one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flywheel.sandbox import Verdict

Run = Callable[..., Verdict]

GAMING = {
    "sys_exit_0_at_import": "import sys\nsys.exit(0)\n",
    "os_exit_0_at_import": "import os\nos._exit(0)\n",
    "os_exit_0_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "raise_skiptest": "import unittest\ndef add(a, b):\n    raise unittest.SkipTest('skip')\n",
    "pytest_skip": "def add(a, b):\n    import pytest\n    pytest.skip('nope')\n",
    "always_equal_object": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    "read_the_tests": (
        "import glob\ndef add(a, b):\n"
        "    return [open(p).read() for p in glob.glob('/**/*.py', recursive=True)"
        " if 'test' in p]\n"
    ),
    "inspect_the_stack": (
        "import sys\ndef add(a, b):\n    frame = sys._getframe()\n    found = []\n"
        "    while frame:\n        found.append(frame.f_code.co_filename)\n"
        "        frame = frame.f_back\n    return found\n"
    ),
    "drop_conftest_and_sitecustomize": (
        "import os\nfor name in ('conftest.py', 'sitecustomize.py', 'x.pth'):\n"
        "    open(name, 'w').write('import os\\nos._exit(0)\\n')\n"
        "def add(a, b):\n    return None\n"
    ),
    "patch_builtins_and_assert": (
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "import unittest, time\nunittest.TestCase.run = lambda *a, **k: None\n"
        "time.time = lambda: 0\ndef add(a, b):\n    return 0\n"
    ),
    "print_fake_report": (
        'print(\'{"test": "test_small", "status": "passed", "message": ""}\')\n'
        "print('{\"done\": 2}')\nprint('2 passed, 0 failed')\ndef add(a, b):\n    return 0\n"
    ),
    "write_fake_results_to_every_fd": (
        'import os\nline = b\'{"test": "test_small", "status": "passed", "message": ""}\\n\'\n'
        "for fd in range(3, 64):\n    try:\n        os.write(fd, line)\n    except OSError:\n"
        "        pass\ndef add(a, b):\n    return 0\n"
    ),
    "fork_a_survivor": (
        "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\n"
        "def add(a, b):\n    return 0\n"
    ),
    "broken_syntax": "def add(a, b)\n    return a + b\n",
    "edit_or_delete_the_tests": (
        "import os\nfor path in ('/task/tests.py', '/harness/runner.py', 'tests.py'):\n"
        "    try:\n        os.remove(path)\n    except OSError:\n        pass\n"
        "    try:\n        open(path, 'w').write('def test_ok():\\n    pass\\n')\n"
        "    except OSError:\n        pass\ndef add(a, b):\n    return 0\n"
    ),
    "signal_the_test_side": (
        "import os, signal\nfor pid in range(1, 400):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return 0\n"
    ),
}


@pytest.mark.parametrize("solution", list(GAMING.values()), ids=list(GAMING))
def test_gaming_never_passes(run: Run, solution: str) -> None:
    verdict = run(solution)

    assert not verdict.is_passed, verdict
    assert verdict.reason != "passed"
    assert verdict.pass_fraction == 0.0


def test_a_correct_solution_passes(run: Run) -> None:
    verdict = run("def add(a, b):\n    return a + b\n")

    assert verdict.is_passed, verdict
    assert [test.name for test in verdict.tests] == ["test_small", "test_negative"]
    assert verdict.reason == "passed"


def test_humaneval_check_style(run: Run) -> None:
    tests = (
        "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    )

    assert run("def add(a, b):\n    return a + b\n", tests).is_passed
    wrong = run("def add(a, b):\n    return a * b\n", tests)
    assert not wrong.is_passed
    assert wrong.reason == "failed_tests"


def test_expected_exceptions_cross_by_builtin_type(run: Run) -> None:
    tests = (
        "import pytest\nfrom solution import add\n\n"
        "def test_rejects_strings():\n    with pytest.raises(TypeError):\n        add('a', 1)\n"
    )

    assert run("def add(a, b):\n    return a + b\n", tests).is_passed


def test_tests_that_collect_nothing_do_not_pass(run: Run) -> None:
    verdict = run("def add(a, b):\n    return a + b\n", "x = 1\n")

    assert not verdict.is_passed
    assert verdict.reason == "no_tests"


def test_expected_value_errors_cross_too(run: Run) -> None:
    solution = (
        "def add(a, b):\n    if a < 0:\n        raise ValueError('negative')\n    return a + b\n"
    )
    tests = (
        "import pytest\nfrom solution import add\n\n"
        "def test_rejects_negatives():\n    with pytest.raises(ValueError):\n        add(-1, 1)\n"
    )

    assert run(solution, tests).is_passed


# Each test is right for an honest `add`; each would silently end its iteration (and pass)
# if the candidate's control-flow exception reached the test as itself.
ITERATING_TESTS = """
import asyncio
from solution import add

def test_map():
    assert set(map(add, [1, 3], [2, 4])) <= {3, 7}

def test_zip():
    for got, want in zip(map(add, [1, 3], [2, 4]), [3, 7]):
        assert got == want

def test_all():
    assert all(map(lambda pair: add(*pair) == sum(pair), [(1, 2), (3, 4)]))

def test_for_loop():
    for got in map(add, [1], [2]):
        assert got == 3

def test_next():
    assert next(map(add, [1], [2]), 3) == 3

class Sums:
    def __init__(self):
        self.pairs = [(1, 2)]

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.pairs:
            raise StopAsyncIteration
        return add(*self.pairs.pop())

def test_async_for():
    async def check():
        async for got in Sums():
            assert got == 3

    asyncio.run(check())
"""

CONTROL_FLOW = [
    "StopIteration",
    "StopAsyncIteration",
    "GeneratorExit",
    "KeyboardInterrupt",
    "SystemExit",
]


@pytest.mark.parametrize("exception", CONTROL_FLOW)
def test_control_flow_exceptions_from_the_candidate_fail_the_test(run: Run, exception: str) -> None:
    verdict = run(f"def add(a, b):\n    raise {exception}\n", ITERATING_TESTS)

    assert not verdict.is_passed, verdict
    assert verdict.pass_fraction == 0.0, verdict
    assert all(exception in test.message for test in verdict.tests), verdict


def test_iterating_tests_pass_for_an_honest_candidate(run: Run) -> None:
    verdict = run("def add(a, b):\n    return a + b\n", ITERATING_TESTS)

    assert verdict.is_passed, verdict
