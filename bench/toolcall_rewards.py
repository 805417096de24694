"""Benchmark: tool-call reward checks per second on BFCL's single-turn sets, and their verdicts.

For each task of BFCL's `simple_python`, `parallel`, `multiple` and `parallel_multiple` files
(with `possible_answer/`), in the shape Flywheel stores (`tools` in OpenAI format,
`expected_calls` with lists of acceptable values), `compare_calls` scores three call sets:

1. the ground truth's reference calls (each argument's first acceptable value, optional ones
   omitted), in order and reversed — every one should match;
2. no call at all — none should;
3. a wrong call set (`wrong_calls`: the reference with one argument's value changed to one no
   acceptable value matches, or else a misspelt function name) — none should.

    python -m bench.toolcall_rewards [--data DIR] [--repeat 5]

DIR is the `data/` folder of the `bfcl-eval` wheel (not a Flywheel dependency: unpack it,
e.g. `pip download bfcl-eval --no-deps` and unzip). Prints per set the match rates, the
misses with their reasons, `compare_calls` checks/s over the three call sets, and rewards/s:
`ToolCallReward` on the same call sets written as `<tool_call>` text (parsing included).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from flywheel.sandbox.toolcalls import compare_calls, reference_calls, wrong_calls

SETS = ("simple_python", "parallel", "multiple", "parallel_multiple")
DEFAULT_DATA = Path("/tmp/bfcl/x/bfcl_eval/data")

Task = dict[str, Any]
Calls = list[dict[str, Any]]


def load_set(data: Path, name: str) -> list[Task]:
    """BFCL's tasks of one set with their possible answers, as Flywheel's tool-call tasks."""
    answers = {
        row["id"]: row["ground_truth"]
        for row in map(json.loads, (data / "possible_answer" / f"BFCL_v4_{name}.json").open())
    }
    tasks = []
    for row in map(json.loads, (data / f"BFCL_v4_{name}.json").open()):
        tools = [{"type": "function", "function": _openai_function(f)} for f in row["function"]]
        expected = [
            {"name": fn, "arguments": arguments}
            for call in answers[row["id"]]
            for fn, arguments in call.items()
        ]
        tasks.append({"id": row["id"], "tools": tools, "expected_calls": expected})
    return tasks


def _openai_function(function: dict[str, Any]) -> dict[str, Any]:
    return {**function, "parameters": _object_types(function["parameters"])}


def _object_types(schema: Any) -> Any:
    """BFCL's "dict" types as JSON schema's "object", at any depth."""
    if isinstance(schema, dict):
        converted = {key: _object_types(value) for key, value in schema.items()}
        if converted.get("type") == "dict":
            converted["type"] = "object"
        return converted
    if isinstance(schema, list):
        return [_object_types(item) for item in schema]
    return schema


def run_set(tasks: list[Task], repeat: int) -> dict[str, Any]:
    cases: list[tuple[Task, Calls, Calls, Calls]] = [
        (
            task,
            reference_calls(task["expected_calls"], task["tools"]),
            [],
            wrong_calls(task["expected_calls"], task["tools"]),
        )
        for task in tasks
    ]
    misses: list[str] = []
    accepted = {"empty": 0, "wrong": 0}
    for task, reference, empty, wrong in cases:
        for calls in (reference, reference[::-1]):  # order-free: reversed must match too
            result = compare_calls(calls, task["expected_calls"], task["tools"])
            if not result.matched:
                misses.append(f"{task['id']}: {result.reason}")
        accepted["empty"] += compare_calls(empty, task["expected_calls"], task["tools"]).matched
        accepted["wrong"] += compare_calls(wrong, task["expected_calls"], task["tools"]).matched
    start = time.perf_counter()
    for _ in range(repeat):
        for task, *call_sets in cases:
            for calls in call_sets:
                compare_calls(calls, task["expected_calls"], task["tools"])
    seconds = time.perf_counter() - start
    return {
        **_accuracy(misses, accepted, len(tasks)),
        "checks_per_s": repeat * 3 * len(tasks) / seconds,
        "rewards_per_s": _reward_rate(cases, repeat),
    }


def _reward_rate(cases: list[tuple[Task, Calls, Calls, Calls]], repeat: int) -> float:
    """`ToolCallReward` per second on the call sets written as Qwen / Hermes text (parsing
    included), one batch per repeat, as TRL calls a reward."""
    from finetune.rewards import ToolCallReward

    reward = ToolCallReward()
    completions, expected, tools = [], [], []
    for task, *call_sets in cases:
        for calls in call_sets:
            completions.append("".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls))
            expected.append(task["expected_calls"])
            tools.append(task["tools"])
    kinds = ["tool_call"] * len(completions)
    start = time.perf_counter()
    for _ in range(repeat):
        reward(completions, expected_calls=expected, tools=tools, task_kind=kinds)
    return repeat * len(completions) / (time.perf_counter() - start)


def _accuracy(misses: list[str], accepted: dict[str, int], tasks: int) -> dict[str, Any]:
    return {
        "tasks": tasks,
        "reference_match_rate": 1 - len(misses) / (2 * tasks),
        "empty_accepted": accepted["empty"],
        "wrong_accepted": accepted["wrong"],
        "misses": misses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'set':<18} {'tasks':>5} {'reference':>9} {'empty ok':>8} {'wrong ok':>8} "
        f"{'checks/s':>9} {'rewards/s':>9}"
    )
    for name in SETS:
        report = run_set(load_set(args.data, name), args.repeat)
        print(
            f"{name:<18} {report['tasks']:>5} {report['reference_match_rate']:>9.1%} "
            f"{report['empty_accepted']:>8} {report['wrong_accepted']:>8} "
            f"{report['checks_per_s']:>9.0f} {report['rewards_per_s']:>9.0f}"
        )
        for miss in report["misses"]:
            print(f"    miss {miss}")


if __name__ == "__main__":
    main()
