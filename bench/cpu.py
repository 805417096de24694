"""The machine's busy CPU time, to tell whether a step's wall time is bound by its work.

A step that kept every core busy cannot be made faster by splitting it further: its busy
core-seconds divided by the cores is the least wall time any split of the same work takes.
Machine-wide (the database server's backends count, and so does anything else running), so
run benchmarks on an otherwise idle machine and read the number as an upper bound of the
step's own work.
"""

from __future__ import annotations

import os

import psutil


def busy_seconds() -> float:
    """Core-seconds every CPU of the machine has spent on work since boot (user, nice,
    system, interrupts; not idle, I/O wait or time stolen by a hypervisor; Linux counts guest
    time inside user)."""
    times = psutil.cpu_times()
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq"))


def work_bound(busy: float, wall: float) -> str:
    """One line: the core-seconds a step kept busy, of those its wall time offered, and the
    least wall time that work takes on this machine's cores."""
    cores = os.cpu_count() or 1
    return (
        f"{busy:.1f} core-s busy of {cores * wall:.1f} ({cores} cores x {wall:.2f} s); "
        f"no split of it over {cores} cores ends before {busy / cores:.2f} s"
    )
