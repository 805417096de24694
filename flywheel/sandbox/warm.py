"""Warm sandboxes: started once, fed one job at a time over a Unix socket, kept if healthy.

Starting a sandbox and a Python costs more than most executions. Two kinds are kept warm:
test runners (they never run candidate code) and candidate zygotes (they never run candidate
code either: each job runs in a freshly forked child with new user, mount and pid namespaces,
see harness/candidate.py). A job is an 8-byte length with its pipe ends attached
(SCM_RIGHTS), then that many bytes of JSON; after it, the sandbox reports one JSON line.
A sandbox whose job timed out or misbehaved is closed, never reused. Each sandbox has its own
memory and process budget (`budget.py`), set per job by the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from importlib import resources
from pathlib import Path
from typing import Any

from flywheel.errors import SandboxUnavailable
from flywheel.sandbox.budget import Budget, make_budget, remove_parents
from flywheel.sandbox.harness import jobs
from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import (
    SANDBOX_PYTHON,
    Sandbox,
    is_unsafe_local,
    reap_orphans,
    seccomp_module,
    spawn,
    staged_files,
)

MODULES = ("jobs.py", "literals.py", "syscalls.py")  # imported by the harness scripts from /harness
BUDGET_REMOVE_WAIT_S = 2.0
# How long a borrower waits for a sandbox whose job is ending (milliseconds, mostly; longer
# on a loaded machine) before it starts one (0.1-0.5 s) of its own.
ENDING_WAIT_S = 1.0
LENT_WAIT_S = 10.0  # how long closing a pool waits for sandboxes still ending a job
READY_WAIT_S = 30.0  # a harness starts in ~20 ms; a loaded machine may take far longer
# The long-lived processes do little themselves; each job gets the caller's limits.
WARM_LIMITS = Limits(cpu_s=24 * 3600, memory_mb=1024, max_processes=64, max_open_files=256)

# bwrap --die-with-parent means "dies with the *thread* that started it" (PR_SET_PDEATHSIG):
# a warm sandbox started from a short-lived worker thread would die with that thread. They
# are all started from this one thread, which lives as long as the process.
_STARTER = ThreadPoolExecutor(1, thread_name_prefix="flywheel-sandbox-starter")


class WarmSandbox:
    def __init__(self, script: str, *args: str) -> None:
        self._files = ExitStack()
        harness = resources.files("flywheel.sandbox.harness")
        texts = {
            f"/harness/{name}": harness.joinpath(name).read_text() for name in (script, *MODULES)
        }
        binds = self._files.enter_context(staged_files(texts))
        self.is_unsafe = is_unsafe_local(warn=False)
        seccomp = None if self.is_unsafe else seccomp_module()
        if seccomp is not None:
            binds[seccomp] = f"/harness/{Path(seccomp).name}"
        self.budget: Budget | None = None if self.is_unsafe else make_budget()
        ours, theirs = socket.socketpair()
        try:
            process = spawn(
                [SANDBOX_PYTHON, "-I", "-S", f"/harness/{script}", str(theirs.fileno()), *args],
                binds=binds,
                limits=WARM_LIMITS,
                pass_fds=(theirs.fileno(),),
                keep_output=False,  # jobs get their own output pipes
                budget=self.budget,
            )
        except BaseException:
            ours.close()
            self._files.close()
            if self.budget is not None:
                self.budget.remove()
            raise
        finally:
            theirs.close()
        self.control = ours
        self.sandbox = Sandbox(process)
        self._reports = b""
        if self.read_report(READY_WAIT_S) != {"ready": True}:
            self.close()
            raise SandboxUnavailable(f"a warm sandbox ({script}) did not start")

    def end_job(self) -> None:
        """Tell the sandbox its job's tests are over: it stops what is left of the job."""
        with contextlib.suppress(OSError):
            self.control.sendall(b"E")

    @property
    def is_alive(self) -> bool:
        return not self.sandbox.wait(0.0)

    def submit(self, job: dict[str, Any], fds: tuple[int, ...]) -> None:
        jobs.send(self.control, job, fds)

    def read_report(self, timeout_s: float) -> dict[str, Any] | None:
        """The line the sandbox writes after a job, or None if none came in time."""
        while b"\n" not in self._reports:
            ready, _, _ = select.select([self.control], [], [], timeout_s)
            try:
                chunk = self.control.recv(4096) if ready else b""
            except OSError:  # it died (reset): no report, so it is not reused
                chunk = b""
            if not chunk:
                return None
            self._reports += chunk
        line, _, self._reports = self._reports.partition(b"\n")
        report: dict[str, Any] = json.loads(line)
        return report

    def close(self) -> None:
        self.control.close()  # the sandbox's process exits when its socket closes
        self.sandbox.stop(grace_s=1.0)
        self._files.close()
        deadline = time.monotonic() + BUDGET_REMOVE_WAIT_S
        reap_orphans()  # the sandbox's init, adopted by us once bwrap has gone
        while self.budget is not None and not self.budget.remove():
            if time.monotonic() > deadline:
                break  # left for remove_parents at exit
            reap_orphans()  # it may still have been dying: the cgroup's last process
            time.sleep(0.01)


class WarmPool:
    """Idle warm sandboxes of one kind; one is borrowed per execution, and given back once
    its job has ended (which may be after the caller has its verdict).

    Sandboxes started under the unsafe-local override are never pooled, so a sandboxed run
    can never be handed an unsandboxed one.
    """

    def __init__(self, script: str, *arguments: str) -> None:
        POOLS.append(self)
        self._script = script
        self._arguments = arguments  # the script's, after "sandboxed" (candidate.py: preloads)
        self._idle: list[WarmSandbox] = []
        self._lent = 0
        self._ending: set[WarmSandbox] = set()  # lent, their job's verdict given, ending
        self._returned = threading.Condition()

    def borrow(self) -> WarmSandbox:
        if is_unsafe_local():
            return _STARTER.submit(WarmSandbox, self._script, "unsafe", *self._arguments).result()
        while True:
            with self._returned:
                # A sandbox whose job is ending is back in milliseconds; a new one takes ~100.
                self._returned.wait_for(lambda: self._idle or not self._ending, ENDING_WAIT_S)
                warm = self._idle.pop() if self._idle else None
                self._lent += 1
            if warm is None:
                return self._start()
            if warm.is_alive:
                return warm
            self.give_back(warm, is_healthy=False)

    def _start(self) -> WarmSandbox:
        try:
            started = _STARTER.submit(WarmSandbox, self._script, "sandboxed", *self._arguments)
            return started.result()
        except BaseException:
            with self._returned:
                self._lent -= 1
                self._returned.notify_all()
            raise

    def ending(self, warm: WarmSandbox) -> None:
        """`warm`'s job has its verdict; it will be given back once the job has ended."""
        with self._returned:
            self._ending.add(warm)

    def give_back(self, warm: WarmSandbox, *, is_healthy: bool) -> None:
        if warm.is_unsafe:
            warm.close()
            return
        with self._returned:
            self._ending.discard(warm)  # a borrower stops waiting for it now, not once closed
            if is_healthy:
                self._idle.append(warm)
            self._returned.notify_all()
        if not is_healthy:
            warm.close()
        with self._returned:
            self._lent -= 1
            self._returned.notify_all()

    def wait_returned(self, wait_s: float = LENT_WAIT_S) -> bool:
        """Wait up to `wait_s` for every lent sandbox to be given back (its job ended)."""
        with self._returned:
            return self._returned.wait_for(lambda: self._lent == 0, timeout=wait_s)

    def close(self) -> None:
        """Close the idle sandboxes, once the lent ones are back (or LENT_WAIT_S passed)."""
        self.wait_returned()
        with self._returned:
            idle, self._idle = self._idle, []
        for warm in idle:
            with contextlib.suppress(OSError):
                warm.close()


POOLS: list[WarmPool] = []
"""Every pool made (these two, and the environments' zygotes of flywheel.sandbox.episode)."""
RUNNERS = WarmPool("runner.py")
ZYGOTES = WarmPool("candidate.py")


def close_pools() -> None:
    """Close every pool's idle warm sandboxes, once the jobs still ending in them have ended."""
    for pool in POOLS:
        pool.close()


@atexit.register
def _close_pools() -> None:
    close_pools()
    remove_parents()
