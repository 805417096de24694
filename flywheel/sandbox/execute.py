"""Run a candidate solution against tests: two sandboxes, literal values between them.

The candidate runs alone in a fresh sandbox and only answers calls; the tests run in another
(a warm runner, see runners.py) and call it through a proxy; per-test results reach this
(trusted) process on a pipe that only the test side holds. The verdict is decided here, from
those results — never from an exit code, never from anything the candidate printed.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import SANDBOX_PYTHON, Sandbox, reap_orphans, spawn, staged_files
from flywheel.sandbox.runners import POOL, WarmRunner
from flywheel.sandbox.verdict import Reason, TestResult, Verdict

CANDIDATE_PY = resources.files("flywheel.sandbox.harness").joinpath("candidate.py").read_text()


@dataclass
class _Output:
    """Drains one sandbox's stdout+stderr, keeping at most `cap` bytes."""

    process: subprocess.Popen[bytes]
    cap: int
    data: bytearray = field(default_factory=bytearray)
    is_over_cap: bool = False
    on_over_cap: Callable[[], None] = lambda: None

    def drain(self) -> None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            if len(self.data) + len(chunk) > self.cap:
                self.is_over_cap = True
                self.on_over_cap()
                return
            self.data += chunk


def run_tests(
    solution: str, tests: str, *, entry_point: str, limits: Limits | None = None
) -> Verdict:
    """Run `tests` (pytest-style `test_*` functions and/or HumanEval `check(candidate)`)
    against `solution`, whose function `entry_point` the tests call."""
    limits = limits or Limits()
    started = time.monotonic()
    request_r, request_w = os.pipe()
    response_r, response_w = os.pipe()
    results_r, results_w = os.pipe()
    candidate_files = {"/harness/candidate.py": CANDIDATE_PY, "/task/solution.py": solution}
    job = {
        "tests": tests,
        "entry_point": entry_point,
        "call_timeout_s": limits.call_timeout_s,
        "wall_s": limits.wall_s,
        "cpu_s": limits.cpu_s,
    }
    with staged_files(candidate_files) as binds:
        try:
            argv = [SANDBOX_PYTHON, "-I", "-S", "/harness/candidate.py",
                    str(request_r), str(response_w), "/task/solution.py"]  # fmt: skip
            candidate = Sandbox(
                spawn(argv, binds=binds, limits=limits, pass_fds=(request_r, response_w))
            )
            runner = _start_job(job, (request_w, response_r, results_w), candidate)
        except BaseException:
            os.close(results_r)
            raise
        finally:  # the sandboxes hold their own copies now
            for fd in (request_r, request_w, response_r, response_w, results_w):
                os.close(fd)
        output = _Output(
            candidate.process, limits.max_output_bytes, on_over_cap=candidate.kill_inside
        )
        drain = threading.Thread(target=output.drain, daemon=True)
        drain.start()
        lines, timed_out = _read_results(results_r, started + limits.wall_s)
        candidate.stop(grace_s=0.0 if timed_out else 1.0)  # it exits once the tests are done
        POOL.give_back(runner)
        drain.join(timeout=5)
        if candidate.process.stdout is not None:
            candidate.process.stdout.close()
        reap_orphans()
    return _decide(lines, timed_out, output, time.monotonic() - started, candidate.peak_rss_mb)


def _start_job(job: dict[str, object], fds: tuple[int, int, int], candidate: Sandbox) -> WarmRunner:
    """Hand the tests to a warm runner; on any failure, stop the candidate and drop the runner."""
    runner = None
    try:
        runner = POOL.borrow()
        runner.submit(job, fds)
        return runner
    except BaseException:
        candidate.stop(grace_s=0.0)
        if runner is not None:
            runner.close()
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
            if not chunk:
                return lines, False
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
