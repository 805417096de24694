"""`flywheel runs list|show|trigger|cancel`: cycle and training runs, and queued cycles."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import JsonOption, database_session, emit, resolve_tenant_id
from flywheel.errors import InvalidInput

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from flywheel.registry.models import Run

runs = typer.Typer(
    help="List, trigger and cancel runs (cycles and trainings).", no_args_is_help=True
)

TenantOption = typer.Option(None, "--tenant", help="The tenant (when there is more than one).")
RunArgument = typer.Argument(..., help="The run's id.")


@runs.command("list")
def list_command(
    domain: str | None = typer.Option(None, "--domain", help="Only this domain's runs."),
    status: str | None = typer.Option(None, "--status", help="Only runs in this status."),
    limit: int = typer.Option(50, min=1, max=1000, help="At most this many (newest first)."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """The tenant's runs, newest first."""
    from flywheel.registry.models import RUN_STATUSES
    from flywheel.scheduling import runs as service

    if status is not None and status not in RUN_STATUSES:
        raise InvalidInput(f"unknown status {status!r}: one of {', '.join(RUN_STATUSES)}")
    with database_session() as session:
        found = service.list_runs(
            session=session,
            tenant_id=resolve_tenant_id(session, tenant),
            domain=domain,
            status=status,
            limit=limit,
        )
        names = _domain_names(session, {run.domain_id for run in found})
        data = [run_json(run, names[run.domain_id]) for run in found]
    lines = [
        f"{r['id']}  {r['domain']}  {r['method']:<5}  {r['status']:<9}  {r['created_at'][:19]}"
        + (f"  {r['error']}" if r["error"] else "")
        for r in data
    ]
    emit(data, as_json=as_json, text="\n".join(lines) or "no runs")


@runs.command("show")
def show(
    run_id: uuid.UUID = RunArgument, tenant: str | None = TenantOption, as_json: bool = JsonOption
) -> None:
    """One run, with its steps."""
    from flywheel.scheduling import runs as service

    with database_session() as session:
        run = service.get_run(session, tenant_id=resolve_tenant_id(session, tenant), run_id=run_id)
        data = run_json(run, _domain_names(session, {run.domain_id})[run.domain_id])
    steps = [f"  {name}: {step.get('status')}" for name, step in data["steps"].items()]
    emit(data, as_json=as_json, text="\n".join([f"{run_id} {data['status']}", *steps]))


@runs.command("trigger")
def trigger(
    domain: str = typer.Option(..., "--domain", help="The domain."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Queue a cycle of the domain for the workers (PostgreSQL; `flywheel cycle` runs inline)."""
    from flywheel.scheduling import jobs

    with database_session() as session:
        run = jobs.queue_and_defer(
            session,
            tenant_id=resolve_tenant_id(session, tenant),
            domain=domain,
            trigger="manual",
        )
        data = run_json(run, domain)
    emit(data, as_json=as_json, text=f"queued cycle {data['id']} of {domain} (job {run.job_id})")


@runs.command("cancel")
def cancel(
    run_id: uuid.UUID = RunArgument, tenant: str | None = TenantOption, as_json: bool = JsonOption
) -> None:
    """Cancel a run: a queued one at once, a running one at its next check."""
    from flywheel.scheduling import jobs

    with database_session() as session:
        run = jobs.cancel_run(session, tenant_id=resolve_tenant_id(session, tenant), run_id=run_id)
        data = run_json(run, _domain_names(session, {run.domain_id})[run.domain_id])
    text = (
        f"cancelled {run_id}"
        if data["status"] == "cancelled"
        else f"asked {run_id} to stop: it ends at its next check"
    )
    emit(data, as_json=as_json, text=text)


def run_json(run: Run, domain: str) -> dict[str, Any]:
    def when(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": str(run.id),
        "domain": domain,
        "method": run.method,
        "status": run.status,
        "trigger": (run.config or {}).get("trigger"),
        "steps": run.steps or {},
        "error": run.error,
        "dataset_version_id": str(run.dataset_version_id) if run.dataset_version_id else None,
        "mlflow_run_id": run.mlflow_run_id,
        "job_id": run.job_id,
        "created_at": when(run.created_at),
        "started_at": when(run.started_at),
        "finished_at": when(run.finished_at),
        "heartbeat_at": when(run.heartbeat_at),
        "cancel_requested_at": when(run.cancel_requested_at),
    }


def _domain_names(session: Session, ids: set[uuid.UUID]) -> dict[uuid.UUID, str]:
    from sqlalchemy import select

    from flywheel.tenancy.models import Domain

    rows = session.execute(select(Domain.id, Domain.name).where(Domain.id.in_(ids)))
    return {row.id: row.name for row in rows}
