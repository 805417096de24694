"""What one sandboxed run may use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits; each process in the sandbox is held to them."""

    wall_s: float = 10.0
    """Wall clock for the whole run; then every process of both sandboxes is killed."""
    call_timeout_s: float = 5.0
    """How long one call into the candidate may take before the test fails with a timeout."""
    cpu_s: int = 10
    memory_mb: int = 512
    """Address space per process."""
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64 * 1024
    """Captured stdout+stderr per sandbox; past it the sandbox is killed (`output_limit`)."""
    tmpfs_mb: int = 64
    """Size of the private, writable /work directory."""
