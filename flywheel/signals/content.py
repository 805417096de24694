"""What makes two signal items the same content: one normalisation of texts, one hash.

`content_sha256(kind, *parts)` is the per-domain unique key of every signal table: `kind` and
each part, strings normalised by `normalise_text` (JSON values key-sorted, their strings
normalised). Writers that already hold normalised parts hash them with `digest` (or
`messages_digest`, the messages given as their JSON) and get the same key.

`prompt_key(messages)` is what two items must share to ask the same thing (their answers may
differ): the unit that keeps train and eval apart across domains, mixes and weeks.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import orjson


def normalise_text(text: str) -> str:
    """What two texts must share to count as the same content: NFKC, trimmed lines, no
    trailing blank lines, \\n line ends. Case and inner spacing stay (code depends on them).

    A single-line ASCII text takes a shortcut (NFKC leaves ASCII as it is, and with no line
    breaks only the outer strip remains): most texts are such, and compiles normalise millions.
    """
    if text.isascii() and "\n" not in text and "\r" not in text:
        return text.strip()
    return _normalise_fully(text)


def _normalise_fully(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.strip().split("\n"))


def normalise_json(value: object) -> object:
    """A JSON value as content hashes see it: dict keys sorted, every string normalised."""
    if isinstance(value, str):
        return normalise_text(value)
    if isinstance(value, list | tuple):
        return [normalise_json(item) for item in value]
    if isinstance(value, dict):
        return {key: normalise_json(item) for key, item in sorted(value.items())}
    return value


def content_sha256(kind: str, *parts: object) -> str:
    """The content hash unique per domain: `kind` and every part, normalised."""
    return digest(kind, *(normalise_json(part) for part in parts))


def digest(kind: str, *normalised: object) -> str:
    """`content_sha256` of parts that are already normalised."""
    return hashlib.sha256(orjson.dumps([kind, *normalised])).hexdigest()


def messages_digest(kind: str, messages_json: bytes, *normalised: object) -> str:
    """`digest(kind, messages, *normalised)`, the normalised messages given as their JSON
    (serialised once per prompt rather than once per item): orjson writes a list as its
    items' JSON between brackets, joined by commas."""
    parts = b",".join([orjson.dumps(kind), messages_json, *map(orjson.dumps, normalised)])
    return hashlib.sha256(b"[" + parts + b"]").hexdigest()


def prompt_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """The identity of a prompt across tables, domains and weeks: the conversation up to the
    completion, system messages aside, each turn's role and content normalised as content
    hashes normalise them. Two items with this key ask the model the same thing, whatever
    they answer (a task's prompt is one user turn: `task_prompt_key`).

    >>> system = {"role": "system", "content": "Be brief."}
    >>> prompt_key([system, {"role": "user", "content": " 2+2? "}]) == task_prompt_key("2+2?")
    True
    """
    turns = [_turn(message) for message in messages if message.get("role") != "system"]
    return digest("prompt", turns)


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text content: the string, or its text parts one per line ("" for none)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return "" if content is None else str(content)


def _turn(message: Mapping[str, Any]) -> list[Any]:
    """[role, text], and an assistant's tool calls (name, arguments) when it made any: a
    message without calls keys as it did before tool calls were kept."""
    turn: list[Any] = [str(message.get("role", "")), normalise_text(message_text(message))]
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        turn.append([_call_key(call) for call in calls])
    return turn


def _call_key(call: Any) -> list[str]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        return ["", ""]
    return [str(function.get("name", "")), normalise_text(str(function.get("arguments", "")))]


def task_prompt_key(prompt: str) -> str:
    """`prompt_key` of a task, whose prompt is the one user turn a model is given."""
    return prompt_key([{"role": "user", "content": prompt}])
