"""`flywheel verify`: verifier QA for a task file, or for a domain's stored tasks."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress

from flywheel.cli.common import JsonOption, database_session, emit
from flywheel.errors import InvalidInput
from flywheel.sandbox.qa import QaResult, TaskSpec, load_task_file
from flywheel.signals import verification
from flywheel.tenancy import service as tenancy


def verify(
    file: Path | None = typer.Option(
        None, "--file", help="A HumanEval-format JSONL task file (.jsonl or .jsonl.gz)."
    ),
    domain: str | None = typer.Option(None, "--domain", help="QA this domain's stored tasks."),
    tenant: str | None = typer.Option(None, "--tenant", help="The domain's tenant."),
    recheck: bool = typer.Option(False, help="Also re-check tasks already marked."),
    workers: int = typer.Option(os.cpu_count() or 1, min=1, help="Tasks checked at once."),
    as_json: bool = JsonOption,
) -> None:
    """Mark tasks usable only if the reference passes 3 runs and trivial solutions fail."""
    if (file is None) == (domain is None):
        raise InvalidInput("give exactly one of --file or --domain (with --tenant)")
    if file is not None:
        results = _with_progress(load_task_file(file), workers, as_json)
    else:
        results = _verify_domain(domain or "", tenant, recheck, workers, as_json)
    _report(results, as_json)


def _verify_domain(
    domain: str, tenant: str | None, recheck: bool, workers: int, quiet: bool
) -> list[QaResult]:
    if tenant is None:
        raise InvalidInput("--domain needs --tenant")
    with database_session() as session:
        owner = tenancy.get_tenant(session=session, name=tenant)
        domain_id = tenancy.get_domain(session, owner.id, domain).id
        tasks = verification.pending_tasks(
            session=session, domain_id=domain_id, include_checked=recheck
        )
        specs = [verification.task_spec(task) for task in tasks]
    # QA can take minutes: no transaction stays open meanwhile.
    results = _with_progress(specs, workers, quiet)
    with database_session() as session:
        verification.record_results(session=session, results=results)
    return results


def _with_progress(specs: list[TaskSpec], workers: int, quiet: bool) -> list[QaResult]:
    with Progress(console=Console(stderr=True), disable=quiet, transient=True) as progress:
        bar = progress.add_task("verifying tasks", total=len(specs))
        return verification.check_all(
            specs, workers=workers, on_done=lambda _: progress.advance(bar)
        )


def _report(results: list[QaResult], as_json: bool) -> None:
    counts = Counter(result.status for result in results)
    reasons = Counter(
        result.reason.split(":")[0] for result in results if result.status != "usable"
    )
    data = {
        "usable": counts["usable"],
        "unusable": counts["unusable"],
        "flaky": sum(result.is_flaky for result in results),
        "reasons": dict(reasons),
        "tasks": [dataclasses.asdict(result) for result in results],
    }
    lines = [f"{data['usable']} usable, {data['unusable']} unusable ({data['flaky']} flaky)"]
    lines += [f"  {count:>5}  {reason}" for reason, count in reasons.most_common()]
    emit(data, as_json=as_json, text="\n".join(lines))
