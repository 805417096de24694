"""Run a candidate solution against tests: two sandboxes, literal values between them.

The candidate runs alone, in a fresh child of a warm zygote with namespaces of its own, and
only answers calls; the tests run in another sandbox (a warm runner, see warm.py) and call it
through a proxy; per-test results reach this (trusted) process on a pipe that only the test
side holds. The verdict is decided here, from those results — never from an exit code, never
from anything the candidate printed. (The *reason* label may use what the candidate printed,
e.g. a MemoryError; a pass never does.)
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from flywheel.errors import InvalidInput
from flywheel.sandbox.budget import fallback_limits
from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import check_available, is_unsafe_local
from flywheel.sandbox.verdict import Reason, TestResult, Verdict
from flywheel.sandbox.warm import RUNNERS, ZYGOTES, WarmSandbox

REPORT_WAIT_S = 2.0  # how long a warm sandbox may take to report a finished job
# The sandboxes kill a job this long after our own wall clock: ours decides, theirs is a backstop.
BACKSTOP_S = 1.0
# Made ready for the next job while one runs: a zygote's child (candidate.py) and a test
# runner's (runner.py).
ZYGOTE_HELD_PROCESSES = 2
RUNNER_HELD_PROCESSES = 1
BUDGET_POLL_S = 0.01  # how often a running job's cgroup is checked for an OOM kill
# Ends jobs off the caller's path: stopping what the candidate still runs, reading both
# sandboxes' reports and pooling them again take milliseconds no verdict depends on.
_FINISHER = ThreadPoolExecutor(8, thread_name_prefix="flywheel-sandbox-finish")
log = logging.getLogger(__name__)


@dataclass
class _Output:
    """What the candidate prints, kept up to `cap` bytes; read without blocking."""

    fd: int
    cap: int
    on_over_cap: Callable[[], None]
    data: bytearray = field(default_factory=bytearray)
    is_over_cap: bool = False
    is_open: bool = True
    """Until the candidate's side closes it, or it passes the cap (nothing is read after)."""

    def __post_init__(self) -> None:
        os.set_blocking(self.fd, False)

    def drain(self) -> None:
        """Read what has been written so far."""
        while self.is_open:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self.is_open = False
            elif len(self.data) + len(chunk) > self.cap:
                self.is_over_cap, self.is_open = True, False
                self.on_over_cap()
            else:
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
    overran = zygote.budget.is_overrun if zygote.budget is not None else lambda: False
    lines, timed_out = _read_results(results_r, output, started + limits.wall_s, overran)
    output.drain()  # all it printed before the tests were over
    is_clean = not timed_out and not output.is_over_cap
    if zygote.budget is None:  # the largest single process, in the zygote's report: all
        report = _finish_job(zygote, runner, output.fd, is_clean=is_clean)  # rlimits can tell
        peak_mb, is_oom_killed = (report or {}).get("peak_rss_kib", 0) / 1024, False
    else:  # the cgroup knows now; the job ends while the caller goes on
        usage = zygote.budget.job_usage()
        peak_mb, is_oom_killed = usage.peak_memory_mb, usage.is_oom_killed
        if is_oom_killed:  # all of the sandbox stalls in reclaim at its limit: kill it now,
            zygote.sandbox.kill_inside()  # rather than ask its zygote to stop the job
            is_clean = False
        ZYGOTES.ending(zygote)
        RUNNERS.ending(runner)
        finish = functools.partial(_finish_job, zygote, runner, output.fd, is_clean=is_clean)
        _FINISHER.submit(finish).add_done_callback(_log_failure)
    run = _Run(lines, timed_out, output, is_oom_killed)
    return _decide(run, time.monotonic() - started, peak_mb)


def _finish_job(
    zygote: WarmSandbox, runner: WarmSandbox, output_fd: int, *, is_clean: bool
) -> dict[str, Any] | None:
    """End the job (once its tests are over, what the candidate still runs is of no use),
    pool both sandboxes again if they reported and nothing of the job is left, else close
    them; the zygote's report."""
    try:
        if is_clean:
            zygote.end_job()
        zygote_report = zygote.read_report(REPORT_WAIT_S) if is_clean else None
        runner_report = runner.read_report(REPORT_WAIT_S) if is_clean else None
        if zygote.budget is not None and zygote_report is not None:
            zygote.budget.held_processes = int(zygote_report.get("held_processes", 0))
        is_left_clean = zygote.budget is None or zygote.budget.leftover_processes() == 0
        ZYGOTES.give_back(zygote, is_healthy=zygote_report is not None and is_left_clean)
        RUNNERS.give_back(runner, is_healthy=runner_report is not None)
    finally:
        os.close(output_fd)
    return zygote_report


def _log_failure(done: Future[Any]) -> None:
    error = done.exception()
    if error is not None:
        log.error("sandbox: ending a job failed: %r", error)


def _start(
    solution: str,
    tests: str,
    entry_point: str,
    limits: Limits,
    *,
    candidate_fds: tuple[int, int, int],
    runner_fds: tuple[int, int, int],
) -> tuple[WarmSandbox, WarmSandbox]:
    """Hand the solution to a candidate zygote and the tests to a test runner, each held to
    the job's budget."""
    zygote = runner = None
    try:
        zygote = ZYGOTES.borrow()
        backstop = {"wall_s": limits.wall_s + BACKSTOP_S}
        zygote.submit(
            {"solution": solution, **_candidate_limits(zygote, limits), **backstop},
            candidate_fds,
        )
        runner = RUNNERS.borrow()
        if runner.budget is not None:  # its memory is held to the budget; nothing is reported
            runner.budget.limit(limits, extra_processes=RUNNER_HELD_PROCESSES)
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


def _candidate_limits(zygote: WarmSandbox, limits: Limits) -> dict[str, object]:
    """The job's limits as the zygote applies them: the whole budget in the sandbox's cgroup
    and as each process's address space, or, without a cgroup, split between processes."""
    job = dict(vars(limits))  # its fields: plain numbers (asdict's deep copy costs more)
    if zygote.budget is not None:  # the zygote makes the next job's child meanwhile
        zygote.budget.start_job(limits, extra_processes=ZYGOTE_HELD_PROCESSES)
        return {**job, "process_memory_mb": limits.memory_mb}
    processes, per_process_mb = fallback_limits(limits)
    return {**job, "max_processes": processes, "process_memory_mb": per_process_mb}


def _read_results(
    fd: int, output: _Output, deadline: float, overran: Callable[[], bool]
) -> tuple[list[dict[str, object]], bool]:
    """Result lines from the test side until it closes the pipe, the deadline passes (True)
    or the candidate overruns its memory budget: no test of it counts then, so waiting on
    what the OOM killer spared would only let it stall. Drains `output` meanwhile."""
    buffer = b""
    lines: list[dict[str, object]] = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return lines, True
            watched = [fd, output.fd] if output.is_open else [fd]
            ready, _, _ = select.select(watched, [], [], min(remaining, BUDGET_POLL_S))
            if output.fd in ready:
                output.drain()
            if fd not in ready:
                if not ready and overran():
                    return lines, False
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # the test side finished, or was killed after our deadline
                return lines, time.monotonic() > deadline
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines += [json.loads(line) for line in complete if line.strip()]
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _Run:
    """What the trusted side saw of one run."""

    lines: list[dict[str, object]]
    timed_out: bool
    output: _Output
    is_oom_killed: bool

    @property
    def collected(self) -> list[str] | None:
        """The tests the test side declared before running any, or None if it never did."""
        declared = [line["collected"] for line in self.lines if "collected" in line]
        return [str(name) for name in declared[0]] if declared else None  # type: ignore[attr-defined]

    @property
    def reported(self) -> list[TestResult]:
        return [
            TestResult(
                str(line["test"]),
                "passed" if line["status"] == "passed" else "failed",
                str(line["message"]),
            )
            for line in self.lines
            if "test" in line
        ]

    @property
    def done(self) -> list[object]:
        return [line["done"] for line in self.lines if "done" in line]


def _decide(run: _Run, duration_s: float, peak_mb: float) -> Verdict:
    """The verdict over every test collected: one that never reported (the run stalled,
    crashed or overran a limit first) is failed, so a fraction of tests passed is always
    over all of them; a candidate the kernel killed for memory passes none."""
    log = bytes(run.output.data[-2000:]).decode(errors="replace")
    reason = _reason(run, log)
    reported = run.reported
    if run.is_oom_killed:  # when in the run it overran is unknown: no test of it counts
        reported = [
            TestResult(test.name, "failed", "the candidate overran its memory budget")
            for test in reported
        ]
    names = {test.name for test in reported}
    unreported = [
        TestResult(name, "failed", f"did not report: the run ended first ({reason})")
        for name in run.collected or []
        if name not in names
    ]
    return Verdict(
        is_passed=reason == "passed",
        reason=reason,
        tests=reported + unreported,
        duration_s=round(duration_s, 4),
        peak_memory_mb=round(peak_mb, 1),
        detail=log[-2000:],
    )


def _reason(run: _Run, log: str) -> Reason:
    tests, collected, done = run.reported, run.collected, run.done
    messages = " ".join(test.message for test in tests)
    if run.output.is_over_cap:
        return "output_limit"
    if run.timed_out or "timeout:" in messages:
        return "timeout"
    if "output_limit:" in messages:  # a call or its reply was too long to cross
        return "output_limit"
    if run.is_oom_killed or "MemoryError" in messages or "MemoryError" in log:
        return "memory"
    if not done or collected is None:
        return "crash" if tests else "harness_error"
    if done[0] != len(collected) or [test.name for test in tests] != collected:
        return "harness_error"
    if not tests:
        return "no_tests"
    if all(test.status == "passed" for test in tests):
        return "passed"
    if "the candidate exited" in messages:
        return "crash"
    return "failed_tests"
