"""Request and response bodies of the v1 API. Unknown fields are rejected everywhere."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, Field, model_validator

from flywheel.feedback.values import (
    ComparisonValue,
    CorrectionValue,
    Messages,
    Metadata,
    ModelRef,
    Name,
    OutcomeValue,
    RatingValue,
    StrictModel,
    Text,
)

MAX_BATCH_EVENTS = 1_000


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class InteractionCreate(StrictModel):
    """One model call: the conversation (`messages`, or a plain `prompt`) and the response."""

    domain: Name
    messages: Messages | None = None
    prompt: Text | None = None
    response: Text
    model: ModelRef | None = None
    session_id: Name | None = None
    metadata: Metadata = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' or 'prompt'")
        return self


class InteractionCreated(BaseModel):
    id: uuid.UUID
    domain: str
    created_at: datetime


class _FeedbackBase(StrictModel):
    """Feedback about a stored interaction, or (with `domain`) carrying its own conversation."""

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


class FeedbackBatchCreate(StrictModel):
    events: Annotated[list[FeedbackCreate], Field(min_length=1, max_length=MAX_BATCH_EVENTS)]


class FeedbackCreated(BaseModel):
    id: uuid.UUID
    kind: str
    domain: str
    interaction_id: uuid.UUID | None
    created_at: datetime


class FeedbackBatchCreated(BaseModel):
    results: list[FeedbackCreated]


class FeedbackRead(BaseModel):
    id: uuid.UUID
    kind: str
    value: dict[str, Any]
    rater: str | None
    event_id: str | None
    created_at: datetime


class ModelRead(BaseModel):
    name: str | None
    version: str | None
    adapter: str | None


class InteractionRead(BaseModel):
    id: uuid.UUID
    domain: str
    messages: list[dict[str, Any]]
    response: str
    model: ModelRead
    session_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    feedback: list[FeedbackRead]


class Health(BaseModel):
    status: Literal["ok"]
