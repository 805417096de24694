"""Start a process inside a bubblewrap sandbox, or refuse to.

Each sandbox: every namespace unshared (no network), a read-only root with /usr and only the
files it is given (under /task and /harness), a private size-capped tmpfs /work, an empty
environment (bwrap itself is started with none, so /proc/1/environ is empty too),
`--die-with-parent --new-session`, its own unprivileged uid (RLIMIT_NPROC does not hold for
root, even mapped into a user namespace) and rlimits on CPU, memory, processes, file size and
open files. The caller kills it on a wall clock.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import random
import resource
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flywheel.errors import SandboxUnavailable
from flywheel.sandbox import requirements
from flywheel.sandbox.budget import Budget
from flywheel.sandbox.limits import Limits

SANDBOX_PYTHON = requirements.SANDBOX_PYTHON
UNSAFE_ENV = "FLYWHEEL_SANDBOX"
UNSAFE_VALUE = "unsafe-local"
HOW_TO_FIX = (
    "install bubblewrap, util-linux and libseccomp's Python binding for the system Python "
    "(apt-get install bubblewrap util-linux python3 python3-seccomp), and allow "
    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
)

# Each sandbox gets its own uid so that sandboxes never share a process budget.
SANDBOX_UID_MIN = 200_000
_UIDS = itertools.cycle(range(SANDBOX_UID_MIN + random.randrange(50_000), 300_000))
PR_SET_CHILD_SUBREAPER = 36

# bwrap processes started by `spawn` and not yet reaped by their owner: never orphans.
_spawned: set[int] = set()
_spawned_lock = threading.Lock()


def is_unsafe_local(*, warn: bool = True) -> bool:
    """The development override: run without bwrap. Warns every time; training refuses it."""
    if os.environ.get(UNSAFE_ENV) != UNSAFE_VALUE:
        return False
    if warn:
        warnings.warn(
            f"{UNSAFE_ENV}={UNSAFE_VALUE}: running model-written code WITHOUT a sandbox",
            RuntimeWarning,
            stacklevel=3,
        )
    return True


def refuse_unsafe_local(purpose: str) -> None:
    """For callers that must never run unsandboxed (training): refuse the override."""
    if os.environ.get(UNSAFE_ENV) == UNSAFE_VALUE:
        raise SandboxUnavailable(f"{purpose} refuses {UNSAFE_ENV}={UNSAFE_VALUE}: unset it")


@functools.cache
def _probe() -> str | None:
    """Why sandboxes cannot start here (with the fix), or None when a trial sandbox ran."""
    for needed in requirements.check_tools(seccomp_module()):
        if not needed.is_present:
            return f"{needed.detail} (fix: {needed.fix})"
    _become_subreaper()
    trial = subprocess.run(
        [*_bwrap_prefix(uid=next(_UIDS), binds={}, tmpfs_mb=1), "/usr/bin/true"],
        env={},
        capture_output=True,
        timeout=30,
        check=False,
    )
    reap_orphans()
    if trial.returncode != 0:
        error = trial.stderr.decode(errors="replace").strip()
        return f"bwrap could not start a sandbox: {error} (fix: {_trial_fix()})"
    return None


def _trial_fix() -> str:
    """The likeliest fix when bwrap is there but no sandbox starts."""
    bwrap = requirements.find_bwrap()
    blocked = bwrap and requirements.not_traversable(bwrap.path)
    if blocked:
        return f"the sandbox's uid cannot reach {blocked}: install the system's bubblewrap"
    namespaces = requirements.check_user_namespaces()
    return namespaces.fix if not namespaces.is_present else HOW_TO_FIX


@functools.cache
def seccomp_module() -> str | None:
    """The host path of the system Python's `seccomp` extension module, or None without it.

    The sandboxes run `python3 -I -S`, which has no site-packages: the module file is bound
    into /harness, where the candidate harness imports it.
    """
    try:
        found = subprocess.run(
            [SANDBOX_PYTHON, "-I", "-c", "import seccomp; print(seccomp.__file__)"],
            env={},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:  # no system Python at all
        return None
    path = found.stdout.strip()
    return path if found.returncode == 0 and path.endswith(".so") else None


@functools.cache
def _become_subreaper() -> None:
    """Adopt orphans instead of leaving them to the host's pid 1.

    bwrap's monitor exits without reaping the sandbox's init, which is reparented; a host
    pid 1 that does not reap (as in some VMs and containers) would collect one zombie per
    sandbox until pids run out. As a subreaper this process adopts them; `reap_orphans`
    reaps exactly those (their uid is a sandbox uid), never another child's exit status.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SandboxUnavailable(
            f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}"
        )


def reap_orphans() -> None:
    """Reap adopted sandbox processes that have exited; ones still dying wait for the next call."""
    with _spawned_lock:
        owned = set(_spawned)
    for pid in _children():
        if pid not in owned and _sandbox_state(pid) == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def forget_spawned(pid: int) -> None:
    """The owner has reaped `pid`."""
    with _spawned_lock:
        _spawned.discard(pid)


def _children() -> list[int]:
    pids: list[int] = []
    for children in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in children.read_text().split()]
    return pids


def _sandbox_state(pid: int) -> str | None:
    """The process state letter of a sandbox-uid process, None for any other process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if int(fields.get("Uid", "0").split()[0]) < SANDBOX_UID_MIN:
        return None
    return fields.get("State", "?").strip()[:1]


def check_available() -> None:
    """Raise SandboxUnavailable, saying how to fix it, when sandboxes cannot run here."""
    problem = _probe()
    if problem is not None:
        raise SandboxUnavailable(f"sandbox unavailable: {problem}")


def _bwrap_prefix(*, uid: int, binds: Mapping[str, str], tmpfs_mb: int) -> list[str]:
    setpriv, bwrap = requirements.find_setpriv(), requirements.find_bwrap()
    if setpriv is None or bwrap is None:
        raise SandboxUnavailable(f"sandbox unavailable: setpriv or bwrap is gone; {HOW_TO_FIX}")
    command = [
        setpriv.path, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        bwrap.path, "--unshare-all", "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--proc", "/proc",
        "--dev", "/dev", "--remount-ro", "/dev",  # jobs mount their own /dev/shm
        "--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/work",
        "--size", str(1024 * 1024), "--tmpfs", "/tmp",
    ]  # fmt: skip
    for source, target in binds.items():
        command += ["--ro-bind", source, target]
    # The root bwrap builds (where /task, /harness... are made) is a tmpfs with no size cap:
    # make it read-only so that only the capped /work and /tmp can be written.
    return [*command, "--remount-ro", "/", "--chdir", "/work"]


def _set_limits(limits: Limits, budget: Budget | None) -> Callable[[], None]:
    """What the child runs between fork and exec. The address-space limit comes last: the
    child is a copy of this process (gigabytes of address space once torch is loaded), so
    after it even a small allocation by Python (entering the budget) can fail, and the
    spawn with it ("Exception occurred in preexec_fn", now and then)."""
    mib = 1024 * 1024
    rlimits = [  # built here, not in the child
        (resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s)),
        (resource.RLIMIT_NPROC, (limits.max_processes,) * 2),
        (resource.RLIMIT_FSIZE, (limits.max_file_mb * mib,) * 2),
        (resource.RLIMIT_NOFILE, (limits.max_open_files,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_AS, (limits.memory_mb * mib,) * 2),
    ]

    def apply() -> None:
        if budget is not None:
            budget.enter()
        for which, values in rlimits:
            resource.setrlimit(which, values)

    return apply


@contextmanager
def staged_files(files: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Write `{sandbox path: text}` to a host directory; yield `{host path: sandbox path}`.

    The host paths mirror the sandbox paths, so files staged side by side stay side by side
    (a harness script imports its neighbour, also unsandboxed under the unsafe-local override).
    """
    with tempfile.TemporaryDirectory(prefix="flywheel-sandbox-") as root:
        os.chmod(root, 0o755)
        binds = {}
        for target, text in files.items():
            source = Path(root) / target.lstrip("/")  # the same tree: modules sit side by side
            source.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            source.write_text(text, encoding="utf-8")
            source.chmod(0o444)
            binds[str(source)] = target
        yield binds


def spawn(
    argv: list[str],
    *,
    binds: Mapping[str, str],
    limits: Limits,
    pass_fds: tuple[int, ...],
    keep_output: bool = True,
    budget: Budget | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new sandbox (in `budget`'s cgroup when given); stdout and stderr go
    to one pipe for the caller to drain, or to /dev/null without `keep_output`.

    Under the unsafe-local override there is no isolation beyond rlimits: the sandbox paths
    in `argv` are rewritten to the staged host files.
    """
    if is_unsafe_local():
        host_of = {target: source for source, target in binds.items()}
        command, cwd = [host_of.get(arg, arg) for arg in argv], tempfile.gettempdir()
    else:
        check_available()
        prefix = _bwrap_prefix(uid=next(_UIDS), binds=binds, tmpfs_mb=limits.tmpfs_mb)
        command, cwd = [*prefix, *argv], None
    with _spawned_lock:
        process = subprocess.Popen(
            command,
            env={},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if keep_output else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
            preexec_fn=_set_limits(limits, budget),  # rlimits are set between fork and exec
            start_new_session=True,
        )
        _spawned.add(process.pid)
    return process


@dataclass
class Sandbox:
    """A started sandbox: its bwrap process, reaped here (not by Popen) so that the orphan
    reaper can tell our own children from adopted ones."""

    process: subprocess.Popen[bytes]

    def wait(self, timeout_s: float) -> bool:
        """Reap bwrap within `timeout_s`; True once it has exited."""
        deadline = time.monotonic() + timeout_s
        while self.process.returncode is None:
            pid, status = os.waitpid(self.process.pid, os.WNOHANG)
            if pid:
                self.process.returncode = os.waitstatus_to_exitcode(status)
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
