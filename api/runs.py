"""Runs over the API: list and read the tenant's runs, queue a cycle, cancel one."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from sqlalchemy.orm import Session

from api import examples
from api.auth import require
from api.database import in_transaction
from api.openapi import READ_ERRORS, WRITE_ERRORS
from api.run_schemas import RunCreate, RunList, RunRead, RunStatus
from flywheel.feedback.values import Name
from flywheel.registry.models import Run
from flywheel.scheduling import jobs, runs
from flywheel.tenancy.models import Domain
from flywheel.tenancy.service import Principal, Scope

router = APIRouter(prefix="/v1", tags=["runs"])

Reader = Annotated[Principal, Depends(require(Scope.DATA_READ))]
Runner = Annotated[Principal, Depends(require(Scope.MODELS_WRITE))]
RunPath = Annotated[
    uuid.UUID, Path(description="The run's id.", examples=["0b7e7a52-3a1d-4f0e-9c55-7d2f1e6a9b10"])
]


@router.get("/runs", responses=READ_ERRORS, summary="List runs")
async def list_runs(
    request: Request,
    principal: Reader,
    domain: Annotated[
        Name | None, Query(description="Only this domain's runs.", examples=["billing"])
    ] = None,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="At most this many.")] = 50,
) -> RunList:
    """The caller's runs (cycles and trainings), newest first. Scope `data:read`."""
    return await in_transaction(
        request,
        _list,
        tenant_id=principal.tenant_id,
        domain=domain,
        status=status,
        limit=limit,
    )


@router.get("/runs/{run_id}", responses=READ_ERRORS, summary="Read a run")
async def read_run(run_id: RunPath, request: Request, principal: Reader) -> RunRead:
    """One run with its steps; 404 for another tenant's. Scope `data:read`."""
    return await in_transaction(request, _read, tenant_id=principal.tenant_id, run_id=run_id)


@router.post(
    "/runs",
    status_code=202,
    responses=WRITE_ERRORS,
    summary="Queue a cycle",
    openapi_extra=examples.RUN,
)
async def queue_run(body: RunCreate, request: Request, principal: Runner) -> RunRead:
    """Queue a cycle of the domain for the workers: 202 with the queued run; 409 when one is
    already queued (a running one does not stop another from queueing: it waits its turn),
    or when the database is the embedded SQLite (no workers there). Scope `models:write`."""
    return await in_transaction(request, _queue, tenant_id=principal.tenant_id, domain=body.domain)


@router.post("/runs/{run_id}/cancel", responses=WRITE_ERRORS, summary="Cancel a run")
async def cancel_run(run_id: RunPath, request: Request, principal: Runner) -> RunRead:
    """Cancel a run: a queued one at once (`cancelled`), a running one at its next check
    (`cancel_requested_at` set). 409 if it has already finished. No body. Scope
    `models:write`."""
    return await in_transaction(request, _cancel, tenant_id=principal.tenant_id, run_id=run_id)


def _list(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    domain: str | None,
    status: str | None,
    limit: int,
) -> RunList:
    found = runs.list_runs(
        session=session, tenant_id=tenant_id, domain=domain, status=status, limit=limit
    )
    return RunList(items=[_run_read(session, run) for run in found])


def _read(*, session: Session, tenant_id: uuid.UUID, run_id: uuid.UUID) -> RunRead:
    return _run_read(session, runs.get_run(session, tenant_id=tenant_id, run_id=run_id))


def _queue(*, session: Session, tenant_id: uuid.UUID, domain: str) -> RunRead:
    run = jobs.queue_and_defer(session, tenant_id=tenant_id, domain=domain, trigger="api")
    return _run_read(session, run)


def _cancel(*, session: Session, tenant_id: uuid.UUID, run_id: uuid.UUID) -> RunRead:
    return _run_read(session, jobs.cancel_run(session, tenant_id=tenant_id, run_id=run_id))


def _run_read(session: Session, run: Run) -> RunRead:
    return RunRead(
        id=run.id,
        domain=session.get_one(Domain, run.domain_id).name,
        method=run.method,
        status=run.status,
        trigger=(run.config or {}).get("trigger"),
        steps=run.steps or {},
        error=run.error,
        dataset_version_id=run.dataset_version_id,
        mlflow_run_id=run.mlflow_run_id,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        heartbeat_at=run.heartbeat_at,
        cancel_requested_at=run.cancel_requested_at,
    )
