"""Benchmark: environment episodes in the sandbox — session start, tool-call steps, state,
close — at 1 and at 8 concurrent episodes, with the same calls made in-process (no sandbox)
alongside for scale.

    python -m bench.environment_steps [--episodes 24] [--steps 20] [--concurrency 1 8]

Each episode runs BFCL's (trimmed) file system from tests/fixtures/environments: open a
session (the environment's source exec'd, its scenario loaded), make `--steps` tool calls
(cd, touch, echo, cat, ls, pwd, cd ..: an agent's kind of calls), read the final state,
score it against the ground-truth state (cached after the first episode, as in training) and
close. Episodes run in threads, `concurrency` at a time, as a trainer's rollouts do.

Prints, per concurrency: episodes/s and steps/s over the wall clock, and milliseconds (p50 and
p99) for a session's start, a step, the state read, the reward and the close; then the
environment's milliseconds per episode (start + steps + state + reward + close) — the number
to set against a GRPO step's generation time: with G episodes of a step run 8 at a time, the
environment's share is about env_ms_per_episode x G / 8 / step_ms. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flywheel.sandbox.environment import final_state_reward, ground_truth_state, open_environment
from flywheel.sandbox.process import check_available

FIXTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "environments"
ROOT = {
    "alex": {
        "type": "directory",
        "contents": {
            "document": {
                "type": "directory",
                "contents": {"notes.txt": {"type": "file", "content": "buy milk\n" * 20}},
            },
            "archive": {"type": "directory", "contents": {}},
        },
    }
}
CYCLE = [
    ("cd", {"folder": "document"}),
    ("ls", {}),
    ("cat", {"file_name": "notes.txt"}),
    ("pwd", {}),
    ("cd", {"folder": ".."}),
]


def spec() -> dict[str, Any]:
    return {
        "source": (FIXTURE / "gorilla_file_system.py").read_text(),
        "classes": {"GorillaFileSystem": {"root": ROOT}},
        "ground_truth": [
            [
                {"name": "cd", "arguments": {"folder": "document"}},
                {"name": "touch", "arguments": {"file_name": "todo.txt"}},
                {"name": "echo", "arguments": {"content": "call bob", "file_name": "todo.txt"}},
            ]
        ],
    }


def calls(steps: int) -> list[tuple[str, dict[str, Any]]]:
    """`steps` calls (at least 3): whole cycles back to the root, `pwd`s to fill, then the
    ground truth's three (so that the reward is 1)."""
    cycles, filler = divmod(max(0, steps - 3), len(CYCLE))
    return [
        *CYCLE * cycles,
        *[("pwd", {})] * filler,
        ("cd", {"folder": "document"}),
        ("touch", {"file_name": "todo.txt"}),
        ("echo", {"content": "call bob", "file_name": "todo.txt"}),
    ]


def episode(task: dict[str, Any], steps: int, timings: dict[str, list[float]]) -> float:
    started = time.perf_counter()
    session = open_environment(task)
    timings["start"].append(time.perf_counter() - started)
    for name, arguments in calls(steps):
        before = time.perf_counter()
        result = session.call(name, arguments)
        timings["step"].append(time.perf_counter() - before)
        assert not result.is_error, result.content
    before = time.perf_counter()
    state = session.state()
    timings["state"].append(time.perf_counter() - before)
    before = time.perf_counter()
    reward = final_state_reward(task, state)
    timings["reward"].append(time.perf_counter() - before)
    before = time.perf_counter()
    session.close()
    timings["close"].append(time.perf_counter() - before)
    timings["episode"].append(time.perf_counter() - started)
    return reward


def in_process(task: dict[str, Any], steps: int, episodes: int) -> float:
    """Seconds per step for the same calls on instances made here, unsandboxed."""
    namespace: dict[str, Any] = {"__name__": "environment"}
    exec(compile(task["source"], "environment.py", "exec"), namespace)
    started, made = time.perf_counter(), 0
    for _ in range(episodes):
        system = namespace["GorillaFileSystem"]()
        system._load_scenario(task["classes"]["GorillaFileSystem"])
        for name, arguments in calls(steps):
            getattr(system, name)(**arguments)
            made += 1
    return (time.perf_counter() - started) / made


def ms(values: list[float], quantile: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def run(concurrency: int, episodes: int, steps: int) -> None:
    task = spec()
    timings: dict[str, list[float]] = defaultdict(list)
    with ThreadPoolExecutor(concurrency) as pool:  # warm: a zygote per concurrent episode
        list(pool.map(lambda _: episode(task, steps, defaultdict(list)), range(concurrency)))
        started = time.perf_counter()
        rewards = list(pool.map(lambda _: episode(task, steps, timings), range(episodes)))
        wall_s = time.perf_counter() - started
    print(f"\n{concurrency} concurrent: {episodes} episodes of {steps} steps in {wall_s:.2f} s")
    print(f"  episodes/s {episodes / wall_s:8.1f}   steps/s {episodes * steps / wall_s:8.0f}")
    print(f"  rewards: {sum(rewards):.0f} of {len(rewards)} are 1")
    for part in ("start", "step", "state", "reward", "close", "episode"):
        values = timings[part]
        print(f"  {part:8s} p50 {ms(values, 0.5):8.2f} ms   p99 {ms(values, 0.99):8.2f} ms")
    per_episode = 1000 * statistics.mean(timings["episode"])
    print(f"  environment ms per episode (mean): {per_episode:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    check_available()
    task = spec()
    started = time.perf_counter()
    ground_truth_state(task)
    cold_s = time.perf_counter() - started
    print(f"cold: the ground truth's episode, a zygote started for it: {cold_s:.3f} s")
    step_s = in_process(task, args.steps, 50)
    print(f"in-process (no sandbox): {1e6 * step_s:.1f} us per step")
    for concurrency in args.concurrency:
        run(concurrency, args.episodes, args.steps)


if __name__ == "__main__":
    main()
