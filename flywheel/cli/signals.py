"""`flywheel compile` (feedback events into training signal) and `flywheel forget` (a rater's or
a source record's data, and everything derived from it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from flywheel.cli.common import (
    JsonOption,
    cli_actor,
    database_sessions,
    emit,
    progress_bar,
    resolve_tenant_id,
)

if TYPE_CHECKING:
    from flywheel.feedback.forget import ForgetReport
    from flywheel.signals.compile import CompileReport

TenantOption = typer.Option(
    None, "--tenant", help="The domain's tenant (may be left out when there is only one)."
)


def compile_command(
    domain: str | None = typer.Option(None, "--domain", help="Only this domain."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Compile feedback events into preference pairs, SFT examples and labels."""
    from flywheel.db import unit_of_work
    from flywheel.signals.compile import compile_feedback
    from flywheel.tenancy.service import get_domain

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            tenant_id = resolve_tenant_id(session, tenant)
            domain_id = None if domain is None else get_domain(session, tenant_id, domain).id
        with progress_bar("compiling prompts", is_quiet=as_json) as advance:
            report = compile_feedback(
                sessions, tenant_id=tenant_id, domain_id=domain_id, progress=advance, link=True
            )
    emit(report.as_json(), as_json=as_json, text=_compile_lines(report))


def forget_command(
    rater: str | None = typer.Option(None, "--rater", help="A rater id: their feedback events."),
    source_record: str | None = typer.Option(
        None,
        "--source-record",
        help="A source record id as ingested (a ticket like zendesk:4711, a task id).",
    ),
    tenant: str | None = TenantOption,
    actor: str = typer.Option(
        None, "--actor", help="Who asks, for the audit (default: the OS user)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Delete a rater's or a source record's data and what was derived from it; taint the
    dataset and model versions that used it. Audited."""
    from flywheel.db import unit_of_work
    from flywheel.feedback.forget import forget

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            tenant_id = resolve_tenant_id(session, tenant)
        report = forget(
            sessions,
            tenant_id=tenant_id,
            rater=rater,
            source_record=source_record,
            actor=actor or cli_actor(),
        )
    emit(report.as_json(), as_json=as_json, text=_forget_line(report))


def _compile_lines(report: CompileReport) -> str:
    lines = []
    for compiled in report.domains:
        counts = {key: value for key, value in compiled.as_json().items() if isinstance(value, int)}
        lines.append(f"{compiled.domain}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return "\n".join(lines) or "no domains to compile"


def _forget_line(report: ForgetReport) -> str:
    deleted = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())) or "nothing"
    return (
        f"forgot ({report.request_id}): deleted {deleted}; tainted "
        f"{len(report.dataset_version_ids)} dataset version(s), "
        f"{len(report.model_version_ids)} model version(s)"
    )
