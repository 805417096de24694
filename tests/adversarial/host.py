"""What the host sees of sandboxes: their processes and their memory, read from /proc."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

SANDBOX_UID_MIN = 200_000


def _status(pid: str) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def sandbox_processes() -> dict[int, dict[str, str]]:
    """Our descendants, running or zombie, under a sandbox uid, with their /proc status.

    Only this test process's own tree counts: another Flywheel on the machine has its own.
    """
    statuses = {int(pid): _status(pid) for pid in os.listdir("/proc") if pid.isdigit()}
    parent = {pid: int(status.get("PPid", "0")) for pid, status in statuses.items() if status}

    def is_ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parent.get(pid, 0)
        return False

    return {
        pid: status
        for pid, status in statuses.items()
        if status and int(status["Uid"].split()[0]) >= SANDBOX_UID_MIN and is_ours(pid)
    }


def sandbox_rss_mb() -> float:
    """Resident memory of all our sandbox processes together, in MB."""
    kib = sum(
        int(status.get("VmRSS", "0 kB").split()[0]) for status in sandbox_processes().values()
    )
    return kib / 1024


class PeakRss:
    """Samples `sandbox_rss_mb` every few milliseconds while in its `with` block."""

    def __init__(self, every_s: float = 0.01) -> None:
        self.every_s = every_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak_mb = max(self.peak_mb, sandbox_rss_mb())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
