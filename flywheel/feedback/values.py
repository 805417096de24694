"""What a feedback event and an interaction may contain: validated value types.

These are domain types (the CLI and ingestors use them too); `api/schemas.py` composes them
into request bodies. Every string is checked for NUL bytes and lone surrogates, which
PostgreSQL cannot store and which no honest client sends.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictInt,
    StringConstraints,
    model_validator,
)

MAX_TEXT_CHARS = 200_000
MAX_NAME_CHARS = 255
MAX_MESSAGES = 1_000
MAX_METADATA_DEPTH = 8
MAX_SCHEMA_DEPTH = 32  # JSON Schemas and tool arguments nest deeper than metadata
MAX_TOOL_CALLS = 128
MAX_TOOLS = 128  # OpenAI's limit per request
MAX_TOOLS_BYTES = 256_000  # within the default 1 MiB body limit


def check_clean_text(value: str) -> str:
    """Reject NUL bytes and lone UTF-16 surrogates."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL bytes")
    try:
        value.encode("utf-8")  # in C: fails exactly on lone surrogates
    except UnicodeEncodeError as error:
        raise ValueError("text must not contain lone surrogates") from error
    return value


def check_clean_json(
    value: JsonValue, depth: int = 0, limit: int = MAX_METADATA_DEPTH
) -> JsonValue:
    """Check every string (keys included) and number of a JSON value, and bound its nesting.

    Numbers must be finite and integers fit in 64 bits, as every JSON consumer can read them.
    """
    if depth > limit:
        raise ValueError(f"JSON value nests deeper than {limit} levels")
    if isinstance(value, str):
        check_clean_text(value)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise ValueError("integers in metadata must fit in 64 bits")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers in metadata must be finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_clean_text(key)
            check_clean_json(item, depth + 1, limit)
    elif isinstance(value, list):
        for item in value:
            check_clean_json(item, depth + 1, limit)
    return value


Text = Annotated[
    str, StringConstraints(max_length=MAX_TEXT_CHARS), AfterValidator(check_clean_text)
]
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_NAME_CHARS),
    AfterValidator(check_clean_text),
]
Metadata = Annotated[dict[str, JsonValue], AfterValidator(check_clean_json)]


def _check_schema(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    check_clean_json(value, limit=MAX_SCHEMA_DEPTH)
    return value


JsonSchema = Annotated[dict[str, JsonValue], AfterValidator(_check_schema)]


class StrictModel(BaseModel):
    """Unknown fields are rejected. Numbers and booleans are `Strict*`: "5" is not 5.

    (Not `strict=True` on the model: FastAPI validates parsed Python objects, where strict
    mode would refuse a UUID given as a string.)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(StrictModel):
    """A text content part, as OpenAI's chat format writes `content` as a list."""

    type: Literal["text"]
    text: Text


def parse_arguments(value: str) -> JsonValue:
    """A tool call's `arguments`: a JSON string that parses to an object (checked as metadata)."""
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"tool call arguments are not valid JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return check_clean_json(parsed, limit=MAX_SCHEMA_DEPTH)


def _check_arguments(value: str) -> str:
    parse_arguments(value)
    return value


Arguments = Annotated[
    str,
    StringConstraints(max_length=MAX_TEXT_CHARS),
    AfterValidator(check_clean_text),
    AfterValidator(_check_arguments),
]


class FunctionCall(StrictModel):
    name: Name
    arguments: Arguments = Field(description="A JSON object, as a string (OpenAI's format).")


class ToolCall(StrictModel):
    """One call an assistant turn makes: OpenAI's `tool_calls` item."""

    id: Name
    type: Literal["function"]
    function: FunctionCall


def check_call_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls of one turn have distinct ids (a tool message answers exactly one)."""
    ids = [call.id for call in calls]
    if len(set(ids)) != len(ids):
        raise ValueError("tool call ids must be distinct within one turn")
    return calls


ToolCalls = Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOL_CALLS)]
# A response's (or a correction's) tool calls: what an assistant turn calls, ids distinct.
TurnToolCalls = Annotated[
    list[ToolCall],
    Field(min_length=1, max_length=MAX_TOOL_CALLS),
    AfterValidator(check_call_ids),
]
Content = Text | Annotated[list[TextPart], Field(min_length=1, max_length=MAX_MESSAGES)]


class Message(StrictModel):
    """One chat message in OpenAI's format: text (or text parts), or an assistant's tool calls
    (`content` may then be null), or a `tool` message answering a call by `tool_call_id`."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Content | None = None
    name: Name | None = None
    tool_calls: ToolCalls | None = None
    tool_call_id: Name | None = None

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("a tool message needs tool_call_id; other messages have none")
        if self.role == "assistant":
            if self.content is None and self.tool_calls is None:
                raise ValueError("an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self


def check_tool_flow(messages: list[Message]) -> list[Message]:
    """Tool call ids are unique in a conversation and each tool message answers an earlier one."""
    called: set[str] = set()
    for message in messages:
        if message.tool_call_id is not None and message.tool_call_id not in called:
            raise ValueError(
                f"tool message answers tool_call_id {message.tool_call_id!r}, "
                "which no earlier assistant message called"
            )
        for call in message.tool_calls or ():
            if call.id in called:
                raise ValueError(f"tool call id {call.id!r} is used twice in the conversation")
            called.add(call.id)
    return messages


Messages = Annotated[
    list[Message],
    Field(min_length=1, max_length=MAX_MESSAGES),
    AfterValidator(check_tool_flow),
]


class FunctionDefinition(StrictModel):
    name: Name
    description: Text | None = None
    parameters: JsonSchema | None = Field(
        default=None, description="The arguments' JSON Schema (an object)."
    )
    strict: StrictBool | None = None


class ToolDefinition(StrictModel):
    """A tool the request offered the model: OpenAI's function tool schema."""

    type: Literal["function"]
    function: FunctionDefinition


def check_tools_size(tools: list[ToolDefinition]) -> list[ToolDefinition]:
    size = sum(len(orjson.dumps(tool.model_dump(mode="json"))) for tool in tools)
    if size > MAX_TOOLS_BYTES:
        raise ValueError(f"tools take {size} bytes as JSON; at most {MAX_TOOLS_BYTES}")
    return tools


Tools = Annotated[
    list[ToolDefinition],
    Field(min_length=1, max_length=MAX_TOOLS),
    AfterValidator(check_tools_size),
]


class ModelRef(StrictModel):
    """The model that served an interaction: registry name and version, and the adapter."""

    name: Name
    version: Name | None = None
    adapter: (
        Annotated[str, StringConstraints(max_length=1024), AfterValidator(check_clean_text)] | None
    ) = None


class RatingValue(StrictModel):
    """Thumbs up/down, or 1-5 stars: exactly one of them."""

    thumbs: Literal["up", "down"] | None = None
    stars: Annotated[StrictInt, Field(ge=1, le=5)] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if (self.thumbs is None) == (self.stars is None):
            raise ValueError("a rating has exactly one of 'thumbs' (up/down) or 'stars' (1-5)")
        return self


class CorrectionValue(StrictModel):
    """The response as the user edited it: its `text`, or the `tool_calls` it should have
    made (OpenAI's shape, arguments a JSON object as a string), or both."""

    text: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS),
            AfterValidator(check_clean_text),
        ]
        | None
    ) = None
    tool_calls: TurnToolCalls | None = None

    @model_validator(mode="after")
    def _text_or_calls(self) -> Self:
        if self.text is None and self.tool_calls is None:
            raise ValueError("a correction needs 'text' or 'tool_calls' (or both)")
        return self


class ComparisonValue(StrictModel):
    """Two or more responses to the same conversation, and the preferred one (or a tie)."""

    messages: Messages | None = None
    responses: Annotated[list[Text], Field(min_length=2, max_length=16)]
    preferred: Annotated[StrictInt, Field(ge=0)] | None = None
    tie: StrictBool = False

    @model_validator(mode="after")
    def _preferred_or_tie(self) -> Self:
        if self.tie and self.preferred is not None:
            raise ValueError("a comparison is either a tie or has a preferred response, not both")
        if not self.tie and self.preferred is None:
            raise ValueError("a comparison needs 'preferred' (an index) or 'tie': true")
        if self.preferred is not None and self.preferred >= len(self.responses):
            raise ValueError(
                f"preferred={self.preferred} is not among the {len(self.responses)} responses"
            )
        return self


class OutcomeValue(StrictModel):
    """Whether the task the response was for succeeded, e.g. a ticket was reopened."""

    success: StrictBool
    reason: (
        Annotated[str, StringConstraints(max_length=1024), AfterValidator(check_clean_text)] | None
    ) = None


FeedbackKind = Literal["rating", "correction", "comparison", "outcome"]


class _FeedbackBase(StrictModel):
    """A feedback event as clients send it (the API, feedback JSONL files): about a stored
    interaction, or (with `domain`) carrying its own conversation."""

    interaction_id: uuid.UUID | None = None
    domain: Name | None = None
    messages: Messages | None = None
    tools: Tools | None = None
    prompt: Text | None = None
    response: Text | None = None
    rater: Name | None = Field(default=None, description="A pseudonymous rater id.")
    event_id: Name | None = Field(default=None, description="The client's id, unique per tenant.")

    @model_validator(mode="after")
    def _target(self) -> Self:
        has_context = self.messages is not None or self.prompt is not None
        if (self.interaction_id is None) == (self.domain is None):
            raise ValueError("give exactly one of 'interaction_id' or 'domain'")
        if self.messages is not None and self.prompt is not None:
            raise ValueError("give at most one of 'messages' or 'prompt'")
        if self.interaction_id is not None and (
            has_context or self.response is not None or self.tools is not None
        ):
            raise ValueError("feedback on an interaction_id takes its conversation from it")
        if self.domain is not None and not self._carries_own_context(has_context):
            raise ValueError(
                "feedback without an interaction_id needs its own 'messages' (or 'prompt') "
                "and 'response'"
            )
        return self

    def _carries_own_context(self, has_context: bool) -> bool:
        return has_context and self.response is not None


class RatingFeedback(_FeedbackBase):
    kind: Literal["rating"]
    value: RatingValue


class CorrectionFeedback(_FeedbackBase):
    kind: Literal["correction"]
    value: CorrectionValue


class OutcomeFeedback(_FeedbackBase):
    kind: Literal["outcome"]
    value: OutcomeValue


class ComparisonFeedback(_FeedbackBase):
    kind: Literal["comparison"]
    value: ComparisonValue

    def _carries_own_context(self, has_context: bool) -> bool:
        # A comparison's responses are its value; the conversation may sit in value.messages.
        return (has_context or self.value.messages is not None) and self.response is None


FeedbackCreate = Annotated[
    RatingFeedback | CorrectionFeedback | OutcomeFeedback | ComparisonFeedback,
    Field(discriminator="kind"),
]


def as_json(value: Any) -> Any:
    """A validated value as plain JSON-ready data, holding the fields the client set."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, list):
        return [as_json(item) for item in value]
    return value
