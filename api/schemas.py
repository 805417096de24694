"""Request and response bodies of the v1 API. Unknown fields are rejected everywhere."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, Field, model_validator

from flywheel.feedback.values import (
    ComparisonFeedback,
    CorrectionFeedback,
    FeedbackCreate,
    Messages,
    Metadata,
    ModelRef,
    Name,
    OutcomeFeedback,
    RatingFeedback,
    StrictModel,
    Text,
)

__all__ = [
    "ComparisonFeedback",
    "CorrectionFeedback",
    "FeedbackCreate",
    "OutcomeFeedback",
    "RatingFeedback",
]

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
