"""A completion's tool calls, in whatever format the model family writes them.

Through the tokenizer first: `ToolCallParser(tokenizer)` gives a tokenizer without a response
template TRL's (`trl.chat_template_utils.add_response_schema`, for the templates TRL knows:
Qwen 2.5 / 3 / 3.5, Llama 3.1 / 3.2, GLM-4, gpt-oss, Gemma 4, ...), and parses with
`trl.chat_template_utils.parse_response` — what `GRPOTrainer` does to its completions, so a
reward sees the calls the trainer saw. Arguments keep the types the model wrote where the
format writes types (JSON); formats that render every value as text (Qwen 3.5's XML) are typed
by the tools' schemas, as transformers does.

Where there is no response template (Phi-3, Mistral, a custom template) or the trainer handed
over plain text, `parse_text_calls` reads the common shapes: `<tool_call>{json}</tool_call>`
blocks (Qwen / Hermes), and bare JSON objects `{"name": ..., "arguments"|"parameters": ...}`
(Llama's, one per line, in a list or a ```json block), reasoning in `<think>` left out.

A call whose JSON does not parse makes the whole completion's calls unreadable: `ParsedCalls`
carries the reason and no calls, and the reward scores it 0.0 — never an exception.
Reading completions (`completion_calls`, `parse_text_calls`) imports no ML library; only
`ToolCallParser` imports TRL.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flywheel.sandbox.toolcalls import MalformedCall, as_call

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Completion = str | list[dict[str, Any]]

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_CALL_START = re.compile(r'\{\s*"name"\s*:')


@dataclass(frozen=True)
class ParsedCalls:
    """The calls read (`{"name", "arguments"}` each), or why they could not be (`error`)."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def parse_text_calls(text: str) -> ParsedCalls:
    """The tool calls written in `text`, for templates without a response schema.

    >>> parse_text_calls('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
    ParsedCalls(calls=[{'name': 'f', 'arguments': {'x': 1}}], error=None)
    >>> parse_text_calls('{"name": "f", "parameters": {"x": 1}}').calls
    [{'name': 'f', 'arguments': {'x': 1}}]
    >>> parse_text_calls('<tool_call>{"name": "f", "arguments": {"x": 1,,}}</tool_call>').error
    'malformed tool call: Expecting property name enclosed in double quotes at 35'
    >>> parse_text_calls("The answer is 4.")
    ParsedCalls(calls=[], error=None)
    """
    text = _THINK.sub("", text)
    blocks = [block.strip() for block in _TAGGED.findall(text)]
    if blocks:
        return _calls_of(_decode_block(block) for block in blocks)
    return _calls_of(_bare_objects(text))


# What decoding a model's JSON raises besides JSONDecodeError (a ValueError): an integer
# of more digits than Python parses (ValueError), brackets nested past the recursion limit.
UNDECODABLE = (ValueError, RecursionError)


def _decode_block(block: str) -> Any:
    try:
        return json.loads(block)
    except json.JSONDecodeError as error:
        return MalformedCall(f"{error.msg} at {error.pos}")
    except UNDECODABLE as error:
        return MalformedCall(f"undecodable JSON: {type(error).__name__}")


def _bare_objects(text: str) -> list[Any]:
    """Each JSON object in `text` that starts like a call, `{"name": ...`, scanned left to
    right (an object inside one already read is part of it)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    end = 0
    for match in _CALL_START.finditer(text):
        if match.start() < end:
            continue
        try:
            value, end = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError as error:
            found.append(MalformedCall(f"{error.msg} at {error.pos - match.start()}"))
            end = len(text)
            continue
        except UNDECODABLE as error:
            found.append(MalformedCall(f"undecodable JSON: {type(error).__name__}"))
            end = len(text)
            continue
        found.append(value)
    return found


def _calls_of(values: Any) -> ParsedCalls:
    calls: list[dict[str, Any]] = []
    for value in values:
        if isinstance(value, MalformedCall):
            return ParsedCalls(error=f"malformed tool call: {value}")
        for item in value if isinstance(value, list) else [value]:
            try:
                call = as_call(item) if isinstance(item, Mapping) else None
            except MalformedCall as error:
                return ParsedCalls(error=f"malformed tool call: {error}")
            if call is None:
                return ParsedCalls(error=f"malformed tool call: {str(item)[:80]}")
            calls.append({"name": call.name, "arguments": call.arguments})
    return ParsedCalls(calls)


def message_calls(message: Mapping[str, Any]) -> ParsedCalls:
    """An assistant message's calls: its parsed `tool_calls` (as TRL's `parse_response`
    leaves them), else those written in its text."""
    structured = message.get("tool_calls")
    if structured:
        return _calls_of([list(structured)])
    content = message.get("content")
    return parse_text_calls(content if isinstance(content, str) else "")


def completion_calls(completion: Completion) -> ParsedCalls:
    """The calls of a completion as TRL hands it to a reward: text, or a conversation whose
    first assistant message with calls holds them (a single-turn task's answer; later turns,
    after tool results, are not the call set being checked).

    >>> completion_calls([{"role": "assistant", "content": "", "tool_calls": [
    ...     {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]).calls
    [{'name': 'f', 'arguments': {'x': 1}}]
    """
    if isinstance(completion, str):
        return parse_text_calls(completion)
    for message in completion:
        if message.get("role", "assistant") == "assistant":
            parsed = message_calls(message)
            if parsed.calls or parsed.error:
                return parsed
    return ParsedCalls()


class ToolCallParser:
    """Parses generated tokens (or text) with the tokenizer's response template, falling back
    to `parse_text_calls`. Sets TRL's response template on the tokenizer when it has none
    and TRL knows its chat template (as `GRPOTrainer` does when given tools)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        from trl.chat_template_utils import add_response_schema  # the reward needs no TRL

        self.tokenizer = tokenizer
        if not self.has_template():
            # a template TRL does not know raises ValueError: the text fallback reads it
            with contextlib.suppress(ValueError):
                add_response_schema(tokenizer)

    def has_template(self) -> bool:
        return any(
            getattr(self.tokenizer, name, None) is not None
            for name in ("response_template", "response_schema")
        )

    def parse_ids(
        self,
        ids: Sequence[int],
        prefix_ids: Sequence[int] = (),
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ParsedCalls:
        """The calls of generated `ids`; `prefix_ids` are the prompt's (the template may have
        opened the assistant turn, e.g. with `<think>`)."""
        from trl.chat_template_utils import parse_response

        if not self.has_template():
            return parse_text_calls(self._text(ids))
        typed: list[dict[Any, Any] | Callable[..., Any]] | None = None
        if tools and not self._writes_types():
            typed = [dict(tool) for tool in tools]
        try:
            message = parse_response(
                self.tokenizer, list(ids), prefix=list(prefix_ids), tools=typed
            )
        except RecursionError:  # TRL catches ValueError and TypeError only
            return ParsedCalls([], "undecodable JSON: RecursionError")
        if message.get("tool_calls"):
            return message_calls(message)
        # TRL falls back to the plain text when the calls do not parse: read it ourselves, so
        # malformed JSON is reported (the special tokens are kept for the markers)
        return parse_text_calls(self._text(ids))

    def _text(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def parse_text(
        self, text: str, prefix: str = "", tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ParsedCalls:
        """The calls of a generated `text` (after the prompt `prefix`)."""
        encode = self.tokenizer.encode
        return self.parse_ids(
            encode(text, add_special_tokens=False),
            encode(prefix, add_special_tokens=False) if prefix else [],
            tools,
        )

    def _writes_types(self) -> bool:
        """The template's calls are JSON, so their values carry the model's own types (typing
        them by the schema would turn a written "5" into 5)."""
        template = getattr(self.tokenizer, "response_template", None)
        if not isinstance(template, Mapping):
            return True  # legacy schemas parse JSON as written
        calls = template.get("fields", {}).get("tool_calls", {})
        return isinstance(calls, Mapping) and calls.get("content") == "json"
