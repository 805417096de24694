"""The reward function TRL's GRPO trainer calls: honest scores, one hostile sample contained."""

from __future__ import annotations

import time

from flywheel.sandbox import Limits
from flywheel.sandbox.rewards import CodeReward, completion_code

TESTS = """
from solution import add

def test_one():
    assert add(1, 1) == 2

def test_two():
    assert add(2, 3) == 5

def test_zero():
    assert add(0, 0) == 0
"""


def test_scores_are_fractions_of_tests_passed() -> None:
    reward = CodeReward(limits=Limits(wall_s=5, call_timeout_s=2))
    completions = [
        "```python\ndef add(a, b):\n    return a + b\n```",
        "def add(a, b):\n    return a * b\n",  # right only for (0, 0)... and (2, 2)
        [{"role": "assistant", "content": "Here:\n```py\ndef add(a, b):\n    return 2\n```"}],
        "no code at all",
    ]

    scores = reward(completions, tests=[TESTS] * 4, entry_point=["add"] * 4)

    assert scores == [1.0, 1 / 3, 1 / 3, 0.0]
    assert reward.__name__ == "code_reward"  # what TRL logs the reward under


def test_all_or_nothing_and_unverifiable_tasks() -> None:
    reward = CodeReward(mode="all_or_nothing")

    scores = reward(
        ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return 0\n", "x"],
        tests=[TESTS, TESTS, None],
        entry_point=["add", "add", None],
    )

    assert scores == [1.0, 0.0, None]


def test_one_hostile_sample_cannot_stall_the_batch() -> None:
    reward = CodeReward(limits=Limits(wall_s=3, call_timeout_s=1), max_workers=4)
    good = "def add(a, b):\n    return a + b\n"
    hostile = "import time\ndef add(a, b):\n    time.sleep(1e9)\n"
    started = time.monotonic()

    scores = reward([good, hostile, good, good], tests=[TESTS] * 4, entry_point=["add"] * 4)

    assert scores == [1.0, 0.0, 1.0, 1.0]
    assert time.monotonic() - started < 8


def test_completion_code_takes_the_last_fence() -> None:
    text = "first\n```python\nx = 1\n```\nthen\n```python\ny = 2\n```\n"
    assert completion_code(text) == "y = 2\n"
    assert completion_code("plain = True") == "plain = True"
