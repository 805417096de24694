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
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ingest.demo import arithmetic, repository, support

ARITHMETIC_DOMAIN = "arithmetic"
SUPPORT_DOMAIN = "support"
CODE_DOMAIN = "code"


def write_arithmetic(directory: Path, *, batch: int, quick: bool) -> list[Path]:
    """The arithmetic domain's feedback for cycle `batch` (1, then 2: the "more feedback"
    posted before the second cycle). `quick`: the smaller batches of the CI smoke."""
    path = Path(directory) / f"arithmetic-feedback-{batch}.jsonl"
    write_jsonl(path, arithmetic.feedback_events(batch, quick=quick))
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
