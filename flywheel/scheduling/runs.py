"""Cycle runs as rows: queue one, claim one to run (or resume), cancel one, list them.

A cycle is a `Run` with method `cycle`; its `steps` hold each step's status, timings
and result. At most one cycle of a domain runs at a time, whoever runs it (a worker or
`flywheel cycle`): a partial unique index on running cycles decides, and a running cycle whose
heartbeat is older than `cycle_stale_after_s` is presumed dead and may be taken over.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from flywheel.db import utcnow
from flywheel.errors import Conflict, InvalidState, NotFound
from flywheel.registry.models import Run
from flywheel.tenancy.models import Domain
from flywheel.tenancy.service import get_domain

FINISHED = ("succeeded", "failed", "cancelled", "skipped")
NO_CONFIG = hashlib.sha256(b"{}").hexdigest()


def queue_cycle(session: Session, *, tenant_id: uuid.UUID, domain: str, trigger: str) -> Run:
    """A queued cycle run; Conflict when the domain already has one waiting."""
    return queue_domain_cycle(session, get_domain(session, tenant_id, domain), trigger=trigger)


def queue_domain_cycle(session: Session, domain: Domain, *, trigger: str) -> Run:
    """`queue_cycle` of a domain already looked up."""
    waiting = session.scalars(_cycles(domain.id).where(Run.status == "queued")).first()
    if waiting is not None:
        raise Conflict(f"a cycle of {domain.name} is already queued (run {waiting.id})")
    run = _new_run(domain, trigger, status="queued")
    session.add(run)
    session.flush()
    return run


def claim_run(
    session: Session,
    *,
    domain: Domain,
    trigger: str,
    run_id: uuid.UUID | None,
    stale_after_s: float,
) -> Run:
    """The run to carry out now, marked running: the given one (a worker's job, perhaps
    retried after its worker died), else the domain's interrupted cycle (resumed at its failed
    step), else a new one. Conflict while another live cycle of the domain runs."""
    running = session.scalars(_cycles(domain.id).where(Run.status == "running")).first()
    if run_id is not None:
        run = _own_run(session, domain.tenant_id, run_id)
        if run.status == "running" and not _is_stale(run, stale_after_s):
            raise Conflict(f"run {run_id} is running elsewhere (its heartbeat is fresh)")
    else:
        run = _interrupted(session, domain.id, stale_after_s) or _new_run(domain, trigger)
    if running is not None and running.id != run.id:
        if not _is_stale(running, stale_after_s):
            raise Conflict(
                f"a cycle of {domain.name} is running (run {running.id}, alive at "
                f"{running.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)"
            )
        running.status = "failed"
        running.error = "abandoned: its process stopped heart-beating"
        running.finished_at = utcnow()
        session.flush()
    run.status, run.error, run.finished_at = "running", None, None
    run.started_at = run.started_at or utcnow()
    run.heartbeat_at = utcnow()
    session.add(run)
    try:
        session.flush()
    except IntegrityError as error:  # another process claimed the domain a moment earlier
        raise Conflict(f"a cycle of {domain.name} has just started elsewhere") from error
    return run


def request_cancel(session: Session, *, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run:
    """Queued: cancelled at once. Running: asked to stop (it checks every heartbeat, and a
    training subprocess gets a SIGTERM, checkpoints and exits)."""
    run = _own_run(session, tenant_id, run_id)
    if run.status in FINISHED:
        raise InvalidState(f"run {run_id} has already finished ({run.status})")
    run.cancel_requested_at = utcnow()
    if run.status == "queued":
        run.status, run.finished_at = "cancelled", utcnow()
    session.flush()
    return run


def list_runs(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    domain: str | None = None,
    status: str | None = None,
    limit: int = 50,
) -> list[Run]:
    """The tenant's runs (cycles and trainings), newest first."""
    query = select(Run).where(Run.tenant_id == tenant_id)
    if domain is not None:
        query = query.where(Run.domain_id == get_domain(session, tenant_id, domain).id)
    if status is not None:
        query = query.where(Run.status == status)
    return list(session.scalars(query.order_by(Run.created_at.desc()).limit(limit)))


def get_run(session: Session, *, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run:
    return _own_run(session, tenant_id, run_id)


def _cycles(domain_id: uuid.UUID) -> Select[Run]:
    return (
        select(Run)
        .where(Run.domain_id == domain_id, Run.method == "cycle")
        .order_by(Run.created_at.desc())
    )


def _new_run(domain: Domain, trigger: str, status: str = "running") -> Run:
    return Run(
        tenant_id=domain.tenant_id,
        domain_id=domain.id,
        method="cycle",
        config={"trigger": trigger},
        config_sha256=NO_CONFIG,
        status=status,
        steps={},
    )


def _own_run(session: Session, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run:
    run = session.get(Run, run_id)
    if run is None or run.tenant_id != tenant_id:
        raise NotFound(f"run {run_id} not found")
    return run


def _interrupted(session: Session, domain_id: uuid.UUID, stale_after_s: float) -> Run | None:
    """The domain's latest cycle if it did not finish: failed, or running but dead."""
    latest = session.scalars(
        _cycles(domain_id).where(Run.status.in_(("failed", "running")))
    ).first()
    if latest is None:
        return None
    newer_done = session.scalars(
        _cycles(domain_id).where(
            Run.status.in_(("succeeded", "skipped", "cancelled")),
            Run.created_at > latest.created_at,
        )
    ).first()
    if newer_done is not None:
        return None
    if latest.status == "running" and not _is_stale(latest, stale_after_s):
        return None
    return latest


def last_beat(run: Run) -> datetime:
    """When the run last showed it was alive: its heartbeat, else its start or creation."""
    return run.heartbeat_at or run.started_at or run.created_at


def _is_stale(run: Run, stale_after_s: float) -> bool:
    return utcnow() - last_beat(run) > timedelta(seconds=stale_after_s)
