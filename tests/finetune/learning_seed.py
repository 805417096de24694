"""Which seed a run of the learning tests uses, chosen without importing anything heavy (the
test session's header prints it: tests/conftest.py).

The learning tests hold for every seed of the calibration table; CI runs one, chosen from the
commit, so that over many commits every seed runs and a threshold that holds for one seed only
shows up. `FLYWHEEL_LEARNING_SEED` picks one by hand (to reproduce a failure).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SEED_VARIABLE = "FLYWHEEL_LEARNING_SEED"
SEEDS = (0, 1, 2, 3, 4)
"""The calibration table's seeds (bench/calibrate_learning.py --seeds 0 1 2 3 4)."""


def chosen_seed() -> tuple[int, str]:
    """The seed of this run and why: FLYWHEEL_LEARNING_SEED if set, else the current git commit
    (its hash mod the table's seeds), else seed 0 with a note."""
    if (value := os.environ.get(SEED_VARIABLE)) is not None:
        try:
            seed = int(value)
        except ValueError:
            raise ValueError(f"{SEED_VARIABLE} must be an integer, not {value!r}") from None
        note = "" if seed in SEEDS else f" (not one of the calibrated seeds {SEEDS})"
        return seed, f"from {SEED_VARIABLE}={value}{note}"
    commit = _git_head()
    if commit is None:
        return SEEDS[0], f"seed {SEEDS[0]}: git unavailable, so no commit to choose a seed from"
    seed = SEEDS[int(commit, 16) % len(SEEDS)]
    return seed, f"from commit {commit[:12]} (hash mod {len(SEEDS)} seeds {SEEDS})"


def _git_head() -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = result.stdout.strip()
    try:
        int(commit, 16)
    except ValueError:
        return None
    return commit if result.returncode == 0 else None
