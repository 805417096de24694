"""Run a candidate solution against tests: two sandboxes, literal values between them.

The candidate runs alone, in a fresh child of a warm zygote with namespaces of its own, and
only answers calls; the tests run in another sandbox (a warm runner, see warm.py) and call it
through a proxy; per-test results reach this (trusted) process on a pipe that only the test
side holds. The verdict is decided here, from those results — never from an exit code, never
from anything the candidate printed. (The *reason* label may use what the candidate printed,
e.g. a MemoryError; a pass never does.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flywheel.errors import InvalidInput
from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import check_available, is_unsafe_local, reap_orphans
from flywheel.sandbox.verdict import Reason, TestResult, Verdict
from flywheel.sandbox.warm import RUNNERS, ZYGOTES, WarmSandbox

REPORT_WAIT_S = 2.0  # how long a warm sandbox may take to report a finished job
# The sandboxes kill a job this long after our own wall clock: ours decides, theirs is a backstop.
BACKSTOP_S = 1.0


@dataclass
class _Output:
    """Drains what the candidate prints, keeping at most `cap` bytes."""

    fd: int
    cap: int
    on_over_cap: Callable[[], None]
    data: bytearray = field(default_factory=bytearray)
    is_over_cap: bool = False

    def drain(self) -> None:
        for chunk in iter(lambda: os.read(self.fd, 65536), b""):
            if len(self.data) + len(chunk) > self.cap:
                self.is_over_cap = True
                self.on_over_cap()
                return
            self.data += chunk


def run_tests(
    solution: str,
    tests: str,
    *,
    entry_point: str,
    limits: Limits | None = None,
    language: str = "python",
) -> Verdict:
    """Run `tests` (pytest-style `test_*` functions and/or HumanEval `check(candidate)`)
    against `solution`, whose function `entry_point` the tests call."""
    if language != "python":
        raise InvalidInput(f"language {language!r} is not supported yet (python is)")
    if not is_unsafe_local(warn=False):
        check_available()  # fail closed, even with warm sandboxes at hand
    limits = limits or Limits()
    started = time.monotonic()
    request_r, request_w = os.pipe()
    response_r, response_w = os.pipe()
    results_r, results_w = os.pipe()
    output_r, output_w = os.pipe()
    try:
        zygote, runner = _start(
            solution, tests, entry_point, limits,
            candidate_fds=(request_r, response_w, output_w),
            runner_fds=(request_w, response_r, results_w),
        )  # fmt: skip
    except BaseException:
        os.close(results_r)
        os.close(output_r)
        raise
    finally:  # the sandboxes hold their own copies now
        for fd in (request_r, request_w, response_r, response_w, results_w, output_w):
            os.close(fd)
    output = _Output(output_r, limits.max_output_bytes, on_over_cap=zygote.sandbox.kill_inside)
    drain = threading.Thread(target=output.drain, daemon=True)
    drain.start()
    lines, timed_out = _read_results(results_r, started + limits.wall_s)
    is_clean = not timed_out and not output.is_over_cap
    zygote_report = zygote.read_report(REPORT_WAIT_S) if is_clean else None
    runner_report = runner.read_report(REPORT_WAIT_S) if is_clean else None
    ZYGOTES.give_back(zygote, is_healthy=zygote_report is not None)
    RUNNERS.give_back(runner, is_healthy=runner_report is not None)
    drain.join(timeout=5)
    os.close(output_r)
    reap_orphans()
    peak_mb = (zygote_report or {}).get("peak_rss_kib", 0) / 1024
    return _decide(lines, timed_out, output, time.monotonic() - started, peak_mb)


def _start(
    solution: str,
    tests: str,
    entry_point: str,
    limits: Limits,
    *,
    candidate_fds: tuple[int, int, int],
    runner_fds: tuple[int, int, int],
) -> tuple[WarmSandbox, WarmSandbox]:
    """Hand the solution to a candidate zygote and the tests to a test runner."""
    zygote = runner = None
    try:
        zygote = ZYGOTES.borrow()
        backstop = {"wall_s": limits.wall_s + BACKSTOP_S}
        zygote.submit(
            {"solution": solution, **dataclasses.asdict(limits), **backstop}, candidate_fds
        )
        runner = RUNNERS.borrow()
        runner.submit(
            {
                "tests": tests,
                "entry_point": entry_point,
                "call_timeout_s": limits.call_timeout_s,
                "cpu_s": limits.cpu_s,
                **backstop,
            },
            runner_fds,
        )
        return zygote, runner
    except BaseException:
        for warm in (zygote, runner):
            if warm is not None:
                warm.close()
        raise


def _read_results(fd: int, deadline: float) -> tuple[list[dict[str, object]], bool]:
    """Result lines from the test side until it closes the pipe or the deadline passes."""
    buffer = b""
    lines: list[dict[str, object]] = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return lines, True
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # the test side finished, or was killed after our deadline
                return lines, time.monotonic() > deadline
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines += [json.loads(line) for line in complete if line.strip()]
    finally:
        os.close(fd)


def _decide(
    lines: list[dict[str, object]],
    timed_out: bool,
    output: _Output,
    duration_s: float,
    peak_mb: float,
) -> Verdict:
    tests = [
        TestResult(
            str(line["test"]),
            "passed" if line["status"] == "passed" else "failed",
            str(line["message"]),
        )
        for line in lines
        if "test" in line
    ]
    done = [line["done"] for line in lines if "done" in line]
    log = bytes(output.data[-2000:]).decode(errors="replace")
    reason = _reason(tests, done, timed_out, output, log)
    return Verdict(
        is_passed=reason == "passed",
        reason=reason,
        tests=tests,
        duration_s=round(duration_s, 4),
        peak_memory_mb=round(peak_mb, 1),
        detail=log[-2000:],
    )


def _reason(
    tests: list[TestResult], done: list[object], timed_out: bool, output: _Output, log: str
) -> Reason:
    messages = " ".join(test.message for test in tests)
    if output.is_over_cap:
        return "output_limit"
    if timed_out or "timeout:" in messages:
        return "timeout"
    if "output_limit:" in messages:  # a call or its reply was too long to cross
        return "output_limit"
    if "MemoryError" in messages or "MemoryError" in log:
        return "memory"
    if not done:
        return "crash" if tests else "harness_error"
    if done[0] != len(tests):
        return "harness_error"
    if not tests:
        return "no_tests"
    if all(test.status == "passed" for test in tests):
        return "passed"
    if "the candidate exited" in messages:
        return "crash"
    return "failed_tests"
