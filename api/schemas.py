"""Request and response bodies of the v1 API. Unknown fields are rejected everywhere."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    model_validator,
)

from flywheel.feedback.values import (
    MAX_SCHEMA_DEPTH,
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
    Tools,
    TurnToolCalls,
    check_clean_json,
    check_clean_text,
)
from flywheel.sandbox.environment import spec_problem
from flywheel.sandbox.toolcalls import expected_calls_problem, tools_problem

__all__ = [
    "ComparisonFeedback",
    "CorrectionFeedback",
    "FeedbackCreate",
    "OutcomeFeedback",
    "RatingFeedback",
]

MAX_BATCH_EVENTS = 1_000
MAX_VERSION_CHARS = 32
MAX_REASON_CHARS = 2_000

# Checked text, as every string of every request is: no NUL bytes, no lone surrogates, bounded.
Version = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_VERSION_CHARS),
    AfterValidator(check_clean_text),
]
Reason = Annotated[
    str, StringConstraints(max_length=MAX_REASON_CHARS), AfterValidator(check_clean_text)
]


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
    tools: Tools | None = Field(
        default=None, description="The tools the request offered (OpenAI's function tools)."
    )
    prompt: Text | None = None
    response: Text | None = Field(
        default=None,
        description="The response's text; may be omitted (or empty) when it called tools.",
    )
    response_tool_calls: TurnToolCalls | None = Field(
        default=None,
        description="The response's tool calls (OpenAI's assistant `tool_calls`; `arguments` "
        "a JSON object as a string), when it called tools.",
    )
    model: ModelRef | None = None
    session_id: Name | None = None
    metadata: Metadata = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' or 'prompt'")
        if self.response is None and self.response_tool_calls is None:
            raise ValueError("give 'response' (its text), 'response_tool_calls', or both")
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
    tools: list[dict[str, Any]] | None
    response: str
    response_tool_calls: list[dict[str, Any]] | None = None
    model: ModelRead
    session_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    feedback: list[FeedbackRead]


class Health(BaseModel):
    status: Literal["ok"]


class PreferencePairRead(BaseModel):
    id: uuid.UUID
    messages: list[dict[str, Any]]
    chosen: str
    rejected: str
    why: str
    weight: float
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="The conversation's tools, when it offered any."
    )
    chosen_tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="The chosen completion's tool calls (`chosen` its text)."
    )
    rejected_tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="The rejected completion's tool calls (`rejected` its text)."
    )
    source_kind: str
    source_ref: str | None
    group_key: str
    duplicate_of_id: uuid.UUID | None = Field(description="Set when a near-duplicate.")
    created_at: datetime


class PreferencePairPage(BaseModel):
    items: list[PreferencePairRead]
    next_after: uuid.UUID | None = Field(description="Pass as `after` for the next page.")


def _check_deep_json(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    check_clean_json(value, limit=MAX_SCHEMA_DEPTH)
    return value


# A JSON object as deep as tool arguments nest, every string and number checked.
DeepJson = Annotated[dict[str, JsonValue], AfterValidator(_check_deep_json)]


class TaskCreate(StrictModel):
    """A verifiable task: code with hidden tests, a question with a checkable answer, the tool
    calls a request should make, or an environment episode whose final state is checked."""

    domain: Name
    kind: Literal["code", "answer", "tool_call", "environment"] = "code"
    task_id: Name | None = Field(default=None, description="Your id for it (provenance).")
    prompt: Text
    entry_point: Name | None = None
    reference_solution: Text | None = None
    hidden_tests: Text | None = Field(default=None, description="Never shown to a model.")
    visible_tests: Text | None = None
    answer: Text | None = None
    language: Literal["python"] = "python"
    group: Name | None = Field(default=None, description="Tasks of a group share a split.")
    messages: Messages | None = Field(
        default=None, description="The prompt as chat messages, when it is more than one turn."
    )
    tools: Tools | None = Field(
        default=None, description="tool_call and environment: the functions offered (OpenAI's)."
    )
    expected_calls: list[DeepJson] | None = Field(
        default=None,
        description="tool_call: the calls to make, order-free, each argument with its "
        'acceptable values (BFCL\'s form): [{"name": "f", "arguments": {"x": [1]}}]. '
        "Never shown to a model.",
    )
    environment: DeepJson | None = Field(
        default=None,
        description="environment: its Python `source`, `classes` (name -> initial config), "
        "`ground_truth` (turns of calls) and optional `max_steps`. Never shown to a model.",
    )

    @model_validator(mode="after")
    def _checkable(self) -> Self:
        if problem := _task_problem(self):
            raise ValueError(problem)
        return self


def _task_problem(task: TaskCreate) -> str | None:
    """What keeps `task` from being checkable as its kind, or None."""
    if task.kind == "code" and (task.entry_point is None or task.hidden_tests is None):
        return "a code task needs 'entry_point' and 'hidden_tests'"
    if task.kind == "answer" and task.answer is None:
        return "an answer task needs 'answer'"
    tools = None if task.tools is None else [tool.model_dump(mode="json") for tool in task.tools]
    if task.kind == "tool_call" and (problem := expected_calls_problem(task.expected_calls, tools)):
        return f"a tool_call task needs 'tools' and 'expected_calls': {problem}"
    if task.kind == "environment":
        if problem := spec_problem(task.environment):
            return problem
        if problem := tools_problem(tools):
            return f"an environment task needs 'tools', the functions it offers: {problem}"
    extra = {"tool_call": "expected_calls", "environment": "environment"}
    for kind, field in extra.items():
        if task.kind != kind and getattr(task, field) is not None:
            return f"'{field}' belongs to a {kind} task, not a {task.kind} one"
    return None


class TaskRead(BaseModel):
    """A task as a model may see it: hidden tests, reference and answer are never returned."""

    id: uuid.UUID
    kind: str
    prompt: str
    entry_point: str | None
    visible_tests: str | None
    messages: list[dict[str, Any]] | None = Field(
        default=None, description="The prompt as chat messages, when it is more than one turn."
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="The functions a tool_call or environment task offers."
    )
    language: str
    verifier_status: str
    verifier_reason: str | None
    difficulty: float | None
    source_kind: str
    source_ref: str | None
    group_key: str
    created_at: datetime


class TaskPage(BaseModel):
    items: list[TaskRead]
    next_after: uuid.UUID | None = Field(description="Pass as `after` for the next page.")


class RecipeCreate(StrictModel):
    """How to build a version; every field has the platform default."""

    eval_fraction: StrictFloat = Field(default=0.1, ge=0, lt=1)
    replay_fraction: StrictFloat = Field(default=0.25, ge=0, le=1)
    ngram: StrictInt = Field(default=13, ge=1, le=64)
    curriculum: Literal["easy_first", "none"] = "easy_first"
    mix: dict[Name, Annotated[StrictFloat, Field(gt=0, le=1)]] = Field(
        default_factory=dict, description="Other domain -> share of its train items mixed in."
    )
    source_weights: dict[
        Literal["feedback", "ticket", "repository", "task_file", "api"],
        Annotated[StrictFloat, Field(ge=0, le=1e6)],
    ] = Field(default_factory=dict, description="Source kind -> multiplier of its weights.")


class DatasetVersionRead(BaseModel):
    id: uuid.UUID
    domain: str
    version: int
    manifest_sha256: str
    eval_sha256: str | None
    recipe: dict[str, Any]
    stats: dict[str, Any]
    parent_id: uuid.UUID | None
    created_at: datetime
    tainted_at: datetime | None


class DatasetVersionBuilt(DatasetVersionRead):
    warnings: list[str] = Field(
        description="What the version lacks for evaluation (an empty or short eval split), "
        "each with its fix; empty when nothing is short."
    )


class DatasetVersionList(BaseModel):
    items: list[DatasetVersionRead]


class ModelVersionRead(BaseModel):
    id: uuid.UUID
    version: str
    registered_model: str
    adapter_uri: str
    base_model: str
    training_run_id: uuid.UUID | None
    eval_results: dict[str, Any]
    gate_result: dict[str, Any]
    is_champion: bool
    created_at: datetime
    tainted_at: datetime | None


class PromotionEventRead(BaseModel):
    id: uuid.UUID
    action: str
    alias: str
    from_version: str | None
    to_version: str | None
    actor: str
    reason: str
    is_forced: bool
    evidence: dict[str, Any]
    created_at: datetime


class DomainModelsRead(BaseModel):
    domain: str
    registered_model: str
    champion: str | None
    versions: list[ModelVersionRead]
    history: list[PromotionEventRead]


class ChampionRead(BaseModel):
    """What an app or a multi-LoRA server loads: the alias URI, the adapter, its base."""

    domain: str
    registered_model: str
    version: str
    registry_uri: str
    adapter_uri: str
    base_model: str
    model_version_id: uuid.UUID
    training_run_id: uuid.UUID | None
    promotion_event_id: uuid.UUID = Field(
        description="The move that made it champion: the `promotion_event_id` of its webhook."
    )
    promoted_at: datetime


class PromoteCreate(StrictModel):
    """Make `version` the domain's champion."""

    version: Version = Field(description="The model version, as `GET /v1/models/{domain}` lists.")
    reason: Reason = Field(default="", description="Why, for the audit history.")
    force: StrictBool = Field(
        default=False, description="Promote even though its gate failed (a JSON boolean)."
    )


class RollbackCreate(StrictModel):
    """Move the champion back: to the previous champion, or to the version `to`."""

    to: Version | None = Field(default=None, description="The version to go back to.")
    reason: Reason = Field(default="", description="Why, for the audit history.")


class FeedbackPage(BaseModel):
    """A page of an interaction's feedback, oldest first (by `created_at`, then `id`)."""

    items: list[FeedbackRead]
    next_cursor: str | None = Field(
        description="Opaque: pass as `cursor` for the next page; null when there is no more."
    )


class InteractionWithFeedback(InteractionRead):
    """The interaction with the first page of its feedback (`feedback`, at most 100 events)."""

    next_cursor: str | None = Field(
        description="Opaque: pass as `cursor` to `GET /v1/interactions/{id}/feedback` for the "
        "rest of the feedback; null when `feedback` holds all of it."
    )


class WebhookDeliveryRead(BaseModel):
    """One webhook of one champion move to one URL, and how its delivery went."""

    id: uuid.UUID = Field(description="Its `X-Flywheel-Delivery` header.")
    event: Literal["promoted", "rolled_back"]
    url: str
    promotion_event_id: uuid.UUID
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime | None
    created_at: datetime
    delivered_at: datetime | None
    body: dict[str, Any] = Field(description="The `data` of the signed request.")


class WebhookDeliveryPage(BaseModel):
    items: list[WebhookDeliveryRead]
    next_after: uuid.UUID | None = Field(description="Pass as `after` for the next page.")
