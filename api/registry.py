"""The domain's adapters over the API: list them, read the champion, promote, roll back."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, BackgroundTasks, Depends, Path, Query, Request
from sqlalchemy.orm import Session

from api import examples
from api.auth import require
from api.database import in_transaction
from api.openapi import READ_ERRORS, WRITE_ERRORS, errors
from api.schemas import (
    ChampionRead,
    DomainModelsRead,
    ModelVersionRead,
    PromoteCreate,
    PromotionEventRead,
    RollbackCreate,
    WebhookDeliveryPage,
    WebhookDeliveryRead,
)
from flywheel.errors import NotFound
from flywheel.feedback.values import Name
from flywheel.registry import service, webhooks
from flywheel.registry.mlflow_registry import MlflowRegistry, Registry
from flywheel.registry.models import CHAMPION, ModelVersion, PromotionEvent
from flywheel.tenancy.service import Principal, Scope, get_domain

router = APIRouter(prefix="/v1", tags=["models"])

Reader = Annotated[Principal, Depends(require(Scope.DATA_READ))]
Releaser = Annotated[Principal, Depends(require(Scope.MODELS_WRITE))]
DomainPath = Annotated[Name, Path(description="The domain's name.", examples=["billing"])]
MOVE_ERRORS = {**WRITE_ERRORS, **errors(503)}
After = Annotated[uuid.UUID | None, Query(description="The `next_after` of the last page.")]
Limit = Annotated[int, Query(ge=1, le=500, description="At most this many.", examples=[100])]
DeliveryStatus = Annotated[
    Literal["pending", "delivered", "failed"] | None,
    Query(description="Only the deliveries in this state."),
]


def registry(request: Request) -> Registry:
    """The app's MLflow registry, made on first use (MLflow is slow to import)."""
    state = request.app.state
    if getattr(state, "registry", None) is None:
        state.registry = MlflowRegistry(state.settings.resolved_mlflow_tracking_uri)
    found: Registry = state.registry
    return found


@router.get("/models/{domain}", responses=READ_ERRORS, summary="List the domain's models")
async def list_models(domain: DomainPath, request: Request, principal: Reader) -> DomainModelsRead:
    """Versions (newest first) with their eval and gate results, the champion, and the
    append-only history of alias moves. Scope `data:read`."""
    return await in_transaction(request, _read_models, tenant_id=principal.tenant_id, domain=domain)


@router.get("/models/{domain}/champion", responses=READ_ERRORS, summary="Read the champion")
async def champion(domain: DomainPath, request: Request, principal: Reader) -> ChampionRead:
    """The adapter apps should serve now: its registered model and version, registry alias URI,
    adapter URI, base model, and the move that made it champion (the `promotion_event_id` its
    webhook carried); 404 until a version has been promoted. Scope `data:read`."""
    return await in_transaction(
        request, _read_champion, tenant_id=principal.tenant_id, domain=domain
    )


@router.post(
    "/models/{domain}/promote",
    responses=MOVE_ERRORS,
    summary="Promote a version to champion",
    openapi_extra=examples.PROMOTE,
)
async def promote(
    domain: DomainPath,
    body: PromoteCreate,
    request: Request,
    principal: Releaser,
    background: BackgroundTasks,
) -> PromotionEventRead:
    """Make a version the champion: 409 if it did not pass its gate (unless `force`), if
    another move of the domain is in progress, or if it already is; 404 for an unknown
    version; 503 when the model registry cannot be reached. The move is recorded before the
    alias moves; its webhooks are sent after the response. Scope `models:write`."""
    moved = await in_transaction(
        request,
        _promote,
        registry=registry(request),
        tenant_id=principal.tenant_id,
        domain=domain,
        version=body.version,
        actor=_actor(principal.key_id),
        reason=body.reason,
        force=body.force,
    )
    background.add_task(webhooks.deliver_after_move, request.app.state.sessions, moved.id)
    return moved


@router.post(
    "/models/{domain}/rollback",
    responses=MOVE_ERRORS,
    summary="Roll the champion back",
    openapi_extra=examples.ROLLBACK,
)
async def rollback(
    domain: DomainPath,
    body: RollbackCreate,
    request: Request,
    principal: Releaser,
    background: BackgroundTasks,
) -> PromotionEventRead:
    """Move the champion back to the previous one (or `to`): 409 without one; 503 when the
    model registry cannot be reached; its webhooks are sent after the response. Scope
    `models:write`."""
    moved = await in_transaction(
        request,
        _rollback,
        registry=registry(request),
        tenant_id=principal.tenant_id,
        domain=domain,
        to=body.to,
        actor=_actor(principal.key_id),
        reason=body.reason,
    )
    background.add_task(webhooks.deliver_after_move, request.app.state.sessions, moved.id)
    return moved


@router.get("/models/{domain}/webhooks", responses=READ_ERRORS, summary="List webhook deliveries")
async def list_webhooks(
    domain: DomainPath,
    request: Request,
    principal: Reader,
    status: DeliveryStatus = None,
    after: After = None,
    limit: Limit = 100,
) -> WebhookDeliveryPage:
    """The signed webhooks the domain's champion moves sent (or are sending) to serving
    stacks, oldest first, a page at a time: status, attempts, the last response or error.
    Pass the page's `next_after` as `after` for the next one. Scope `data:read`."""
    page = await in_transaction(
        request,
        webhooks.list_deliveries,
        tenant_id=principal.tenant_id,
        domain=domain,
        status=status,
        after=after,
        limit=limit,
    )
    items = [WebhookDeliveryRead.model_validate(row, from_attributes=True) for row in page.items]
    return WebhookDeliveryPage(items=items, next_after=page.next_after)


def _read_models(*, session: Session, tenant_id: uuid.UUID, domain: str) -> DomainModelsRead:
    found = service.list_models(session=session, tenant_id=tenant_id, domain=domain)
    champion = found.champion.id if found.champion else None
    numbers = {v.id: v.version for v in found.versions}
    return DomainModelsRead(
        domain=domain,
        registered_model=found.name,
        champion=found.champion.version if found.champion else None,
        versions=[_version(v, is_champion=v.id == champion) for v in found.versions],
        history=[_event(e, numbers) for e in found.history],
    )


def _read_champion(*, session: Session, tenant_id: uuid.UUID, domain: str) -> ChampionRead:
    """Only the champion: what serving stacks poll, so not the whole version list."""
    found = get_domain(session, tenant_id, domain)
    event = service.latest_champion_event(session, found.id)
    champion = service.current_champion(session, found.id)
    if champion is None or event is None:
        raise NotFound(f"{domain} has no champion yet")
    return ChampionRead(
        domain=domain,
        registered_model=champion.registered_model,
        version=champion.version,
        registry_uri=f"models:/{champion.registered_model}@{CHAMPION}",
        adapter_uri=champion.adapter_uri,
        base_model=champion.base_model,
        model_version_id=champion.id,
        training_run_id=champion.training_run_id,
        promotion_event_id=event.id,
        promoted_at=event.created_at,
    )


def _promote(
    *, session: Session, tenant_id: uuid.UUID, domain: str, **kwargs: Any
) -> PromotionEventRead:
    found = get_domain(session, tenant_id, domain)
    return _event_read(session, service.promote(session=session, domain=found, **kwargs))


def _rollback(
    *, session: Session, tenant_id: uuid.UUID, domain: str, **kwargs: Any
) -> PromotionEventRead:
    found = get_domain(session, tenant_id, domain)
    return _event_read(session, service.rollback(session=session, domain=found, **kwargs))


def _event_read(session: Session, event: PromotionEvent) -> PromotionEventRead:
    ids = [i for i in (event.from_model_version_id, event.to_model_version_id) if i]
    return _event(event, {i: session.get_one(ModelVersion, i).version for i in ids})


def _actor(key_id: uuid.UUID) -> str:
    return f"api-key:{key_id}"


def _version(version: ModelVersion, *, is_champion: bool) -> ModelVersionRead:
    return ModelVersionRead(
        id=version.id,
        version=version.version,
        registered_model=version.registered_model,
        adapter_uri=version.adapter_uri,
        base_model=version.base_model,
        training_run_id=version.training_run_id,
        eval_results=version.eval_results,
        gate_result=version.gate_result,
        is_champion=is_champion,
        created_at=version.created_at,
        tainted_at=version.tainted_at,
    )


def _event(event: PromotionEvent, numbers: dict[uuid.UUID, str]) -> PromotionEventRead:
    return PromotionEventRead(
        id=event.id,
        action=event.action,
        alias=event.alias,
        from_version=numbers.get(event.from_model_version_id)
        if event.from_model_version_id
        else None,
        to_version=numbers.get(event.to_model_version_id) if event.to_model_version_id else None,
        actor=event.actor,
        reason=event.reason,
        is_forced=event.is_forced,
        evidence=event.evidence,
        created_at=event.created_at,
    )
