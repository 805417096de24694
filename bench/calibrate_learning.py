"""Calibrate the learning-signal tests: run their exact chain over several seeds, print a table.

    OMP_NUM_THREADS=1 python -m bench.calibrate_learning --seeds 0 1 2 3 4

A script, not a test (it lives in bench/, outside the test suite). The settings, the steps and
the thresholds are imported from tests/finetune/learning_chain.py, the module the test
(tests/finetune/test_learning.py) runs, so what this prints is what the test asserts on. Per
seed: base, SFT and SFT-adapter-off held-out exact match; DPO preference accuracy (adapter
on/off); SFT greedy EM -> GRPO greedy EM and sampled reward, GRPO adapter off, the training
reward's first and last log and dynamic sampling's filtered share; wall seconds per phase.
Then each threshold against the worst seed, with its margin (negative: the test would fail).

`--grpo KEY=VALUE ...` adds GRPO overrides on top of the test's (experiments only: the table
then is not the test's, and says so). `--cache DIR` keeps each seed's base and SFT adapter
there and reuses them (for GRPO experiments; a fresh calibration leaves it out).
One thread: these matrices are too small to share, and on a busy 2-core box two OpenMP
threads made a step 15-20x slower.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # also runs as a plain script: python bench/calibrate_learning.py
    sys.path.insert(0, str(ROOT))

import datasets  # noqa: E402 - after the path set-up, with the chain
import torch  # noqa: E402
import transformers  # noqa: E402

from tests.finetune import learning_chain as chain  # noqa: E402 - needs the repository root

# (threshold field, metric, direction): "min" -> metric >= threshold, "max" -> metric < threshold,
# "lift" -> metric - baseline >= threshold, "near" -> |metric - baseline| <= threshold,
# "fall" -> baseline - metric <= threshold
CHECKS: list[tuple[str, str, str, str | None]] = [
    ("base_em_max", "base_em", "max", None),
    ("sft_em_min", "sft_em", "min", None),
    ("disabled_em_tolerance", "sft_disabled_em", "near", "base_em"),
    ("dpo_accuracy_min", "dpo_accuracy", "min", None),
    ("grpo_em_lift_min", "grpo_greedy_em", "lift", "sft_greedy_em"),
    ("grpo_reward_lift_min", "grpo_reward", "lift", "sft_reward"),
    ("disabled_reward_tolerance", "grpo_disabled_reward", "near", "sft_reward"),
    ("grpo_broad_em_fall_max", "grpo_broad_em", "fall", "sft_broad_em"),
]
COLUMNS = [
    ("base_em", "base EM"),
    ("sft_em", "SFT EM"),
    ("sft_disabled_em", "SFT off"),
    ("dpo_accuracy", "DPO acc"),
    ("dpo_disabled_accuracy", "DPO off"),
    ("sft_greedy_em", "SFT greedy"),
    ("grpo_greedy_em", "GRPO greedy"),
    ("sft_reward", "SFT reward"),
    ("grpo_reward", "GRPO reward"),
    ("grpo_disabled_reward", "GRPO off"),
    ("sft_broad_em", "SFT broad"),
    ("grpo_broad_em", "GRPO broad"),
    ("train_reward_first", "train r0"),
    ("train_reward_last", "train rN"),
    ("filtered_share", "filtered"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(chain.SEEDS))
    parser.add_argument("--phases", default="sft,dpo,grpo", help="grpo needs sft")
    parser.add_argument("--grpo", nargs="*", default=[], help="extra GRPO overrides")
    parser.add_argument(
        "--grpo-broad-every", type=int, default=chain.GRPO_BROAD_EVERY, help="0: carries only"
    )
    parser.add_argument("--cache", type=Path, default=None, help="reuse bases and SFT adapters")
    return parser.parse_args()


def timed(label: str, wall: dict[str, float], step: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = step()
    wall[label] = time.perf_counter() - start
    return result


def run_seed(seed: int, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    """Every number of one seed, as the test computes it, plus wall seconds per phase."""
    phases = args.phases.split(",")
    cache = (args.cache / f"seed-{seed}") if args.cache else scratch / f"seed-{seed}"
    wall: dict[str, float] = {}
    found: dict[str, float] = {}
    base = cache / "base"
    if not (base / "config.json").exists():
        timed("base", wall, lambda: chain.build_base(base, seed))
    adapter = cache / "sft" / "job" / "adapter"
    if "sft" in phases:
        if not (adapter / "adapter_config.json").exists():
            timed("sft", wall, lambda: chain.train_sft(base, cache / "sft", seed))
        found |= chain.measure_sft(base, adapter)
    if "dpo" in phases:
        found |= timed("dpo", wall, lambda: chain.run_dpo(base, scratch / f"dpo-{seed}", seed))
    if "grpo" in phases:
        root = scratch / f"grpo-{seed}"
        found |= timed("grpo", wall, lambda: grpo(base, adapter, root, seed, args))
    found |= {f"wall_{key}_s": value for key, value in wall.items()}
    found["wall_s"] = sum(wall.values())
    print(f"seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in found.items()), flush=True)
    return found


def grpo(base: Path, adapter: Path, root: Path, seed: int, args: argparse.Namespace) -> Any:
    return chain.run_grpo(base, adapter, root, seed, args.grpo, broad_every=args.grpo_broad_every)


def print_table(rows: dict[int, dict[str, float]]) -> None:
    shown = [(key, title) for key, title in COLUMNS if any(key in r for r in rows.values())]
    walls = sorted({key for r in rows.values() for key in r if key.startswith("wall_")})
    print("\n| seed | " + " | ".join(t for _, t in shown) + " | " + " | ".join(walls) + " |")
    print("|---" * (1 + len(shown) + len(walls)) + "|")
    for seed, row in rows.items():
        cells = [_cell(row.get(key)) for key, _ in shown] + [_cell(row.get(w), 0) for w in walls]
        print(f"| {seed} | " + " | ".join(cells) + " |")


def print_margins(rows: dict[int, dict[str, float]]) -> None:
    """Each threshold against the worst seed: the margin is how far the worst seed clears it."""
    print("\n| threshold | value | worst seed | worst | margin |")
    print("|---|---|---|---|---|")
    for name, metric, kind, baseline in CHECKS:
        limit = getattr(chain.THRESHOLDS, name)
        clearances = {
            seed: _clearance(row, metric, kind, baseline, limit)
            for seed, row in rows.items()
            if metric in row
        }
        if not clearances:
            continue
        worst = min(clearances, key=lambda s: clearances[s])
        shown = _observed(rows[worst], metric, kind, baseline)
        print(f"| {name} ({kind}) | {limit} | {worst} | {shown:.3f} | {clearances[worst]:+.3f} |")


def _observed(row: dict[str, float], metric: str, kind: str, baseline: str | None) -> float:
    if kind == "lift":
        return row[metric] - row[str(baseline)]
    if kind == "near":
        return abs(row[metric] - row[str(baseline)])
    if kind == "fall":
        return row[str(baseline)] - row[metric]
    return row[metric]


def _clearance(
    row: dict[str, float], metric: str, kind: str, baseline: str | None, limit: float
) -> float:
    observed = _observed(row, metric, kind, baseline)
    return limit - observed if kind in ("max", "near", "fall") else observed - limit


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    print(f"seeds {args.seeds}; GRPO overrides {chain.grpo_overrides(0)[6:]}")
    if args.grpo or args.grpo_broad_every != chain.GRPO_BROAD_EVERY:
        print(
            f"EXPERIMENT, not the test's settings: GRPO overrides {args.grpo} on top, "
            f"GRPO on the carries and every {args.grpo_broad_every}th broad problem"
        )
    rows: dict[int, dict[str, float]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["FLYWHEEL_HOME"] = str(Path(scratch) / "home")
        for seed in args.seeds:
            rows[seed] = run_seed(seed, args, Path(scratch))
    print_table(rows)
    print_margins(rows)
    print(f"\nwhole script {time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    main()
