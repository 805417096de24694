"""What a feedback event and an interaction may contain: validated value types.

These are domain types (the CLI and ingestors use them too); `api/schemas.py` composes them
into request bodies. Every string is checked for NUL bytes and lone surrogates, which
PostgreSQL cannot store and which no honest client sends.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any, Literal, Self

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


def check_clean_text(value: str) -> str:
    """Reject NUL bytes and lone UTF-16 surrogates."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL bytes")
    try:
        value.encode("utf-8")  # in C: fails exactly on lone surrogates
    except UnicodeEncodeError as error:
        raise ValueError("text must not contain lone surrogates") from error
    return value


def check_clean_json(value: JsonValue, depth: int = 0) -> JsonValue:
    """Check every string (keys included) and number of a JSON value, and bound its nesting.

    Numbers must be finite and integers fit in 64 bits, as every JSON consumer can read them.
    """
    if depth > MAX_METADATA_DEPTH:
        raise ValueError(f"metadata nests deeper than {MAX_METADATA_DEPTH} levels")
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
            check_clean_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_clean_json(item, depth + 1)
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


class StrictModel(BaseModel):
    """Unknown fields are rejected. Numbers and booleans are `Strict*`: "5" is not 5.

    (Not `strict=True` on the model: FastAPI validates parsed Python objects, where strict
    mode would refuse a UUID given as a string.)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(StrictModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text


Messages = Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]


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
    """The response as the user edited it."""

    text: Annotated[
        str,
        StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS),
        AfterValidator(check_clean_text),
    ]


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
        if self.interaction_id is not None and (has_context or self.response is not None):
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
