"""Storing candidate signal: redact, hash, skip what the domain holds, write the rest."""

from __future__ import annotations

import hashlib
import unicodedata

import orjson


def normalise_text(text: str) -> str:
    """What two texts must share to count as the same content: NFKC, trimmed lines, no
    trailing blank lines, \\n line ends. Case and inner spacing stay (code depends on them)."""
    text = unicodedata.normalize("NFKC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.strip().split("\n"))


def content_sha256(kind: str, *parts: object) -> str:
    """The content hash unique per domain: `kind` and every part, strings normalised."""
    normalised = [
        normalise_text(part) if isinstance(part, str) else _normalise_json(part) for part in parts
    ]
    return hashlib.sha256(orjson.dumps([kind, *normalised])).hexdigest()


def _normalise_json(value: object) -> object:
    if isinstance(value, str):
        return normalise_text(value)
    if isinstance(value, list | tuple):
        return [_normalise_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _normalise_json(item) for key, item in sorted(value.items())}
    return value
