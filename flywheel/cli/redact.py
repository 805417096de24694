"""`flywheel redact`: what the redaction engine would store for a text, and why."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flywheel.cli.common import JsonOption
from flywheel.errors import InvalidInput

if TYPE_CHECKING:
    from flywheel.redaction import Redaction


def redact(
    path: str = typer.Argument(..., metavar="FILE|-", help="A UTF-8 text file, or - for stdin."),
    names: list[str] = typer.Option(
        [], "--name", "-n", help="A person name the source knows (repeatable)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Print the text as it would be stored: PII and secrets replaced by realistic
    surrogates (the same value is the same surrogate throughout), and the report (counts per
    type) on stderr, or both as one JSON object with --json."""
    from flywheel.redaction import redact as redact_text

    result = redact_text(_read(path), names=names)
    if as_json:
        document = {"text": result.text, "report": result.report()}
        sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
        return
    sys.stdout.write(result.text)
    sys.stderr.write(_summary(result) + "\n")


def _read(path: str) -> str:
    """The whole input as text; unreadable or non-UTF-8 input is bad input, not a crash."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise InvalidInput(f"cannot read {path}: {error.strerror or error}") from error
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidInput(f"cannot read {path}: not UTF-8 ({error.reason})") from error


def _summary(result: Redaction) -> str:
    if not result.counts:
        return "redacted nothing"
    parts = ", ".join(f"{kind} {count}" for kind, count in sorted(result.counts.items()))
    return f"redacted {sum(result.counts.values())}: {parts}"
