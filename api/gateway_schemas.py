"""What the gateway accepts and answers: OpenAI's chat completion request, checked.

The messages and tools are Flywheel's checked types (`flywheel.feedback.values`): the same a
recorded interaction holds, so what the gateway forwards it can also store. Every other field
is OpenAI's own, bounded as OpenAI bounds it; a field OpenAI's API does not document for chat
completions (or one the gateway cannot honour, like `n` > 1) is refused with 422, never passed
on unread.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    field_validator,
)

from flywheel.feedback.values import (
    Messages,
    Metadata,
    Name,
    StrictModel,
    Text,
    Tools,
)

Number = StrictInt | StrictFloat
MAX_STOP_SEQUENCES = 4  # OpenAI's limit


class StreamOptions(StrictModel):
    include_usage: StrictBool | None = None


class NamedFunction(StrictModel):
    name: Name


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, JsonValue] | None = None


ModelName = Annotated[str, StringConstraints(min_length=1, max_length=300)]


class ChatRequest(StrictModel):
    """`POST /v1/chat/completions`: `model` names a domain (`billing`), its challenger
    (`billing@challenger`) or one version (`billing:3`)."""

    model: ModelName
    messages: Messages
    tools: Tools | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    n: Literal[1] | None = Field(default=None, description="One choice per call (1 only).")
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: StrictInt | None = None
    user: Name | None = Field(
        default=None, description="The end user: sticky canary assignment and the record."
    )
    response_format: ResponseFormat | None = None
    metadata: Metadata | None = Field(
        default=None, description="OpenAI's request metadata: accepted, not sent upstream."
    )
    logprobs: StrictBool | None = Field(
        default=None, description="Not supported: only false (or absent) is accepted."
    )
    top_logprobs: StrictInt | None = Field(
        default=None, description="Not supported: only absent (or null) is accepted."
    )

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | int | None) -> bool | int | None:
        """Refused by name (OpenAI's 422 shape, `param` the field) rather than passed on: the
        recorded interaction has no place for them, and the local backend cannot give them."""
        if value is not None and value is not False:
            raise ValueError("log probabilities are not supported by this gateway")
        return value

    @property
    def wants_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ModelCard(StrictModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(StrictModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIError(StrictModel):
    message: str
    type: str
    param: str | None
    code: str


class OpenAIErrorBody(StrictModel):
    error: OpenAIError
