"""Hostile and broken environments, and bad tool calls, against the real bwrap sandbox: each is
an "Error: ..." tool message or an episode ended with its reason, never a hang or a crashed
caller, and a bad task is refused by QA with the reason."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from flywheel.errors import EnvironmentFailed
from flywheel.sandbox import Limits
from flywheel.sandbox.environment import (
    MAX_RESULT_CHARS,
    EnvironmentSession,
    check_environment_task,
    final_state_reward,
    open_environment,
)

FAST = Limits(wall_s=30.0, call_timeout_s=1.5, cpu_s=10, memory_mb=256)

HOSTILE = """
import os, sys, time

class Thing:
    pass

class BadStr:
    def __str__(self):
        raise RuntimeError("no text for you")

class Tools:
    def __init__(self):
        self.count = 0

    def ok(self) -> str:
        self.count += 1
        return "fine"

    def add(self, a: int, b: int = 0) -> int:
        return a + b

    def raises(self):
        raise ValueError("the tool broke")

    def exits(self):
        sys.exit(3)

    def dies(self):
        os._exit(7)

    def loops(self):
        while True:
            pass

    def sleeps(self):
        time.sleep(60)

    def burns(self, cpu_s: float):
        until = time.process_time() + cpu_s
        while time.process_time() < until:
            pass
        return "burnt"

    def hogs(self):
        return len(bytearray(2 * 1024 ** 3))

    def fans_out(self):
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                hog = bytearray(150 * 2 ** 20)
                hog[::4096] = b"x" * len(range(0, len(hog), 4096))
                time.sleep(2)
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        return "survived"

    def huge(self):
        return "x" * 10_000_000

    def chatters(self):
        for _ in range(10_000):
            print("x" * 100)
        return "said it all"

    def an_object(self):
        return Thing()

    def a_set(self):
        return {3}

    def odd_dict(self):
        return {"when": {1, 2}}

    def bad_str(self):
        return BadStr()

    def hoard(self):
        self.heap = "y" * (17 * 1024 * 1024)
        return "hoarded"

    def keep_object(self):
        self.thing = Thing()
        return "kept"
"""


def spec(source: str = HOSTILE, classes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"source": source, "classes": classes or {"Tools": {}}, "ground_truth": []}


@pytest.fixture
def session() -> Iterator[EnvironmentSession]:
    with open_environment(spec(), limits=FAST) as started:
        assert started.ended is None, started.ended
        yield started


def assert_goes_on(session: EnvironmentSession) -> None:
    assert session.ended is None
    assert session.call("ok", {}).content == "fine"


def assert_ended(session: EnvironmentSession, reason: str) -> None:
    assert session.ended is not None
    assert session.ended.startswith(reason + ":"), session.ended
    after = session.call("ok", {})
    assert after.is_error
    assert after.content.startswith("Error: the environment has ended (" + reason)
    with pytest.raises(EnvironmentFailed, match=reason):
        session.state()


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("raises", {}, "Error: ValueError: the tool broke"),
        ("exits", {}, "Error: SystemExit: 3"),
        ("nothing_like_it", {}, "Error: there is no tool named 'nothing_like_it'"),
        ("__init__", {}, "Error: there is no tool named '__init__'"),
        ("add", {"a": 1, "c": 2}, "Error: bad arguments for add: got an unexpected keyword"),
        ("add", {}, "Error: bad arguments for add: missing a required argument: 'a'"),
        ("add", {"a": "1", "b": 2}, "Error: TypeError: can only concatenate str"),
        ("add", {"self": 1, "a": 1}, "Error: bad arguments for add"),
        ("bad_str", {}, "Error: RuntimeError: no text for you"),
    ],
)
def test_a_failing_call_is_an_error_message_and_the_episode_goes_on(
    session: EnvironmentSession, name: str, arguments: dict[str, Any], message: str
) -> None:
    result = session.call(name, arguments)
    assert result.is_error
    assert result.content.startswith(message), result.content
    assert_goes_on(session)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"a": 1', "Error: the arguments of add must be an object, not str"),  # malformed JSON
        (None, "Error: the arguments of add must be an object, not NoneType"),
        ({"a": object()}, "Error: the arguments are not plain values"),
        ({"a": "z" * (2 * 1024 * 1024)}, "Error: the arguments are over 1048576 bytes"),
    ],
)
def test_arguments_that_cannot_be_sent_are_refused_here(
    session: EnvironmentSession, arguments: Any, message: str
) -> None:
    result = session.call("add", arguments)
    assert result.is_error
    assert result.content.startswith(message), result.content
    assert session.steps == 0  # never reached the environment
    assert_goes_on(session)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("an_object", "<environment.Thing object at 0x"),
        ("a_set", "{3}"),
        ("odd_dict", "{'when': {1, 2}}"),  # no JSON for a set: str(), as BFCL falls back
    ],
)
def test_values_that_are_not_json_come_back_as_text(
    session: EnvironmentSession, name: str, expected: str
) -> None:
    result = session.call(name, {})
    assert not result.is_error
    assert result.content.startswith(expected)


def test_a_huge_result_is_cut(session: EnvironmentSession) -> None:
    result = session.call("huge", {})
    assert not result.is_error
    assert result.content.startswith("x" * MAX_RESULT_CHARS + "... [cut: ")
    assert len(result.content) < MAX_RESULT_CHARS + 100
    assert_goes_on(session)


def test_a_state_that_is_not_plain_is_compared_by_structure(session: EnvironmentSession) -> None:
    """An object is its class name and public attributes, never its repr (an address here,
    which would differ run to run)."""
    session.call("keep_object", {})
    state = session.state()["Tools"]
    assert state["thing"] == {"__object__": "Thing"}
    assert state["count"] == 0


@pytest.mark.parametrize("name", ["loops", "sleeps"])
def test_a_call_that_never_answers_ends_the_episode_in_its_wall_clock(
    session: EnvironmentSession, name: str
) -> None:
    started = time.monotonic()
    result = session.call(name, {})
    assert time.monotonic() - started < FAST.call_timeout_s + 1.0
    assert result.is_error
    assert_ended(session, "timeout")
    assert final_state_reward(spec(), None) == 0.0


def test_an_episode_that_spends_its_cpu_budget_ends() -> None:
    """3 CPU-seconds, of which the environment is told at 2 (then killed at 3)."""
    limits = Limits(wall_s=30, call_timeout_s=8, cpu_s=3)
    with open_environment(spec(), limits=limits) as session:
        first = session.call("burns", {"cpu_s": 1.2})  # each call is under its wall clock...
        second = session.call("burns", {"cpu_s": 1.2})  # ... but not the episode under its CPU
        assert first.content == "burnt"
        assert second.is_error
        assert_ended(session, "cpu")


def test_a_memory_error_ends_the_episode(session: EnvironmentSession) -> None:
    result = session.call("hogs", {})
    assert result.is_error
    assert_ended(session, "memory")


def test_processes_over_the_memory_budget_end_the_episode(session: EnvironmentSession) -> None:
    """Three children of 150 MB each under a 256 MB budget: the kernel kills one, and even if
    the tool then answers, the episode's state can no longer be trusted."""
    result = session.call("fans_out", {})
    assert result.is_error, result.content
    assert_ended(session, "memory")


def test_an_environment_that_exits_ends_the_episode(session: EnvironmentSession) -> None:
    assert session.call("dies", {}).is_error
    assert_ended(session, "crash")


def test_an_environment_that_prints_too_much_ends_the_episode(
    session: EnvironmentSession,
) -> None:
    assert session.call("chatters", {}).is_error
    assert_ended(session, "output_limit")


def test_a_state_too_large_to_cross_ends_the_episode(session: EnvironmentSession) -> None:
    assert session.call("hoard", {}).content == "hoarded"
    with pytest.raises(EnvironmentFailed, match="output_limit"):
        session.state()
    assert_ended(session, "output_limit")


@pytest.mark.parametrize(
    ("source", "classes", "reason"),
    [
        ("import mpmath\nclass Tools: pass\n", None, "ModuleNotFoundError: No module named"),
        ("class Tools(:\n", None, "SyntaxError"),
        ("raise RuntimeError('boom')\n", None, "RuntimeError: boom"),
        ("class Other: pass\n", None, "NameError: the environment's source defines no class"),
        ("class Tools:\n    def __init__(self, x): pass\n", None, "TypeError"),
        (
            "class Tools:\n    def _load_scenario(self, config):\n        config['missing']\n",
            {"Tools": {}},
            "KeyError: 'missing'",
        ),
    ],
)
def test_an_environment_that_does_not_load_is_an_ended_episode_and_unusable(
    source: str, classes: dict[str, Any] | None, reason: str
) -> None:
    with open_environment(spec(source, classes), limits=FAST) as session:
        assert session.ended is not None
        assert session.ended.startswith("load_error: "), session.ended
        assert reason in session.ended
        assert session.call("ok", {}).is_error
    qa = check_environment_task(spec(source, classes), limits=FAST)
    assert qa.status == "unusable"
    assert qa.reason.startswith("the environment does not start: load_error")
    assert reason in qa.reason


def test_a_loader_that_loops_ends_the_episode_in_its_wall_clock() -> None:
    source = "class Tools:\n    def _load_scenario(self, config):\n        while True: pass\n"
    started = time.monotonic()
    with open_environment(spec(source), limits=FAST) as session:
        assert session.ended is not None
        assert session.ended.startswith("timeout: start did not answer")
    assert time.monotonic() - started < FAST.call_timeout_s + 1.5


def test_qa_refuses_a_ground_truth_that_crashes_the_environment() -> None:
    task = {**spec(), "ground_truth": [[{"name": "ok"}, {"name": "dies", "arguments": {}}]]}
    qa = check_environment_task(task, limits=FAST)
    assert qa.status == "unusable"
    assert qa.reason.startswith("ground-truth call 2 (dies) failed: Error: the environment has")
    assert "crash" in qa.reason


def test_a_task_with_broken_ground_truth_scores_zero_rather_than_raising() -> None:
    task = {**spec(), "ground_truth": [[{"name": "raises", "arguments": {}}]]}
    assert final_state_reward(task, {"Tools": {"count": 0}}) == 0.0


def test_sessions_after_a_hostile_one_start_clean() -> None:
    with open_environment(spec(), limits=FAST) as hostile:
        hostile.call("loops", {})
    with open_environment(spec(), limits=FAST) as honest:
        assert honest.call("ok", {}).content == "fine"
        assert honest.state() == {"Tools": {"count": 1}}
