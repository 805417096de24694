"""One memory and process budget per candidate, whatever number of processes it starts,
measured from the host."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import pytest

from flywheel.sandbox import Limits, budget, run_tests
from flywheel.sandbox.process import SANDBOX_PYTHON, spawn
from flywheel.sandbox.rewards import CodeReward
from flywheel.sandbox.warm import close_pools
from tests.adversarial.host import PeakRss

TESTS = "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
LIMITS = Limits(wall_s=8, call_timeout_s=6, memory_mb=512)


def fan_out(children: int, mb: int) -> str:
    """A solution whose `add` forks `children` processes that each touch `mb` MB and hold it."""
    return f"""
import os, time

def add(a, b):
    pids = []
    for _ in range({children}):
        pid = os.fork()
        if pid == 0:
            try:
                hog = bytearray({mb} * 2**20)
                for page in range(0, len(hog), 4096):
                    hog[page] = 1
                time.sleep(2)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return a + b
"""


@pytest.fixture
def without_cgroups(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Sandboxes started as on a host that gives no cgroups."""
    close_pools()
    monkeypatch.setattr(budget, "make_budget", lambda: None)
    monkeypatch.setattr("flywheel.sandbox.warm.make_budget", lambda: None)
    yield
    close_pools()


def test_this_host_gives_each_sandbox_a_cgroup() -> None:
    """The machines here have v1 memory and pids controllers: the tests below measure the
    cgroup path, not the fallback (which has its own test)."""
    assert budget.describe().startswith("cgroup v"), budget.describe()


def test_a_process_fan_out_is_held_to_one_budget() -> None:
    """Six children of 400 MB each under a 512 MB budget: before, all six fit (2.4 GB)."""
    close_pools()  # an earlier test's sandbox, still ending, is not this job's memory
    with PeakRss() as host:
        verdict = run_tests(fan_out(6, 400), TESTS, entry_point="add", limits=LIMITS)

    assert not verdict.is_passed
    assert verdict.reason == "memory", verdict
    assert host.peak_mb < 2 * LIMITS.memory_mb, host.peak_mb


def test_concurrent_fan_outs_each_stay_in_their_own_budget() -> None:
    reward = CodeReward(limits=LIMITS, max_workers=3)
    close_pools()
    with PeakRss() as host:
        scores = reward([fan_out(6, 400)] * 3, tests=[TESTS] * 3, entry_point=["add"] * 3)

    assert scores == [0.0, 0.0, 0.0]
    assert host.peak_mb < 3 * 2 * LIMITS.memory_mb, host.peak_mb


def test_peak_memory_is_the_whole_candidates() -> None:
    """Five children of 60 MB each, within budget: the peak is theirs together, not one's."""
    verdict = run_tests(fan_out(5, 60), TESTS, entry_point="add", limits=LIMITS)

    assert verdict.is_passed, verdict
    assert verdict.peak_memory_mb >= 5 * 60 * 0.9, verdict.peak_memory_mb


def test_the_process_budget_covers_the_whole_candidate() -> None:
    solution = (
        "import os, time\ndef add(a, b):\n    made = 0\n    try:\n"
        "        while True:\n            if os.fork() == 0:\n                time.sleep(5)\n"
        "                os._exit(0)\n            made += 1\n    except OSError:\n"
        "        return made\n"
    )
    tests = (
        "from solution import add\n\ndef test_count():\n"
        f"    assert 0 < add(0, 0) <= {LIMITS.max_processes}\n"
    )

    assert run_tests(solution, tests, entry_point="add", limits=LIMITS).is_passed


@pytest.mark.usefixtures("without_cgroups")
def test_without_cgroups_processes_times_memory_stays_within_the_budget() -> None:
    processes, per_process_mb = budget.fallback_limits(LIMITS)
    assert processes * per_process_mb <= LIMITS.memory_mb

    with PeakRss() as host:  # each child fails to allocate: MemoryError, then exits
        run_tests(fan_out(6, 400), TESTS, entry_point="add", limits=LIMITS)

    assert host.peak_mb < 2 * LIMITS.memory_mb, host.peak_mb
    honest = run_tests("def add(a, b):\n    return a + b\n", TESTS, entry_point="add")
    assert honest.is_passed, honest


def test_sandbox_cgroups_are_removed_with_their_sandboxes() -> None:
    assert run_tests("def add(a, b):\n    return a + b\n", TESTS, entry_point="add").is_passed
    layout = budget._layout()
    assert layout is not None
    assert list(layout.memory.glob("sandbox-*"))

    close_pools()

    assert list(layout.memory.glob("sandbox-*")) == []
    assert list(layout.pids.glob("sandbox-*")) == []


class _AllocatingBudget:
    """A real budget whose entering allocates 64 MiB first (more than malloc serves from its
    heap), as Python may need new memory at any call there (a new arena for the path it
    writes): what made starts fail now and then in the learning test, whose process had
    gigabytes of address space (torch loaded)."""

    def __init__(self, real: budget.Budget) -> None:
        self.real = real

    def enter(self) -> None:
        bytearray(64 << 20)
        self.real.enter()


CHILD = """
print(len(bytearray(64 << 20)) >> 20)
try:
    bytearray(512 << 20)
except MemoryError:
    print("MemoryError")
"""


def test_a_large_host_process_starts_sandboxes_whose_address_space_is_small() -> None:
    """Before, the address-space limit was set first in the forked child: with the parent
    over it, entering the budget raised MemoryError and the spawn failed."""
    real = budget.make_budget()
    assert real is not None
    reserved = mmap.mmap(-1, 2 << 30)  # 2 GiB of address space in this process, not touched
    try:
        process = spawn(
            [SANDBOX_PYTHON, "-I", "-S", "-c", CHILD],
            binds={},
            limits=Limits(memory_mb=256),
            pass_fds=(),
            budget=_AllocatingBudget(real),  # type: ignore[arg-type]
        )
        output, _ = process.communicate(timeout=30)
        assert process.returncode == 0, output
        assert output.split() == [b"64", b"MemoryError"]  # and its own limit holds
    finally:
        reserved.close()
        real.remove()
