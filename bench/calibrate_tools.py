"""Calibrate the demo's tool domain: run its learning chain over several seeds, print a table.

    OMP_NUM_THREADS=1 python -m bench.calibrate_tools --seeds 0 1 2 3 4

A script, not a test. The chain, its settings and the thresholds are tests/finetune/tool_chain.py's,
the module tests/finetune/test_demo_tools.py runs, so what this prints is what the test asserts
on. Per seed: held-out environment success of the base (pretrained on lookups only), of SFT on
a few cancellation demonstrations, of GRPO in the sandboxed order desk on top of SFT, and of
the GRPO model with its adapter off (== SFT); wall seconds per phase. Then each threshold
against the worst seed, with its margin (negative: the test would fail).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # also runs as a plain script
    sys.path.insert(0, str(ROOT))

import datasets  # noqa: E402 - after the path set-up
import torch  # noqa: E402
import transformers  # noqa: E402

from tests.finetune import tool_chain as chain  # noqa: E402 - needs the repository root

COLUMNS = ("base", "sft", "grpo", "grpo_off")
# (threshold, metric, baseline, kind): max: metric <= t; lift: metric - baseline >= t;
# near: |metric - baseline| <= t
CHECKS = [
    ("base_success_max", "base", None, "max"),
    ("sft_lift_min", "sft", "base", "lift"),
    ("grpo_lift_min", "grpo", "sft", "lift"),
    ("disabled_tolerance", "grpo_off", "sft", "near"),
]


def observed(row: dict[str, float], metric: str, baseline: str | None, kind: str) -> float:
    if kind == "lift":
        return row[metric] - row[str(baseline)]
    if kind == "near":
        return abs(row[metric] - row[str(baseline)])
    return row[metric]


def print_table(rows: dict[int, dict[str, float]], walls: dict[int, dict[str, float]]) -> None:
    phases = sorted({key for wall in walls.values() for key in wall})
    print("\n| seed | " + " | ".join(COLUMNS) + " | GRPO - SFT | "
          + " | ".join(f"{p} s" for p in phases) + " |")  # fmt: skip
    print("|---" * (2 + len(COLUMNS) + len(phases)) + "|")
    for seed, row in rows.items():
        cells = [f"{row[c]:.3f}" for c in COLUMNS] + [f"{row['grpo'] - row['sft']:+.3f}"]
        cells += [f"{walls[seed].get(p, 0):.0f}" for p in phases]
        print(f"| {seed} | " + " | ".join(cells) + " |")


def print_margins(rows: dict[int, dict[str, float]]) -> None:
    print("\n| threshold | value | worst seed | worst | margin |")
    print("|---|---|---|---|---|")
    for name, metric, baseline, kind in CHECKS:
        limit = getattr(chain.THRESHOLDS, name)
        clear = {
            seed: (limit - observed(row, metric, baseline, kind))
            if kind in ("max", "near")
            else (observed(row, metric, baseline, kind) - limit)
            for seed, row in rows.items()
        }
        worst = min(clear, key=lambda seed: clear[seed])
        value = observed(rows[worst], metric, baseline, kind)
        print(f"| {name} ({kind}) | {limit} | {worst} | {value:.3f} | {clear[worst]:+.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(chain.SEEDS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    rows: dict[int, dict[str, float]] = {}
    walls: dict[int, dict[str, float]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["FLYWHEEL_HOME"] = str(Path(scratch) / "home")
        for seed in args.seeds:
            walls[seed] = {}
            rows[seed] = chain.run_chain(Path(scratch) / f"seed-{seed}", seed, walls[seed])
            print(f"seed {seed}: {rows[seed]} {walls[seed]}", flush=True)
    print_table(rows, walls)
    print_margins(rows)
    print(f"\nwhole script {time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    main()
