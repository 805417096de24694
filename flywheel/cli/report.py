"""`flywheel report --domain D [--out FILE]`: the domain's history as one HTML file."""

from __future__ import annotations

from pathlib import Path

import typer

from flywheel.cli.common import (
    JsonOption,
    database_sessions,
    emit,
    resolve_tenant_id,
    settings,
    step,
)


def report(
    domain: str = typer.Option(..., "--domain", help="The domain."),
    tenant: str | None = typer.Option(None, "--tenant", help="The domain's tenant."),
    out: Path | None = typer.Option(
        None, "--out", help="The HTML file to write (default: <workspace>/reports/<domain>.html)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Datasets, training runs and their curves, evaluations, gate decisions and promotions of
    a domain, in one self-contained HTML file."""
    from flywheel.db import unit_of_work
    from flywheel.reporting import write_report

    current = settings()
    target = out if out is not None else current.home / "reports" / f"{domain}.html"
    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            tenant_id = resolve_tenant_id(session, tenant)
        with step(f"writing the report of {domain}", is_quiet=as_json):
            written = write_report(
                sessions, tenant_id=tenant_id, domain=domain, settings=current, out=target
            )
    emit({"report": str(written)}, as_json=as_json, text=str(written))
