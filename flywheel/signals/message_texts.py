"""The free texts of a chat message in OpenAI's format, for redaction to reach every one.

A message's texts are its string `content` (a `tool` message's result included), each text
part's `text`, its `name`, and every string value inside each tool call's JSON `arguments`
(parsed, mapped and re-serialised, so the arguments stay a JSON object as a string). Roles,
ids, types, function names and JSON keys are structure, not text: they are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

TextMap = Callable[[str], str]


def map_texts(message: Mapping[str, Any], change: TextMap) -> dict[str, Any]:
    """The message with `change` applied to each of its texts (a new dict; keys kept)."""
    mapped = dict(message)
    if "content" in mapped:
        mapped["content"] = _content(mapped["content"], change)
    if isinstance(mapped.get("name"), str):
        mapped["name"] = change(mapped["name"])
    if isinstance(mapped.get("tool_calls"), list):
        mapped["tool_calls"] = [_tool_call(call, change) for call in mapped["tool_calls"]]
    return mapped


def map_arguments(arguments: str, change: TextMap) -> str:
    """Tool call `arguments` with `change` applied to every string value inside the JSON.

    Unchanged arguments come back as given (byte for byte); changed ones are re-serialised.
    Arguments that are not JSON (never stored: the schema refuses them) are one text.
    """
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return change(arguments)
    mapped = _json_strings(parsed, change)
    return arguments if mapped == parsed else orjson.dumps(mapped).decode()


def _content(content: Any, change: TextMap) -> Any:
    if isinstance(content, str):
        return change(content)
    if isinstance(content, list):
        return [
            {**part, "text": change(part["text"])}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return content


def _tool_call(call: Any, change: TextMap) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    return {
        **call,
        "function": {**function, "arguments": map_arguments(function["arguments"], change)},
    }


def _json_strings(value: Any, change: TextMap) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_json_strings(item, change) for item in value]
    if isinstance(value, dict):
        return {key: _json_strings(item, change) for key, item in value.items()}
    return value
