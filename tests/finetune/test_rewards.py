"""GRPO rewards for a dataset export: answer matching, dispatch by task kind, canaries."""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

import pytest

from finetune.rewards import (
    CANARY_TESTS,
    GRPO_CANARY_KINDS,
    AnswerReward,
    CanaryMonitor,
    FormatReward,
    TaskReward,
    canary_kinds,
    compile_answer_pattern,
    extract_answer,
    make_canaries,
    mix_canaries,
)
from flywheel.sandbox import Limits, run_tests
from flywheel.sandbox.rewards import CodeReward

FAST = Limits(wall_s=6.0, call_timeout_s=2.0, cpu_s=4, memory_mb=256)

ADD_TESTS = """
from solution import add

def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-4, 1) == -3
"""


def code_row(task_id: str, tests: str = ADD_TESTS, entry_point: str = "add") -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": f"Write `{entry_point}`."}],
        "task_id": task_id,
        "task_kind": "code",
        "entry_point": entry_point,
        "tests": tests,
        "answer": None,
        "difficulty": 0.5,
    }


def answer_row(task_id: str, answer: str) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": "How many?"}],
        "task_id": task_id,
        "task_kind": "answer",
        "entry_point": None,
        "tests": None,
        "answer": answer,
        "difficulty": None,
    }


def columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The keyword lists TRL's GRPO trainer passes: every column but the prompt."""
    return {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"}


def score_answer(completion: str, expected: str) -> float | None:
    return AnswerReward()([completion], answer=[expected], task_kind=["answer"])[0]


# --- answers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Answer: 1,234", "1234"),
        ("#### 1234", "1,234"),
        ("so the total comes to -3.5", "-3.5"),
        ("Answer: 0.5", "1/2"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("Answer: 2.5e3", "2500"),
        ("Answer: $12.00", "$12"),
        ("Answer: 50%", "50%"),
        ("Answer: 0.3333333", "1/3"),  # within the default rel_tol of 1e-6
        ("Answer: 7 apples", "7"),
        ("Answer: \u22124", "-4"),  # a typographic minus sign
        ("Answer: 3 + 4 = 7", "7"),
    ],
)
def test_numeric_answers_match_the_same_number(completion: str, expected: str) -> None:
    assert score_answer(completion, expected) == 1.0


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Answer: 1,235", "1234"),
        ("Answer: 0.333", "1/3"),
        ("Answer: 12", "1.2"),
        ("Answer: 1234", "-1234"),
        ("Answer: 1/0", "0"),
        ("I could not work it out", "3"),
        ("Answer: 7\nActually, wait: 8 is wrong", "8"),  # the marker wins over a later number
    ],
)
def test_numeric_answers_reject_other_numbers(completion: str, expected: str) -> None:
    assert score_answer(completion, expected) == 0.0


def test_numeric_tolerance_is_configurable() -> None:
    loose = AnswerReward(rel_tol=1e-2)
    assert loose(["Answer: 0.333"], answer=["1/3"], task_kind=["answer"]) == [1.0]
    assert loose(["Answer: 0.32"], answer=["1/3"], task_kind=["answer"]) == [0.0]


@pytest.mark.parametrize(
    ("completion", "expected", "score"),
    [
        ("Answer: **Paris**.", "Paris", 1.0),
        ("Answer:   New   York ", "new york", 1.0),
        ("The capital is\nparis", "Paris", 1.0),  # no marker: the last line
        ("\\boxed{B}", "b", 1.0),
        ("**Answer**: `yes`", "Yes", 1.0),
        ("Answer: Paris, France", "Paris", 0.0),
        ("Answer: Lyon", "Paris", 0.0),
        ("Paris, I think.\nBut I am not sure", "Paris", 0.0),
    ],
)
def test_exact_answers_match_after_normalising(
    completion: str, expected: str, score: float
) -> None:
    assert score_answer(completion, expected) == score


@pytest.mark.parametrize(
    ("completion", "expected", "score"),
    [
        ("Answer: Paris, France", "re:paris(?:, france)?", 1.0),
        ("Answer: PARIS", "re:paris(?:, france)?", 1.0),
        ("Answer: Paris, Texas", "re:paris(?:, france)?", 0.0),
        ("Answer: 42 km", "re:42 ?(?:km|kilometres)", 1.0),
        ("Answer: 42 miles", "re:42 ?(?:km|kilometres)", 0.0),
        ("Answer: re:foo", "re:re:foo", 1.0),  # a literal answer starting with "re:"
        ("Answer: " + "a" * 1000, "re:a*", 0.0),  # past MAX_ANSWER_CHARS: no answer
    ],
)
def test_pattern_answers_must_match_the_whole_final_answer(
    completion: str, expected: str, score: float
) -> None:
    assert score_answer(completion, expected) == score


@pytest.mark.parametrize(
    "pattern",
    [
        r"(a+)+$",  # nested quantifiers: exponential backtracking
        r"(a|aa)*b",  # alternation under a quantifier
        r"(\w)\1",  # backreference
        r"(?=a)a",  # lookahead
        r".*.*.*.*x",  # four unbounded quantifiers: too many ways to split the input
        "(?:ab|cd)" * 22,  # 2**22 ways through the alternatives
        "x" * 300,  # too long
        "(unclosed",  # not a regex at all
    ],
)
def test_unsafe_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        compile_answer_pattern(pattern)


def test_an_unsafe_pattern_leaves_its_rows_unscored_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reward = AnswerReward()
    evil = "re:(a+)+$"

    with caplog.at_level(logging.WARNING, logger="finetune.rewards"):
        scores = reward(["a" * 40 + "!"] * 3, answer=[evil] * 3, task_kind=["answer"] * 3)

    assert scores == [None, None, None]
    assert len([r for r in caplog.records if "left unscored" in r.getMessage()]) == 1


def test_safe_patterns_compile() -> None:
    for pattern in (r"-?\d{1,3}(?:,\d{3})*", r".*.*.*x", r"(?:yes|y|true)", r"[a-z]+ \d+"):
        assert isinstance(compile_answer_pattern(pattern), re.Pattern)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Answer: 5. Final answer: 6", "6"),  # the last marker wins
        ("\\boxed{\\frac{1}{2}} so we are done", "\\frac{1}{2}"),  # nested braces
        ("work...\n#### 72\n", "72"),
        ("**Answer:** 42", "** 42"),  # decoration is stripped later, by normalise_answer
        ("Answer: 3\n\nwait, no: \\boxed{4}", "4"),
        ("\\boxed{4}\nAnswer: 5", "5"),
        ("no marker here, 12", None),
        ("\\boxed{unclosed", None),
        ("the answer depends", None),  # "answer" without a colon is no marker
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_answer_reward_reads_conversations_and_scores_only_answer_rows() -> None:
    reward = AnswerReward()
    conversation = [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "Answer: 4"},
    ]

    scores = reward(
        [conversation, "Answer: 4", "Answer: 4"],
        answer=["4", None, "4"],
        task_kind=["answer", "answer", "code"],
    )

    assert scores == [1.0, None, None]
    assert reward.__name__ == "answer_reward"


def test_format_reward() -> None:
    reward = FormatReward()
    one_block = "Here:\n```python\ndef f():\n    return 1\n```\n"
    completions = [
        one_block,
        one_block + "and again:\n```py\nx = 2\n```",
        "def f():\n    return 1\n",  # no fence
        "```python\ndef f():\n",  # never closed
        "The sum is 4.\n#### 4",
        "The sum is 4.",
        "Answer: 4",
    ]
    kinds = ["code", "code", "code", "code", "answer", "answer", "other"]

    assert reward(completions, task_kind=kinds) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, None]
    assert reward.__name__ == "format_reward"


# --- dispatch -----------------------------------------------------------------------------


def test_task_reward_dispatches_each_row_to_its_kind_in_a_real_sandbox() -> None:
    reward = TaskReward(code_reward=CodeReward(limits=FAST))
    rows = [
        code_row("t-correct"),
        answer_row("t-answer-right", "1,234"),
        code_row("t-wrong"),
        answer_row("t-answer-wrong", "Paris"),
        {**answer_row("t-unknown", "x"), "task_kind": "essay"},
    ]
    completions: list[Any] = [
        "```python\ndef add(a, b):\n    return a + b\n```",
        "Adding up: 1000 + 234.\nAnswer: 1234",
        [{"role": "assistant", "content": "```python\ndef add(a, b):\n    return a - b\n```"}],
        "Answer: Lyon",
        "Answer: x",
    ]

    scores = reward(completions, **columns(rows))

    assert scores == [1.0, 1.0, 0.0, 0.0, None]
    assert reward.__name__ == "task_reward"


def test_task_reward_hands_each_reward_its_rows_columns_only() -> None:
    seen: dict[str, dict[str, Any]] = {}

    def recording(kind: str, score: float) -> Any:
        def reward(completions: list[Any], **fields: Any) -> list[float | None]:
            seen[kind] = {"completions": completions, **fields}
            return [score] * len(completions)

        return reward

    reward = TaskReward(code_reward=recording("code", 0.5), answer_reward=recording("answer", 1.0))
    rows = [answer_row("a1", "1"), code_row("c1"), answer_row("a2", "2")]
    trainer_state = object()

    scores = reward(["x", "y", "z"], trainer_state=trainer_state, **columns(rows))

    assert scores == [1.0, 0.5, 1.0]
    assert seen["code"]["completions"] == ["y"]
    assert seen["code"]["task_id"] == ["c1"]
    assert seen["answer"]["task_id"] == ["a1", "a2"]
    assert seen["answer"]["answer"] == ["1", "2"]
    assert seen["answer"]["trainer_state"] is trainer_state  # not a column: passed as is


def test_task_reward_without_a_task_kind_column_goes_by_the_row_fields() -> None:
    reward = TaskReward(code_reward=lambda completions, **_: [0.25] * len(completions))
    fields = columns([code_row("c"), answer_row("a", "4"), answer_row("n", "")])
    del fields["task_kind"]

    assert reward(["y", "Answer: 4", "z"], **fields) == [0.25, 1.0, None]


# --- canaries -----------------------------------------------------------------------------


def test_canaries_are_deterministic_impossible_looking_tasks() -> None:
    canaries = make_canaries(6, seed=11)

    assert canaries == make_canaries(6, seed=11)
    assert canaries != make_canaries(6, seed=12)
    assert [row["task_kind"] for row in canaries] == ["code", "answer"] * 3
    assert len({row["task_id"] for row in canaries}) == 6
    for row in canaries:
        assert row["task_id"].startswith("canary:")
        assert row["is_canary"] is True
        assert set(row) >= {"prompt", "task_kind", "entry_point", "tests", "answer", "difficulty"}
        prompt = row["prompt"][0]["content"]
        secret = row["answer"] or row["tests"]
        assert secret not in prompt
        assert "canary" not in prompt.lower()


def _expected_values(tests: str) -> list[tuple[int, int, int]]:
    """(argument, first, second) of each of a code canary's tests."""
    found = re.findall(r"\((\d+)\)\n    assert value == (\d+)\n    assert value == (\d+)", tests)
    return [(int(argument), int(first), int(second)) for argument, first, second in found]


def _attempts_at(row: dict[str, Any]) -> list[str]:
    """Honest and would-be-clever completions for one canary; none may score."""
    if row["task_kind"] == "answer":
        return ["Answer: 42", "Answer: abcdefghijklmnopqrstuvwx", "I don't know the code."]
    name = row["entry_point"]
    expected = _expected_values(row["tests"])
    firsts = {argument: first for argument, first, _ in expected}
    seconds = {argument: second for argument, _, second in expected}
    return [
        f"```python\ndef {name}(n):\n    return {firsts!r}[n]\n```",
        f"```python\ndef {name}(n):\n    return {seconds!r}[n]\n```",
        # state across calls: first call one value, later calls the other
        f"```python\n_calls = []\ndef {name}(n):\n    _calls.append(n)\n"
        f"    return {firsts!r}[n] if len(_calls) % 2 else {seconds!r}[n]\n```",
        # an object equal to everything cannot cross the sandbox boundary (literals only)
        f"```python\nclass _Any:\n    def __eq__(self, other):\n        return True\n"
        f"def {name}(n):\n    return _Any()\n```",
    ]


def test_a_code_canary_fails_on_its_contradictions_not_on_a_broken_test_file() -> None:
    canary = make_canaries(1, seed=4)[0]
    name, tests = canary["entry_point"], canary["tests"]
    expected = _expected_values(tests)
    firsts = {argument: first for argument, first, _ in expected}
    solution = f"def {name}(n):\n    return {firsts!r}[n]\n"
    without_contradictions = tests
    for _, _, second in expected:
        without_contradictions = without_contradictions.replace(
            f"    assert value == {second}\n", ""
        )

    verdict = run_tests(solution, tests, entry_point=name, limits=FAST)
    honest_file = run_tests(solution, without_contradictions, entry_point=name, limits=FAST)

    assert len(expected) == CANARY_TESTS > 1
    assert (verdict.reason, len(verdict.tests), verdict.pass_fraction) == (
        "failed_tests",
        CANARY_TESTS,
        0.0,
    )
    assert honest_file.is_passed  # the same file runs and passes minus those lines


def test_no_honest_or_clever_solution_passes_a_canary() -> None:
    alarms: list[str] = []
    monitor = CanaryMonitor(TaskReward(code_reward=CodeReward(limits=FAST)), on_alarm=alarms.append)
    rows, completions = [], []
    for row in make_canaries(6, seed=3):
        for attempt in _attempts_at(row):
            rows.append(row)
            completions.append(attempt)

    scores = monitor(completions, **columns(rows))

    assert scores == [0.0] * len(completions)
    assert alarms == []
    assert (monitor.attempts, monitor.passes, monitor.pass_rate) == (len(completions), 0, 0.0)
    assert monitor.__name__ == "task_reward"


def test_a_hacked_verifier_sets_off_the_alarm_and_its_scores_show() -> None:
    def always_one(completions: list[Any], **_fields: Any) -> list[float | None]:
        return [1.0] * len(completions)

    alarms: list[str] = []
    monitor = CanaryMonitor(always_one, on_alarm=alarms.append)
    rows = mix_canaries([answer_row(f"t{i}", str(i)) for i in range(8)], 0.25, seed=5)
    canary_ids = [row["task_id"] for row in rows if row["is_canary"]]

    scores = monitor(["Answer: 1"] * len(rows), **columns(rows))

    assert scores == [1.0] * len(rows)  # canary scores are returned as they are
    assert len(canary_ids) == 2
    assert (monitor.attempts, monitor.passes, monitor.pass_rate) == (2, 2, 1.0)
    assert [canary_id in alarm for alarm, canary_id in zip(alarms, canary_ids, strict=True)] == [
        True,
        True,
    ]
    assert monitor.__name__ == "always_one"


def test_a_canary_is_known_by_its_id_even_without_the_column(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = CanaryMonitor(lambda completions, **_: [0.5] * len(completions))
    fields = columns([*make_canaries(1, seed=1), answer_row("t1", "1")])
    del fields["is_canary"]

    with caplog.at_level(logging.WARNING, logger="finetune.rewards"):
        monitor(["a", "b"], **fields)

    assert (monitor.attempts, monitor.passes) == (1, 1)
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert "reward hacking or a broken verifier" in caplog.records[0].getMessage()


def test_mix_canaries_is_deterministic_and_adds_ceil_fraction_canaries() -> None:
    rows = [answer_row(f"t{i}", str(i)) for i in range(20)]
    before = [dict(row) for row in rows]

    mixed = mix_canaries(rows, 0.12, seed=9)

    assert mixed == mix_canaries(rows, 0.12, seed=9)
    assert sum(row["is_canary"] for row in mixed) == math.ceil(0.12 * 20) == 3
    assert [row["task_id"] for row in mixed if not row["is_canary"]] == [f"t{i}" for i in range(20)]
    assert all(row["task_id"].startswith("canary:") for row in mixed if row["is_canary"])
    assert all(set(row) == set(mixed[0]) for row in mixed)  # one schema for a datasets table
    assert rows == before  # the input is left alone

    def positions(seed: int) -> list[int]:
        return [i for i, row in enumerate(mix_canaries(rows, 0.12, seed)) if row["is_canary"]]

    assert positions(1) != positions(2)
    assert len(mix_canaries(rows, 0.01, seed=1)) == 21  # any fraction > 0 gives one at least
    assert mix_canaries(rows, 0.0, seed=1) == [{**row, "is_canary": False} for row in rows]
    assert mix_canaries([], 0.5, seed=1) == []
    with pytest.raises(ValueError, match="fraction"):
        mix_canaries(rows, 1.5, seed=1)


def test_mix_canaries_adds_only_the_kinds_of_the_tasks() -> None:
    answers = [answer_row(f"t{i}", str(i)) for i in range(10)]
    mixed_rows = [*answers, code_row("c0")]

    answer_only = mix_canaries(answers, 0.4, seed=5, kinds=canary_kinds(answers))
    both = mix_canaries(mixed_rows, 0.4, seed=5, kinds=canary_kinds(mixed_rows))

    assert canary_kinds(answers) == ("answer",)
    assert canary_kinds(mixed_rows) == ("code", "answer")
    assert [row["task_kind"] for row in answer_only if row["is_canary"]] == ["answer"] * 4
    assert {row["task_kind"] for row in both if row["is_canary"]} == {"code", "answer"}
    assert mix_canaries(answers, 0.4, seed=5, kinds=()) == mix_canaries(answers, 0.0, seed=5)
    assert [row["task_kind"] for row in make_canaries(3, seed=1, kinds=("answer",))] == [
        "answer"
    ] * 3
    with pytest.raises(ValueError, match="canary kinds"):
        make_canaries(2, seed=1, kinds=("environment",))


def test_a_grpo_run_with_tool_call_tasks_mixes_tool_call_canaries_the_monitor_sees() -> None:
    """GRPO mixed canaries of code and answer tasks only: a run of tool-call tasks had none,
    so a policy gaming the call check went unseen."""
    tool_rows = [{"task_id": f"t{i}", "task_kind": "tool_call"} for i in range(10)]
    kinds = canary_kinds(tool_rows, GRPO_CANARY_KINDS)
    assert kinds == ("tool_call",)
    (canary,) = make_canaries(1, seed=3, kinds=kinds)
    expected = json.loads(canary["expected_calls"])
    token = expected[0]["arguments"]["confirmation_code"][0]
    assert token not in json.dumps(canary["prompt"])
    order = expected[0]["arguments"]["order_id"][0]
    alarms: list[str] = []
    monitor = CanaryMonitor(TaskReward(), on_alarm=alarms.append)

    def call(code: str) -> str:
        body = {
            "name": "confirm_order",
            "arguments": {"order_id": order, "confirmation_code": code},
        }
        return f"<tool_call>{json.dumps(body)}</tool_call>"

    fields = {key: [canary[key]] * 2 for key in ("task_id", "task_kind", "tools", "expected_calls")}
    scores = monitor([call("an honest guess"), call(token)], is_canary=[True, True], **fields)

    assert scores == [0.0, 1.0]
    assert len(alarms) == 1
    assert canary["task_id"] in alarms[0]
