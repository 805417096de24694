"""Write the demo's input files: what `flywheel demo` ingests with the ordinary commands.

    write_arithmetic(dir, batch=1, quick=False)  # [dir/arithmetic-feedback-1.jsonl]
    write_support(dir)        # [dir/support-tickets.csv, dir/support-feedback.jsonl]
    write_repository(dir)     # dir/invoicing: a git repository with tests

    flywheel ingest feedback arithmetic-feedback-1.jsonl --domain arithmetic
    flywheel ingest tickets support-tickets.csv --format csv --domain support
    flywheel ingest feedback support-feedback.jsonl --domain support
    flywheel ingest repo invoicing --domain code --history 2

Every writer is deterministic: the same arguments give the same bytes (the repository's
commits included: fixed author, committer and dates).

`arithmetic_plan(quick=...)` is how the arithmetic domain was calibrated to learn through the
real CLI on 2 CPU cores: the base model's pretraining steps, the domain's `cycle` settings
(SFT overrides, eval options, dataset recipe), its gate and its primary metric.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flywheel.demo import arithmetic_feedback, repository, support
from flywheel.demo.arithmetic import SKILL_RULES

ARITHMETIC_DOMAIN = "arithmetic"
SUPPORT_DOMAIN = "support"
CODE_DOMAIN = "code"


# Measured through the CLI (init, ingest, compile, dataset build, train sft, eval, promote;
# seeds 0-3): base -> v1 -> v2 held-out exact match about 0.4 -> 0.8-0.93 on batch 1's eval
# set, and v1 -> v2 about 0.45 -> 0.75-0.87 on the grown eval set (batch 2 carries into the
# hundreds, which v1 never saw); every gate passed. Training steps cost ~0.03-0.1 s each: the
# time goes to starting the trainer and evaluator subprocesses, not to training.
SFT_OVERRIDES = (
    "max_steps=100",
    "learning_rate=0.005",
    "per_device_train_batch_size=32",
    "lora.r=16",
    "lora.alpha=32",
    "max_length=64",
    "warmup_ratio=0.05",
    "save_steps=100",
    "logging_steps=10",
)


def arithmetic_plan(*, quick: bool) -> dict[str, Any]:
    """Settings for the arithmetic domain: `pretrain_steps` for `python -m finetune.tiny`,
    and the domain config (`primary_metric`, `gate`, `cycle`, `slice_rules`).

    The primary metric is exact match (the held-out sums answered right); preference accuracy
    moves as well. Both demos keep the gate's defaults, `min_items` 30 included: the eval
    split (drawn by hash, per prompt) gets ~60 of batch 1's SFT items, a tenth of the full
    demo's prompts and a fifth of the quick one's (its batch 1 is half as large), so a draw
    below 30 is a 4-sigma event. Pretraining steps stay at 800 for quick too: 600 saved 5 s
    and left the second cycle's win marginal (interval low end +0.03 in one run).
    `slice_rules` label the sums `skill:carry` and `skill:no-carry`, so the gate judges the
    sums the base already solved apart from the new skill.
    """
    return {
        "pretrain_steps": 800,
        "primary_metric": "exact_match",
        "gate": {},
        "slice_rules": dict(SKILL_RULES),
        "cycle": {
            "methods": ["sft"],
            "overrides": {"sft": list(SFT_OVERRIDES)},
            "eval": {"max_new_tokens": 6, "k": 1},
            # every earlier train item replayed: the second adapter learns the hundreds
            # without forgetting the two-digit carries (at the default 0.25 it forgot them)
            "recipe": {"eval_fraction": 0.2 if quick else 0.1, "replay_fraction": 1.0},
        },
    }


def write_arithmetic(directory: Path, *, batch: int, quick: bool) -> list[Path]:
    """The arithmetic domain's feedback for cycle `batch` (1, then 2: the "more feedback"
    posted before the second cycle). `quick`: the smaller batches of the CI smoke."""
    path = Path(directory) / f"arithmetic-feedback-{batch}.jsonl"
    write_jsonl(path, arithmetic_feedback.feedback_events(batch, quick=quick))
    return [path]


def write_support(directory: Path) -> list[Path]:
    """A helpdesk's ticket export (CSV, columns named as `flywheel ingest tickets --format
    csv` expects without a mapping) and feedback on the support assistant's answers."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tickets = directory / "support-tickets.csv"
    tickets.write_text(support.tickets_csv(), encoding="utf-8", newline="")
    feedback = directory / "support-feedback.jsonl"
    write_jsonl(feedback, support.feedback_events())
    return [tickets, feedback]


def write_repository(directory: Path) -> Path:
    """A small Python project with unit tests, committed to git in two commits (the second
    adds a function with its test: a task from history)."""
    return repository.write(Path(directory) / "invoicing")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8", newline="")
