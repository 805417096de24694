"""Interactions and feedback: thin handlers over `flywheel.feedback.service`."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Request, Response
from pydantic import BaseModel

from api import examples
from api.auth import require
from api.database import in_transaction
from api.openapi import BEARER, READ_ERRORS, WRITE_ERRORS
from api.schemas import (
    FeedbackBatchCreate,
    FeedbackBatchCreated,
    FeedbackCreate,
    FeedbackCreated,
    FeedbackRead,
    InteractionCreate,
    InteractionCreated,
    InteractionRead,
    ModelRead,
)
from flywheel.feedback import service
from flywheel.feedback.values import as_json
from flywheel.tenancy.service import Principal, Scope

router = APIRouter(prefix="/v1", dependencies=[Depends(BEARER)], tags=["interactions and feedback"])

ERRORS = READ_ERRORS  # (other routers imported it from here)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[A-Za-z0-9_.:-]{1,200}$",
        description="Replays the first response for the same request; 409 for a different one.",
    ),
]
Writer = Annotated[Principal, Depends(require(Scope.FEEDBACK_WRITE))]
Reader = Annotated[Principal, Depends(require(Scope.DATA_READ))]


@router.post(
    "/interactions",
    status_code=201,
    response_model=InteractionCreated,
    responses=WRITE_ERRORS,
    summary="Record an interaction",
    description=(
        "Store one model call: the conversation (`messages`, or a plain `prompt`; exactly one) "
        "and the `response`, with the model that served it. Feedback can then refer to its "
        "`id`. With `Idempotency-Key`, a retry returns the first response (header "
        "`Idempotent-Replayed: true`); the same key with a different body is a 409. "
        "Scope `feedback:write`."
    ),
    openapi_extra=examples.INTERACTION,
)
async def create_interaction(
    body: InteractionCreate,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    new = service.NewInteraction(
        domain=body.domain,
        messages=as_json(service.messages_or_prompt(body.messages, body.prompt)),
        response=body.response,
        model_name=body.model.name if body.model else None,
        model_version=body.model.version if body.model else None,
        adapter=body.model.adapter if body.model else None,
        session_id=body.session_id,
        metadata=body.metadata,
    )
    recorded = await in_transaction(
        request,
        service.record_interaction,
        tenant_id=principal.tenant_id,
        new=new,
        idempotency_key=idempotency_key,
    )
    created = InteractionCreated(
        id=recorded.id, domain=recorded.domain, created_at=recorded.created_at
    )
    return _created_response(request, created, [recorded])


@router.get(
    "/interactions/{interaction_id}",
    responses=READ_ERRORS,
    summary="Read an interaction and its feedback",
    description=(
        "The interaction as stored, with the feedback events about it; 404 "
        "for an unknown id or another tenant's. Scope `data:read`."
    ),
)
async def read_interaction(
    interaction_id: uuid.UUID, request: Request, principal: Reader
) -> InteractionRead:
    interaction, domain, feedback = await in_transaction(
        request,
        service.get_interaction,
        tenant_id=principal.tenant_id,
        interaction_id=interaction_id,
    )
    return InteractionRead(
        id=interaction.id,
        domain=domain,
        messages=interaction.messages,
        response=interaction.response,
        model=ModelRead(
            name=interaction.model_name,
            version=interaction.model_version,
            adapter=interaction.adapter,
        ),
        session_id=interaction.session_id,
        metadata=interaction.metadata_,
        created_at=interaction.created_at,
        feedback=[
            FeedbackRead(
                id=event.id,
                kind=event.kind,
                value=event.value,
                rater=event.rater,
                event_id=event.event_id,
                created_at=event.created_at,
            )
            for event in feedback
        ],
    )


@router.post(
    "/feedback",
    status_code=201,
    response_model=FeedbackCreated,
    responses=WRITE_ERRORS,
    summary="Record a feedback event",
    description=(
        "A `rating` (thumbs or 1-5 stars), `correction` (the edited response), `outcome` "
        "(did the task succeed) or `comparison` (two or more responses, the preferred one or a "
        "tie). It is about a stored interaction (`interaction_id`), or carries its own "
        "conversation (`domain` with `messages` or `prompt`, and `response`; a comparison's "
        "responses are in its value): exactly one of the two. An `event_id` is unique per "
        "tenant. `Idempotency-Key` replays the first response. Scope `feedback:write`."
    ),
    openapi_extra=examples.FEEDBACK,
)
async def create_feedback(
    body: Annotated[FeedbackCreate, Body()],
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    recorded = await in_transaction(
        request,
        service.record_feedback,
        tenant_id=principal.tenant_id,
        new=service.new_feedback(body),
        idempotency_key=idempotency_key,
    )
    return _created_response(request, _created(recorded), [recorded])


@router.post(
    "/feedback/batch",
    status_code=201,
    response_model=FeedbackBatchCreated,
    responses=WRITE_ERRORS,
    summary="Record up to 1,000 feedback events at once",
    description=(
        "Each event as for `POST /v1/feedback`. All are validated before any is written: if one "
        "is invalid, the 422's `details` name it by `index` and nothing is stored. "
        "`Idempotency-Key` replays the first response. Scope `feedback:write`."
    ),
    openapi_extra=examples.FEEDBACK_BATCH,
)
async def create_feedback_batch(
    body: FeedbackBatchCreate,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    recorded = await in_transaction(
        request,
        service.record_feedback_batch,
        tenant_id=principal.tenant_id,
        events=[service.new_feedback(event) for event in body.events],
        idempotency_key=idempotency_key,
    )
    created = FeedbackBatchCreated(results=[_created(item) for item in recorded])
    return _created_response(request, created, recorded)


def _created(recorded: service.Recorded) -> FeedbackCreated:
    return FeedbackCreated(
        id=recorded.id,
        kind=recorded.kind or "",
        domain=recorded.domain,
        interaction_id=recorded.interaction_id,
        created_at=recorded.created_at,
    )


def _created_response(
    request: Request, body: BaseModel, recorded: list[service.Recorded]
) -> Response:
    """201 with `body`, serialised once (we built it: FastAPI need not validate it again).

    Counts newly stored rows; marks a response that replays an earlier one.
    """
    fresh = [item for item in recorded if not item.is_replay]
    for item in fresh:
        request.app.state.metrics.events_ingested.labels(item.kind or "interaction").inc()
    headers = {"Idempotent-Replayed": "true"} if recorded and not fresh else None
    return Response(
        body.model_dump_json(), status_code=201, media_type="application/json", headers=headers
    )
