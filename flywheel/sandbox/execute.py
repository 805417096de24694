"""Run a candidate solution against tests: two sandboxes, literal values between them.

The candidate runs alone in one sandbox and only answers calls; the tests run in another and
call it through a proxy; per-test results reach this (trusted) process on a pipe that only the
test side holds. The verdict is decided here, from those results — never from an exit code,
never from anything the candidate printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import (
    SANDBOX_PYTHON,
    forget_spawned,
    reap_orphans,
    spawn,
    staged_files,
)
from flywheel.sandbox.verdict import Reason, TestResult, Verdict

HARNESS = resources.files("flywheel.sandbox.harness")


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
    candidate_files = {
        "/harness/candidate.py": HARNESS.joinpath("candidate.py").read_text(),
        "/task/solution.py": solution,
    }
    runner_files = {
        "/harness/runner.py": HARNESS.joinpath("runner.py").read_text(),
        "/task/tests.py": tests,
    }
    with (
        staged_files(candidate_files) as candidate_binds,
        staged_files(runner_files) as runner_binds,
    ):
        try:
            candidate = spawn(
                [SANDBOX_PYTHON, "-I", "-S", "/harness/candidate.py",
                 str(request_r), str(response_w), "/task/solution.py"],
                binds=candidate_binds, limits=limits, pass_fds=(request_r, response_w),
            )  # fmt: skip
            try:
                runner = spawn(
                    [SANDBOX_PYTHON, "-I", "-S", "/harness/runner.py",
                     str(request_w), str(response_r), str(results_w), entry_point,
                     "/task/tests.py", str(limits.call_timeout_s)],
                    binds=runner_binds, limits=limits,
                    pass_fds=(request_w, response_r, results_w),
                )  # fmt: skip
            except BaseException:
                _Sandbox(candidate).stop(grace_s=0.0)
                os.close(results_r)
                raise
        finally:  # the sandboxes hold their own copies now
            for fd in (request_r, request_w, response_r, response_w, results_w):
                os.close(fd)
        sandboxes = [_Sandbox(runner), _Sandbox(candidate)]
        outputs = [
            _Output(sandbox.process, limits.max_output_bytes, on_over_cap=sandbox.kill_inside)
            for sandbox in sandboxes
        ]
        drains = [threading.Thread(target=output.drain, daemon=True) for output in outputs]
        for drain in drains:
            drain.start()
        lines, timed_out = _read_results(results_r, started + limits.wall_s)
        for sandbox in sandboxes:  # both exit on their own once the tests are done
            sandbox.stop(grace_s=0.0 if timed_out else 1.0)
        peak_mb = max(sandbox.peak_rss_mb for sandbox in sandboxes)
        reap_orphans()
        for drain, sandbox in zip(drains, sandboxes, strict=True):
            drain.join(timeout=5)
            if sandbox.process.stdout is not None:
                sandbox.process.stdout.close()
    return _decide(lines, timed_out, outputs, time.monotonic() - started, peak_mb)


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


@dataclass
class _Sandbox:
    """A started sandbox: its bwrap process, and its peak memory once reaped."""

    process: subprocess.Popen[bytes]
    peak_rss_mb: float = 0.0

    def wait(self, timeout_s: float) -> bool:
        """Reap bwrap within `timeout_s`; True once it has exited."""
        deadline = time.monotonic() + timeout_s
        while self.process.returncode is None:
            pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
            if pid:
                self.process.returncode = os.waitstatus_to_exitcode(status)
                self.peak_rss_mb = usage.ru_maxrss / 1024  # with its waited-for descendants
                forget_spawned(pid)
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(0.005)
        return True

    def kill_inside(self) -> None:
        """Kill the sandbox's init (bwrap's child, pid 1 of its pid namespace): every process
        in the namespace dies with it, and bwrap reaps it and exits. Killing bwrap first would
        orphan that init to a host pid 1 that may never reap it."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        with contextlib.suppress(OSError):
            for child in children.read_text().split():
                os.kill(int(child), signal.SIGKILL)

    def stop(self, grace_s: float) -> None:
        """Let it exit on its own for `grace_s`, then kill everything in it."""
        if self.wait(grace_s):
            return
        self.kill_inside()
        if not self.wait(2.0):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.wait(5.0)


def _decide(
    lines: list[dict[str, object]],
    timed_out: bool,
    outputs: list[_Output],
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
    log = b"".join(bytes(output.data[-2000:]) for output in outputs).decode(errors="replace")
    reason = _reason(tests, done, timed_out, outputs, log)
    return Verdict(
        is_passed=reason == "passed",
        reason=reason,
        tests=tests,
        duration_s=round(duration_s, 4),
        peak_memory_mb=round(peak_mb, 1),
        detail=log[-2000:],
    )


def _reason(
    tests: list[TestResult], done: list[object], timed_out: bool, outputs: list[_Output], log: str
) -> Reason:
    messages = " ".join(test.message for test in tests)
    if any(output.is_over_cap for output in outputs):
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
