"""Whole-run accounting: a fraction of tests passed is over every test collected, so stalling
on the tests a candidate cannot pass earns nothing for them."""

from __future__ import annotations

from finetune.rewards import make_canaries
from flywheel.sandbox import Limits, run_tests
from flywheel.sandbox.rewards import CodeReward

TESTS = """
from solution import add

def test_one():
    assert add(1, 1) == 2

def test_two():
    assert add(2, 3) == 5

def test_three():
    assert add(4, 4) == 8

def test_four():
    assert add(0, 7) == 7
"""
LIMITS = Limits(wall_s=3.0, call_timeout_s=1.4)

# Right on the first test only; on the others it sleeps just under the call timeout, then
# answers wrong, so the wall clock ends the run before the last tests report.
SLEEPER = (
    "import time\ndef add(a, b):\n    if (a, b) == (1, 1):\n        return 2\n"
    "    time.sleep(1.3)\n    return -1\n"
)
# Right on the first test only; on the others it starts a reply and trickles it a byte at a
# time on every descriptor it holds, so that no single wait for a chunk ever runs out.
TRICKLER = """
import os, time
def add(a, b):
    if (a, b) == (1, 1):
        return 2
    for fd in range(3, 32):
        try:
            os.write(fd, b'{"value": "')
        except OSError:
            pass
    while True:
        for fd in range(3, 32):
            try:
                os.write(fd, b" ")
            except OSError:
                pass
        time.sleep(0.2)
"""


def test_stalling_earns_nothing_for_the_tests_it_stalls_on() -> None:
    reward = CodeReward(limits=LIMITS)

    scores = reward([SLEEPER, TRICKLER], tests=[TESTS] * 2, entry_point=["add"] * 2)

    assert scores == [0.25, 0.25]


def test_tests_that_never_reported_are_failed_in_the_verdict() -> None:
    verdict = run_tests(SLEEPER, TESTS, entry_point="add", limits=LIMITS)

    assert verdict.reason == "timeout"
    assert [test.name for test in verdict.tests] == [
        "test_one",
        "test_two",
        "test_three",
        "test_four",
    ]
    assert [test.status for test in verdict.tests] == ["passed"] + ["failed"] * 3
    assert "did not report" in verdict.tests[-1].message
    assert verdict.pass_fraction == 0.25


def test_canaries_of_several_tests_pay_a_staller_nothing() -> None:
    (canary,) = make_canaries(1, seed=11, kinds=("code",))
    name = canary["entry_point"]
    stall_after_one = (
        f"import time\n_calls = []\ndef {name}(n):\n    _calls.append(n)\n"
        "    if len(_calls) > 1:\n        time.sleep(1.3)\n    return 0\n"
    )

    verdict = run_tests(stall_after_one, canary["tests"], entry_point=name, limits=LIMITS)
    (score,) = CodeReward(limits=LIMITS)(
        [stall_after_one], tests=[canary["tests"]], entry_point=[name]
    )

    assert len(verdict.tests) > 1
    assert score == 0.0
