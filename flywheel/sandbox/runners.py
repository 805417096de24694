"""Warm test runners: sandboxes that run tests, kept between executions.

Starting a sandbox and a Python costs more than most test runs. The test side never runs
candidate code, so its sandbox can be reused: a runner forks a fresh child for each job from a
process that never ran a test. Every candidate still gets a sandbox of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import socket
import threading
from contextlib import ExitStack
from importlib import resources
from typing import Any

from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import (
    SANDBOX_PYTHON,
    Sandbox,
    is_unsafe_local,
    spawn,
    staged_files,
)

# The runner process itself does little: its jobs get the caller's CPU limit (set per job).
RUNNER_LIMITS = Limits(cpu_s=24 * 3600, memory_mb=1024, max_processes=64, max_open_files=256)


class WarmRunner:
    """One runner sandbox, fed jobs over a Unix socket with the job's pipe ends attached."""

    def __init__(self) -> None:
        self._files = ExitStack()
        runner_py = resources.files("flywheel.sandbox.harness").joinpath("runner.py").read_text()
        binds = self._files.enter_context(staged_files({"/harness/runner.py": runner_py}))
        ours, theirs = socket.socketpair()
        try:
            process = spawn(
                [SANDBOX_PYTHON, "-I", "-S", "/harness/runner.py", str(theirs.fileno())],
                binds=binds,
                limits=RUNNER_LIMITS,
                pass_fds=(theirs.fileno(),),
                keep_output=False,  # what tests print is not evidence of anything
            )
        except BaseException:
            ours.close()
            self._files.close()
            raise
        finally:
            theirs.close()
        self.control = ours
        self.sandbox = Sandbox(process)
        self.is_unsafe = is_unsafe_local(warn=False)

    @property
    def is_alive(self) -> bool:
        return not self.sandbox.wait(0.0)

    def submit(self, job: dict[str, Any], fds: tuple[int, int, int]) -> None:
        """Queue a job; the runner reads it once its previous job is done."""
        payload = json.dumps(job).encode()
        socket.send_fds(self.control, [len(payload).to_bytes(8, "big")], list(fds))
        self.control.sendall(payload)

    def close(self) -> None:
        self.control.close()  # the runner exits when its socket closes
        self.sandbox.stop(grace_s=1.0)
        self._files.close()


class RunnerPool:
    """Idle warm runners; one is borrowed per execution and returned if still healthy.

    Runners started under the unsafe-local override are never pooled, so a sandboxed run can
    never be handed an unsandboxed runner.
    """

    def __init__(self) -> None:
        self._idle: list[WarmRunner] = []
        self._lock = threading.Lock()

    def borrow(self) -> WarmRunner:
        if is_unsafe_local():
            return WarmRunner()
        while True:
            with self._lock:
                runner = self._idle.pop() if self._idle else None
            if runner is None:
                return WarmRunner()
            if runner.is_alive:
                return runner
            runner.close()

    def give_back(self, runner: WarmRunner) -> None:
        if runner.is_unsafe:
            runner.close()
            return
        with self._lock:
            self._idle.append(runner)

    def close(self) -> None:
        with self._lock:
            runners, self._idle = self._idle, []
        for runner in runners:
            with contextlib.suppress(OSError):
                runner.close()


POOL = RunnerPool()
atexit.register(POOL.close)
