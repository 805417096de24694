"""The stand-in's answers: deterministic replies, tool calls, stream events, and the faults a
request asks for. See flywheel/inference/standin.py for the protocol they follow."""

from __future__ import annotations

import contextlib
import math
import re
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import orjson

FAULT_HEADER = b"x-standin-fault"
FAULT_IN_TEXT = re.compile(r"\[standin:([^\]]*)\]")
TOOL_TRIGGER = "call "


@dataclass(frozen=True)
class Fault:
    delay_ms: float | None = None
    status: int | None = None
    drop_after: int | None = None
    chunk_delay_ms: float | None = None
    is_hang: bool = False


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }


def compose_reply(request: dict[str, Any], model: str) -> Reply:
    messages = request["messages"]
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    prompt_tokens = sum(len(text_of(m).split()) for m in messages if isinstance(m, dict))
    if last.get("role") == "tool":
        content = f"reply from {model} to tool result: {text_of(last)}"
    else:
        user_text = text_of(last) if last.get("role") == "user" else last_user_text(messages)
        call = (
            tool_call_for(request.get("tools"), user_text) if last.get("role") == "user" else None
        )
        if call is not None:
            return Reply(
                None,
                [call],
                "tool_calls",
                prompt_tokens,
                len(call["function"]["arguments"].split()),
            )
        content = f"reply from {model} to: {user_text}"
    content = cut_at_stop(content, request.get("stop"))
    words = content.split(" ")
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    if isinstance(limit, int) and 0 < limit < len(words):
        return Reply(" ".join(words[:limit]), None, "length", prompt_tokens, limit)
    return Reply(content, None, "stop", prompt_tokens, len(content.split()))


def cut_at_stop(content: str, stop: Any) -> str:
    """`content` up to (not including) the earliest of the `stop` strings in it, as a model
    server stops generating there; all of it when none occurs.

    >>> cut_at_stop("reply from m to: a. b.", [".", "zz"])
    'reply from m to: a'
    >>> cut_at_stop("reply from m to: a", "\\n")
    'reply from m to: a'
    """
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    found = [content.find(s) for s in stops if isinstance(s, str) and s and s in content]
    return content[: min(found)] if found else content


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message)
    return ""


def tool_call_for(tools: Any, user_text: str) -> dict[str, Any] | None:
    """The call of the first tool whose `call <name>` the user text contains, if any."""
    if not isinstance(tools, list) or TOOL_TRIGGER not in user_text:
        return None
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue
        name = function.get("name")
        if isinstance(name, str) and f"{TOOL_TRIGGER}{name}" in user_text:
            arguments = sample_arguments(function.get("parameters"), user_text)
            return {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
    return None


def sample_arguments(parameters: Any, user_text: str) -> dict[str, Any]:
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    samples = {"string": user_text, "integer": 1, "number": 1, "boolean": True}
    arguments: dict[str, Any] = {}
    for name, schema in (properties or {}).items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        arguments[name] = samples.get(kind) if isinstance(kind, str) else None
    return arguments


def completion_body(model: str, reply: Reply) -> dict[str, Any]:
    """The `chat.completion` object of a non-streamed answer."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls is not None:
        message["tool_calls"] = reply.tool_calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": reply.finish_reason,
    }
    return {
        "id": completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": reply.usage(),
    }


def stream_events(model: str, reply: Reply, pieces: int, include_usage: bool) -> list[bytes]:
    """The SSE events of a streamed answer, `data: [DONE]` last."""
    head = {
        "id": completion_id(),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**head, "choices": [choice], **({"usage": None} if include_usage else {})}

    chunks = [chunk({"role": "assistant", "content": "" if reply.content is not None else None})]
    if reply.tool_calls is not None:
        chunks.append(
            chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(reply.tool_calls)]})
        )
    else:
        chunks += [chunk({"content": piece}) for piece in split_text(reply.content or "", pieces)]
    chunks.append(chunk({}, reply.finish_reason))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": reply.usage()})
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def split_text(text: str, pieces: int) -> list[str]:
    size = max(1, math.ceil(len(text) / max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def read_fault(headers: list[tuple[bytes, bytes]], messages: list[Any]) -> Fault:
    """The faults asked for in the `X-Standin-Fault` header, then in the last user text."""
    fault = Fault()
    for name, value in headers:
        if name == FAULT_HEADER:
            fault = parse_fault(value.decode("latin-1"), fault)
    text = last_user_text(messages)
    if "[standin:" in text:
        for spec in FAULT_IN_TEXT.findall(text):
            fault = parse_fault(spec, fault)
    return fault


def parse_fault(spec: str, fault: Fault) -> Fault:
    """`spec`'s directives laid over `fault`; unknown ones are ignored."""
    for token in re.split(r"[,\s]+", spec.strip()):
        key, _, value = token.partition("=")
        with contextlib.suppress(ValueError):
            if key == "hang":
                fault = replace(fault, is_hang=True)
            elif key == "delay-ms":
                fault = replace(fault, delay_ms=float(value))
            elif key == "status":
                fault = replace(fault, status=int(value))
            elif key == "drop-after":
                fault = replace(fault, drop_after=int(value))
            elif key == "chunk-delay-ms":
                fault = replace(fault, chunk_delay_ms=float(value))
    return fault


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
