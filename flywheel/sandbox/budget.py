"""One memory and process budget per sandbox, covering every process the candidate starts.

rlimits hold per process: six children of 400 MB each fit under a 512 MB RLIMIT_AS. Where the
host lets us, each warm sandbox lives in a cgroup of its own (cgroup v2, or v1's memory and
pids controllers); it runs one job at a time, so before each job its limits are set to the
sandbox's idle use plus the job's budget; the cgroup says the job's peak memory and whether
the kernel killed anything for memory, and after the job whether any process outlived it.
Candidate processes ask to be the OOM killer's first choice, so the sandbox's own processes
survive a job that overruns.

Where no cgroup can be made, `fallback_limits` derives per-process rlimits so that processes
x address space never exceeds the budget: fewer processes, each with a share of the memory.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from flywheel.sandbox.limits import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")
MIB = 1024 * 1024
FALLBACK_PROCESS_MB = 64
"""Without cgroups, each process gets at least this much address space (Python with a
thread starts in 24 MB here), and the process count is cut to fit the budget."""

_NAMES = itertools.count()
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobUsage:
    peak_memory_mb: float
    is_oom_killed: bool


@dataclass(frozen=True)
class _Layout:
    """Where this process may make sandbox cgroups: one directory per controller
    (one for both under v2), each under this process's own cgroup."""

    version: int
    memory: Path
    pids: Path


class Budget:
    """The cgroup(s) of one warm sandbox. `enter` runs in the child before exec."""

    def __init__(self, layout: _Layout) -> None:
        name = f"sandbox-{next(_NAMES)}"
        self.version = layout.version
        self.memory = layout.memory / name
        self.pids = layout.pids / name
        for directory in {self.memory, self.pids}:
            directory.mkdir()
        self._procs = [str(path / "cgroup.procs") for path in {self.memory, self.pids}]
        # Read on every job: kept as plain strings (pathlib costs more than the read itself).
        v2 = self.version == 2
        self._usage_file = str(self.memory / ("memory.current" if v2 else "memory.usage_in_bytes"))
        self._peak_file = str(self.memory / ("memory.peak" if v2 else "memory.max_usage_in_bytes"))
        self._oom_file = str(self.memory / ("memory.events" if v2 else "memory.oom_control"))
        self._pids_file = str(self.pids / "pids.current")
        self._baseline_bytes = 0
        self._baseline_processes = 0
        self._oom_kills = 0
        self._limited_to: tuple[int, int, int] | None = None
        self.held_processes = 0
        """Processes the sandbox keeps between jobs on purpose (a child made ready for the
        next job), as it last reported them: never a job's leftovers."""

    def enter(self) -> None:
        """Move the calling process into this budget (called between fork and exec)."""
        for procs in self._procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def start_job(self, limits: Limits, *, extra_processes: int = 0) -> None:
        """Limit the sandbox to its idle use plus the job's memory and processes (and
        `extra_processes` the sandbox itself starts meanwhile), and start counting the job's
        peak memory and OOM kills."""
        self._baseline_bytes = self._memory_usage()
        self._oom_kills = self._oom_kill_count()
        # Reset the peak counter (v2's memory.peak is resettable from kernel 6.12 on).
        _write(Path(self._peak_file), "0", missing_ok=self.version == 2)
        self.limit(limits, extra_processes=extra_processes)

    def limit(self, limits: Limits, *, extra_processes: int = 0) -> None:
        """Set the limits, over the sandbox's use now, unless the last job's were the same."""
        if self._limited_to == (limits.memory_mb, limits.max_processes, extra_processes):
            return
        self._baseline_processes = self.processes() - self.held_processes
        budget = self._memory_usage() + limits.memory_mb * MIB
        if self.version == 2:
            _write(self.memory / "memory.swap.max", "0")
            _write(self.memory / "memory.max", str(budget))
        else:
            self._set_v1_memory_limit(budget)
        processes = self._baseline_processes + self.held_processes + limits.max_processes
        _write(self.pids / "pids.max", str(processes + extra_processes))
        self._limited_to = (limits.memory_mb, limits.max_processes, extra_processes)

    def job_usage(self) -> JobUsage:
        """The running (or just finished) job's peak memory and whether it was OOM-killed."""
        peak = _read_int(self._peak_file, default=-1)
        if peak < 0:  # no peak counter (cgroup v2 before kernel 5.19): the use now
            peak = self._memory_usage()
        return JobUsage(
            peak_memory_mb=max(0, peak - self._baseline_bytes) / MIB,
            is_oom_killed=self.is_overrun(),
        )

    def leftover_processes(self) -> int:
        """Processes in the sandbox's cgroup beyond those it had before the job and those it
        holds for the next one (0 is clean)."""
        return max(0, self.processes() - self._baseline_processes - self.held_processes)

    def is_overrun(self) -> bool:
        """Whether the kernel has killed a process of the running job for memory."""
        return self._oom_kill_count() > self._oom_kills

    def processes(self) -> int:
        return _read_int(self._pids_file, default=0)

    def remove(self) -> bool:
        """Remove the cgroup(s); False while a process (a zombie not yet reaped included) is
        still in one, which rmdir refuses."""
        for directory in {self.memory, self.pids}:
            with contextlib.suppress(FileNotFoundError):
                try:
                    directory.rmdir()
                except OSError:
                    return False
        return True

    def _memory_usage(self) -> int:
        return _read_int(self._usage_file, default=0)

    def _oom_kill_count(self) -> int:
        fields = dict(
            line.split() for line in _read(self._oom_file).splitlines() if len(line.split()) == 2
        )
        return int(fields.get("oom_kill", 0))

    def _set_v1_memory_limit(self, budget: int) -> None:
        """memory+swap may never be below memory: raise it first, lower it last."""
        swap = self.memory / "memory.memsw.limit_in_bytes"
        limit = self.memory / "memory.limit_in_bytes"
        order = [swap, limit] if _read_int(str(limit), default=0) < budget else [limit, swap]
        for path in order:
            if path.exists():
                _write(path, str(budget))


def make_budget() -> Budget | None:
    """A budget for a new sandbox, or None where this host gives us no cgroups."""
    layout = _layout()
    return Budget(layout) if layout is not None else None


def remove_parents() -> None:
    """At exit: remove this process's sandbox cgroups that are empty by now, then their parent."""
    layout = _layout()
    if layout is None:
        return
    for parent in {layout.memory, layout.pids}:
        for directory in [*parent.glob("sandbox-*"), parent]:
            with contextlib.suppress(OSError):
                directory.rmdir()


def describe() -> str:
    """How sandboxes are held to their memory budget here."""
    layout = _layout()
    if layout is None:
        return f"per-process rlimits (no writable cgroup here; {FALLBACK_PROCESS_MB} MB floor)"
    return f"cgroup v{layout.version} per sandbox ({layout.memory.parent})"


def fallback_limits(limits: Limits) -> tuple[int, int]:
    """(processes, address space MB per process) with processes x memory <= the budget."""
    processes = max(1, min(limits.max_processes, limits.memory_mb // FALLBACK_PROCESS_MB))
    return processes, limits.memory_mb // processes


@functools.cache
def _layout() -> _Layout | None:
    """This process's cgroup directories for sandboxes, made once, or None without them."""
    own = _own_cgroups()
    candidates: list[_Layout] = []
    if "" in own and (CGROUP_ROOT / "cgroup.controllers").exists():
        base = CGROUP_ROOT / own[""].lstrip("/")
        candidates.append(_Layout(2, base, base))
    if "memory" in own and "pids" in own:
        candidates.append(
            _Layout(
                1,
                CGROUP_ROOT / "memory" / own["memory"].lstrip("/"),
                CGROUP_ROOT / "pids" / own["pids"].lstrip("/"),
            )
        )
    for layout in candidates:
        made = _make_parent(layout)
        if made is not None:
            return made
    log.warning(
        "sandbox: no writable cgroup (v2 with memory and pids delegated, or v1's memory and "
        "pids); each candidate's memory budget is split into per-process rlimits instead"
    )
    return None


def _own_cgroups() -> dict[str, str]:
    """{controller: path} from /proc/self/cgroup; "" is the v2 hierarchy."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _make_parent(layout: _Layout) -> _Layout | None:
    """A directory of this process's own under each controller, or None if not allowed."""
    name = f"flywheel-{os.getpid()}"
    try:
        if layout.version == 2:
            enabled = (layout.memory / "cgroup.subtree_control").read_text().split()
            if not {"memory", "pids"} <= set(enabled):
                return None  # enabling them would need this process out of its own cgroup
        made = _Layout(layout.version, layout.memory / name, layout.pids / name)
        for directory in {made.memory, made.pids}:
            directory.mkdir(exist_ok=True)
        if layout.version == 2:
            _write(made.memory / "cgroup.subtree_control", "+memory +pids")
        probe = Budget(made)
        probe.remove()
        return made
    except OSError:
        return None


def _write(path: Path, text: str, *, missing_ok: bool = False) -> None:
    try:
        path.write_text(text)
    except FileNotFoundError:
        if not missing_ok:
            raise


def _read(path: str) -> str:
    with open(path, "rb", buffering=0) as file:
        return file.read().decode()


def _read_int(path: str, *, default: int) -> int:
    try:
        text = _read(path).strip()
    except OSError:
        return default
    return int(text) if text.isdigit() else default
