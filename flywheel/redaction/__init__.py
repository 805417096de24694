"""Redaction of PII and secrets before anything reaches a training table.

Interface (being filled in): `redact(text, names=()) -> Redaction` with typed placeholders
(`<EMAIL>`, `<SECRET>`, `<NAME>`, ...) and per-type counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Redaction:
    text: str
    counts: dict[str, int] = field(default_factory=dict)  # placeholder type -> occurrences


def redact(text: str, *, names: Sequence[str] = ()) -> Redaction:
    """Placeholder until the detectors land: returns the text unchanged."""
    return Redaction(text)
