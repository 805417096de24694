"""Completions that are more than text: a response that called tools, or one given tools.

The evidence (`evidence.py`) tells responses apart by one string each. A response with
neither tool calls nor tools is its text, as it always was (so its items keep their content
hashes); any other is encoded as TURN_MARK and a JSON object `{"content", "tool_calls",
"tools"}` (PostgreSQL writes it with `turn_sql`, SQLite with `encode`: the spellings differ,
`decode` reads both). `key` is what tells two such responses apart (texts normalised as
content hashes normalise them, arguments parsed and key-sorted, call ids left out: an id is
a handle, not content), `clean` redacts one as the compiler stores it and gives the parts
its content hash adds to a plain completion's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from flywheel.signals.content import normalise_json, normalise_text
from flywheel.signals.message_texts import map_texts

TURN_MARK = "\x1e"  # ASCII record separator: no text a client sends starts with it in practice
TOOLS_MARK = "\x1f"  # in a key, between the turn and the tools it was offered


def turn_sql(content: str, calls: str, tools: str) -> str:
    """The SQL expression of a response's evidence string (PostgreSQL; `encode`'s twin)."""
    return (
        f"CASE WHEN {calls} IS NULL AND {tools} IS NULL THEN {content} "
        f"ELSE chr(30) || jsonb_build_object('content', {content}, 'tool_calls', {calls}, "
        f"'tools', {tools})::text END"
    )


def encode(content: str | None, calls: list[Any] | None, tools: list[Any] | None) -> str:
    """A response's evidence string: its text, or the mark and its JSON."""
    if calls is None and tools is None:
        return content or ""
    body = {"content": content, "tool_calls": calls, "tools": tools}
    return TURN_MARK + orjson.dumps(body).decode()


@dataclass(frozen=True, slots=True)
class Turn:
    """A decoded response: its text ("" when it only called tools), calls and tools."""

    content: str
    tool_calls: list[Any] | None
    tools: list[Any] | None


def decode(raw: str) -> Turn:
    """The response an evidence string stands for (a text that only looks encoded is text)."""
    if raw.startswith(TURN_MARK):
        try:
            body = orjson.loads(raw[1:])
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict) and set(body) == {"content", "tool_calls", "tools"}:
            content = body["content"] if isinstance(body["content"], str) else ""
            return Turn(content, _list(body, "tool_calls"), _list(body, "tools"))
    return Turn(raw, None, None)


def _list(body: dict[str, Any], name: str) -> list[Any] | None:
    value = body[name]
    return value if isinstance(value, list) and value else None


def is_turn(raw: str) -> bool:
    return raw.startswith(TURN_MARK)


def key(raw: str, normal: Callable[[str], str]) -> str:
    """What tells two responses apart: the normalised text, or for an encoded one its
    normalised turn, TOOLS_MARK, and its normalised tools."""
    if not is_turn(raw):
        return normal(raw)
    turn = decode(raw)
    if turn.tool_calls is None and turn.tools is None:
        return normal(turn.content)
    said = [normal(turn.content), _calls_key(turn.tool_calls, normal)]
    shown = orjson.dumps(normalise_json(turn.tools), option=orjson.OPT_SORT_KEYS).decode()
    return TURN_MARK + orjson.dumps(said).decode() + TOOLS_MARK + shown


def edit_text(response_key: str) -> str:
    """The part of a key an edit changes (a turn without the tools it was offered)."""
    if not is_turn(response_key):
        return response_key  # a text: all of it, whatever characters it holds
    return response_key.partition(TOOLS_MARK)[0]


def _calls_key(calls: list[Any] | None, normal: Callable[[str], str]) -> list[Any] | None:
    if calls is None:
        return None
    return [_call_key(call, normal) for call in calls]


def _call_key(call: Any, normal: Callable[[str], str]) -> list[Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ["", None]
    arguments = function.get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError:
        parsed = normal(arguments) if isinstance(arguments, str) else None
    return [str(function.get("name", "")), _normal_values(parsed, normal)]


def _normal_values(value: Any, normal: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return normal(value)
    if isinstance(value, list):
        return [_normal_values(item, normal) for item in value]
    if isinstance(value, dict):
        return {name: _normal_values(item, normal) for name, item in sorted(value.items())}
    return value


@dataclass(frozen=True, slots=True)
class CleanTurn:
    """A tool-calling (or tool-offered) completion as stored: redacted text and calls, the
    tools, placeholder counts, the extra content-hash part, and the typed comparison key."""

    text: str
    tool_calls: list[Any] | None
    tools: list[Any] | None
    counts: Mapping[str, int]
    normal: str
    extra: dict[str, Any]  # empty for a plain text completion: its hash is as it always was
    typed: str


def clean(turn: Turn, redact: Callable[[str], tuple[str, dict[str, int], str]]) -> CleanTurn:
    """Redact every text of the turn (content, strings inside arguments) with `redact`, which
    gives (stored text, counts, typed normal form) of one text."""
    counts: Counter[str] = Counter()

    def stored(text: str) -> str:
        found, found_counts, _ = redact(text)
        counts.update(found_counts)
        return found

    message = {"content": turn.content, "tool_calls": turn.tool_calls}
    redacted = map_texts(message, stored)
    typed = map_texts(message, lambda text: redact(text)[2])
    calls = redacted["tool_calls"]
    normal = normalise_text(redacted["content"])
    extra = {
        "tool_calls": _calls_key(calls, normalise_text),
        "tools": normalise_json(turn.tools),
    }
    return CleanTurn(
        text=redacted["content"],
        tool_calls=calls,
        tools=turn.tools,
        counts=counts,
        normal=normal,
        extra=extra,
        typed=key(encode(typed["content"], typed["tool_calls"], turn.tools), lambda t: t),
    )


def json_or_none(value: list[Any] | None) -> str | None:
    """A JSON column's staged value: its JSON text, or NULL."""
    return None if value is None else orjson.dumps(value).decode()
