"""What one sandboxed run may use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one candidate, with every process it starts, may use."""

    wall_s: float = 10.0
    """Wall clock for the whole run; then every process of both sandboxes is killed."""
    call_timeout_s: float = 5.0
    """How long one call into the candidate may take before the test fails with a timeout."""
    cpu_s: int = 10
    memory_mb: int = 512
    """Memory for the whole candidate (all its processes, its tmpfs files included) where the
    host gives cgroups; otherwise split into per-process address space (see budget.py). Each
    process is also held to it as address space, so one process overrunning gets a
    MemoryError rather than the OOM killer."""
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64 * 1024
    """Captured stdout+stderr per sandbox; past it the sandbox is killed (`output_limit`)."""
    tmpfs_mb: int = 64
    """Size of the private, writable /work directory."""
    scratch_mb: int = 8
    """Size of each of the candidate's private /tmp and /dev/shm."""
