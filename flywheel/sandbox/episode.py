"""One episode's sandboxed process, seen from the host: calls out, answers back, by deadlines.

The process is a candidate child of a warm zygote (harness/candidate.py; environments have a
pool of their own), started as `run_tests` starts one: the job's limits in the zygote's
cgroup and as rlimits, a backstop wall clock in the zygote. Its "solution" is a driver
script that holds what the episode needs; the host calls the driver's functions over the
candidate's pipes, one line of harness/literals.py each way. Unlike a test run, the host
itself is the caller (no test runner sandbox): it only ever encodes its own plain values and
decodes the child's with the literal decoder, which builds builtins and nothing else.

An episode ends early, with a reason, when a call does not answer within its wall clock,
the episode's wall clock is spent, the child overruns its memory (the cgroup's OOM kill or
a MemoryError), CPU or output budget, exits, or answers what is not a reply. Then, and when
it is released, its process is stopped: the zygote is given back to the pool if the episode
ended cleanly and nothing of it is left, else closed (off the caller's path either way).
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from flywheel.sandbox.execute import (
    BACKSTOP_S,
    BUDGET_POLL_S,
    REPORT_WAIT_S,
    _candidate_limits,
    _log_failure,
    _Output,
)
from flywheel.sandbox.harness import literals
from flywheel.sandbox.limits import Limits
from flywheel.sandbox.warm import WarmPool, WarmSandbox

EndReason = Literal[
    "timeout", "cpu", "memory", "output_limit", "crash", "load_error", "harness_error"
]
READ_CHUNK = 65536
# Standard modules environments import (BFCL's: copy, typing, json, datetime, math, decimal,
# re), and the driver's own: each episode's child starts with them instead of importing them
# (tens of milliseconds). Never `random`: a module-level generator seeded once in the zygote
# would repeat itself in every episode.
PRELOADED = ("inspect", "types", "copy", "typing", "datetime", "math", "decimal", "re")
ENVIRONMENT_ZYGOTES = WarmPool("candidate.py", *PRELOADED)
"""Candidate zygotes for environments only (code candidates keep their own, lean ones)."""
_FINISHER = ThreadPoolExecutor(8, thread_name_prefix="flywheel-episode-finish")


class Episode:
    """A started episode's process. Not thread-safe: its owner calls one thing at a time."""

    def __init__(self, zygote: WarmSandbox, request_fd: int, response_fd: int, output_fd: int,
                 limits: Limits) -> None:  # fmt: skip
        self._zygote = zygote
        self._requests = request_fd
        self._responses = response_fd
        os.set_blocking(request_fd, False)
        self._output = _Output(output_fd, limits.max_output_bytes, zygote.sandbox.kill_inside)
        self._limits = limits
        self._deadline = time.monotonic() + limits.wall_s
        self._buffer = bytearray()
        self._is_released = False
        self.ended: str | None = None
        """Why the episode ended early ("<reason>: <detail>"), or None."""

    @classmethod
    def start(cls, driver: str, limits: Limits) -> Episode:
        """Borrow a zygote and start `driver` in a fresh child of it, held to `limits`."""
        request_r, request_w = os.pipe()
        response_r, response_w = os.pipe()
        output_r, output_w = os.pipe()
        try:
            zygote = ENVIRONMENT_ZYGOTES.borrow()
            try:
                job = {"solution": driver, **_candidate_limits(zygote, limits)}
                job["wall_s"] = limits.wall_s + BACKSTOP_S
                zygote.submit(job, (request_r, response_w, output_w))
            except BaseException:
                zygote.close()
                raise
        except BaseException:
            for fd in (request_w, response_r, output_r):
                os.close(fd)
            raise
        finally:  # the child holds its own copies now
            for fd in (request_r, response_w, output_w):
                os.close(fd)
        return cls(zygote, request_w, response_r, output_r, limits)

    def ask(self, function: str, args: tuple[Any, ...], *,
            on_raise: EndReason = "harness_error") -> Any:  # fmt: skip
        """The driver's `function(*args)`, or None once the episode has ended (a raise ends
        it with `on_raise` as the reason, a MemoryError with "memory")."""
        if self.ended is not None:
            return None
        now = time.monotonic()
        if now >= self._deadline:
            wall_s = self._limits.wall_s
            self.end("timeout", f"the episode's wall clock of {wall_s} s ran out")
            return None
        try:
            line = literals.encode((function, args, {})).encode("ascii") + b"\n"
        except (literals.NotPlain, literals.TooLarge) as error:
            self.end(on_raise, f"the call to {function} cannot cross: {error}")
            return None
        deadline = min(now + self._limits.call_timeout_s, self._deadline)
        if not self._send(line, deadline):
            return None
        raw = self._receive(deadline, function)
        if raw is not None and self._is_overrun():  # a process of it was killed meanwhile:
            self.end("memory", "the kernel killed a process of it for memory")  # it may
            return None  # have answered from a broken state
        return None if raw is None else self._value(raw, function, on_raise)

    def _is_overrun(self) -> bool:
        budget = self._zygote.budget
        return budget is not None and budget.is_overrun()

    def _value(self, raw: bytes, function: str, on_raise: EndReason) -> Any:
        try:
            reply = literals.decode(raw.decode("ascii"))
        except (UnicodeDecodeError, literals.NotPlain) as error:
            self.end("harness_error", f"its reply is not a plain value: {error}")
            return None
        match reply:
            case ("value", value):
                return value
            case ("raise", "MemoryError", _):
                self.end("memory", f"the environment ran out of memory in {function}")
                return None
            case ("raise", "TooLarge", str(message)) | ("output_limit", str(message)):
                self.end("output_limit", f"its answer to {function} is {message}")
                return None
            case ("raise", str(kind), str(message)):
                self.end(on_raise, f"{kind}: {message}"[:1000])
                return None
        self.end("harness_error", f"the environment's answer to {function} is no reply")
        return None

    def argument_problem(self, arguments: dict[str, Any], max_bytes: int) -> str | None:
        """Why `arguments` cannot be sent (not plain values, too long), or None."""
        try:
            size = len(literals.encode(arguments))
        except literals.NotPlain as error:
            return f"the arguments are not plain values: {error}"
        except literals.TooLarge:
            size = max_bytes + 1
        return f"the arguments are over {max_bytes} bytes" if size > max_bytes else None

    def end(self, reason: EndReason, detail: str) -> None:
        """End the episode early: say why, and stop its process now."""
        if self.ended is None:
            self.ended = f"{reason}: {detail}"
        self.release()

    def release(self) -> None:
        """Stop the episode's process and hand its zygote back (or close it), once."""
        if self._is_released:
            return
        self._is_released = True
        for fd in (self._requests, self._responses):
            with contextlib.suppress(OSError):
                os.close(fd)  # a child still reading requests exits on their end
        is_clean = self.ended is None
        if self._is_overrun():
            self._zygote.sandbox.kill_inside()  # all of it stalls in reclaim: kill it now
            is_clean = False
        ENVIRONMENT_ZYGOTES.ending(self._zygote)
        finish = _FINISHER.submit(_finish, self._zygote, self._output.fd, is_clean=is_clean)
        finish.add_done_callback(_log_failure)

    def _send(self, line: bytes, deadline: float) -> bool:
        view = memoryview(line)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [self._requests], [], remaining)[1]:
                self.end("timeout", "the environment did not take its call in time")
                return False
            try:
                view = view[os.write(self._requests, view) :]
            except BlockingIOError:
                continue
            except OSError:
                self.end(*self._exit_reason())
                return False
        return True

    def _receive(self, deadline: float, function: str) -> bytes | None:
        """The reply line, by `deadline`; None (and the episode ended) if none came."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > literals.MAX_TEXT_BYTES:
                self.end("output_limit", f"the answer to {function} is over the limit")
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seconds = self._limits.call_timeout_s
                self.end("timeout", f"{function} did not answer within {seconds} s")
                return None
            if not self._read(min(remaining, BUDGET_POLL_S)):
                return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    def _read(self, wait_s: float) -> bool:
        """Read what the child wrote within `wait_s` (its output drained too); False if the
        episode ended meanwhile."""
        output = self._output
        watched = [self._responses, output.fd] if output.is_open else [self._responses]
        ready = select.select(watched, [], [], wait_s)[0]
        if output.fd in ready:
            output.drain()
            if output.is_over_cap:
                self.end("output_limit", f"it printed over {output.cap} bytes")
                return False
        if self._responses in ready:
            chunk = os.read(self._responses, READ_CHUNK)
            if not chunk:
                self.end(*self._exit_reason())
                return False
            self._buffer += chunk
        elif not ready and self._is_overrun():
            self.end("memory", "the kernel killed it for overrunning its memory budget")
            return False
        return True

    def _exit_reason(self) -> tuple[EndReason, str]:
        """Why the child is gone, from what it printed and its budget."""
        self._output.drain()
        printed = bytes(self._output.data[-2000:]).decode(errors="replace")
        if self._output.is_over_cap:
            return "output_limit", f"it printed over {self._output.cap} bytes"
        if "cpu_limit:" in printed:
            return "cpu", f"it ran out of CPU time ({self._limits.cpu_s} s)"
        if self._is_overrun() or "MemoryError" in printed:
            return "memory", "it overran its memory budget"
        tail = printed.strip()[-300:]
        return "crash", "the environment's process exited" + (f": {tail}" if tail else "")


def _finish(zygote: WarmSandbox, output_fd: int, *, is_clean: bool) -> None:
    """End the zygote's job, and pool the zygote again if it reported and nothing of the job
    is left; else close it."""
    try:
        if is_clean:
            zygote.end_job()
        report = zygote.read_report(REPORT_WAIT_S) if is_clean else None
        if zygote.budget is not None and report is not None:
            zygote.budget.held_processes = int(report.get("held_processes", 0))
        is_left_clean = zygote.budget is None or zygote.budget.leftover_processes() == 0
        ENVIRONMENT_ZYGOTES.give_back(zygote, is_healthy=report is not None and is_left_clean)
    finally:
        os.close(output_fd)
