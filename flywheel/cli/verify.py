"""`flywheel verify`: verifier QA for a task file, or for a domain's stored tasks."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import (
    JsonOption,
    database_session,
    emit,
    progress_bar,
    resolve_tenant_id,
)
from flywheel.errors import InvalidInput

if TYPE_CHECKING:
    from flywheel.sandbox.qa import QaResult
    from flywheel.signals.verification import QaSpec


def verify(
    file: Path | None = typer.Option(
        None, "--file", help="A HumanEval-format JSONL task file (.jsonl or .jsonl.gz)."
    ),
    domain: str | None = typer.Option(None, "--domain", help="QA this domain's stored tasks."),
    tenant: str | None = typer.Option(
        None, "--tenant", help="The domain's tenant (may be left out when there is only one)."
    ),
    recheck: bool = typer.Option(False, help="Also re-check tasks already marked."),
    workers: int = typer.Option(os.cpu_count() or 1, min=1, help="Tasks checked at once."),
    as_json: bool = JsonOption,
) -> None:
    """Mark tasks usable only if the reference passes 3 runs and trivial solutions fail."""
    if (file is None) == (domain is None):
        raise InvalidInput("give exactly one of --file or --domain")
    if file is not None:
        from flywheel.sandbox.qa import load_task_file

        _report(_with_progress(load_task_file(file), workers, as_json), as_json)
        return
    results, checked = _verify_domain(domain or "", tenant, recheck, workers, as_json)
    if not results and checked:
        _report_nothing_pending(checked, as_json)
    else:
        _report(results, as_json)


def _verify_domain(
    domain: str, tenant: str | None, recheck: bool, workers: int, quiet: bool
) -> tuple[list[QaResult], Counter[str]]:
    """QA's results, and when no task awaited it, the statuses of those already checked."""
    from flywheel.signals import verification
    from flywheel.tenancy import service as tenancy

    with database_session() as session:
        domain_id = tenancy.get_domain(session, resolve_tenant_id(session, tenant), domain).id
        tasks = verification.pending_tasks(
            session=session, domain_id=domain_id, include_checked=recheck
        )
        specs = [verification.task_spec(task) for task in tasks]
        checked: Counter[str] = Counter()
        if not specs:
            every = verification.pending_tasks(
                session=session, domain_id=domain_id, include_checked=True
            )
            checked.update(task.verifier_status for task in every)
    # QA can take minutes: no transaction stays open meanwhile.
    results = _with_progress(specs, workers, quiet)
    with database_session() as session:
        verification.record_results(session=session, results=results)
    return results, checked


def _with_progress(specs: Sequence[QaSpec], workers: int, quiet: bool) -> list[QaResult]:
    from flywheel.signals import verification

    with progress_bar("verifying tasks", is_quiet=quiet, total=len(specs)) as advance:
        return verification.check_all(specs, workers=workers, on_done=lambda _: advance(1))


def _report_nothing_pending(checked: Counter[str], as_json: bool) -> None:
    """No task awaited QA: say how many were already checked (ingest verifies its tasks)."""
    total = sum(checked.values())
    data: dict[str, Any] = {"usable": 0, "unusable": 0, "flaky": 0, "reasons": {}, "tasks": []}
    data["already_verified"] = dict(sorted(checked.items()))
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(checked.items()))
    text = (
        f"nothing to verify: {total} task{'s' * (total != 1)} already verified ({statuses}); "
        "--recheck verifies them again"
    )
    emit(data, as_json=as_json, text=text)


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
