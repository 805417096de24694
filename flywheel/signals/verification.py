"""Verifier QA over stored tasks: mark each verifiable task usable or unusable, with why."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from flywheel.sandbox.qa import QaResult, TaskSpec, check_task
from flywheel.signals.models import VerifiableTask


def pending_tasks(
    *, session: Session, domain_id: uuid.UUID | None, include_checked: bool = False
) -> list[VerifiableTask]:
    """Code tasks awaiting QA (or all code tasks), of one domain or every domain."""
    query = select(VerifiableTask).where(VerifiableTask.task_kind == "code")
    if domain_id is not None:
        query = query.where(VerifiableTask.domain_id == domain_id)
    if not include_checked:
        query = query.where(VerifiableTask.verifier_status == "pending")
    return list(session.scalars(query.order_by(VerifiableTask.created_at)))


def task_spec(task: VerifiableTask) -> TaskSpec:
    tests = "\n\n".join(part for part in (task.visible_tests, task.hidden_tests) if part)
    return TaskSpec(
        task_id=str(task.id),
        prompt=task.prompt,
        reference_solution=task.reference_solution or "",
        tests=tests,
        entry_point=task.entry_point or "",
    )


def check_all(
    specs: Iterable[TaskSpec], *, workers: int, on_done: Callable[[QaResult], None]
) -> list[QaResult]:
    """QA every task concurrently; `on_done` sees each result as it arrives (progress)."""

    def run(spec: TaskSpec) -> QaResult:
        result = check_task(spec)
        on_done(result)
        return result

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, specs))


def record_results(*, session: Session, results: list[QaResult]) -> None:
    """Write each task's QA status and reason, in one bulk UPDATE by primary key."""
    if not results:
        return
    rows = [
        {
            "id": uuid.UUID(result.task_id),
            "verifier_status": result.status,
            "verifier_reason": result.reason,
        }
        for result in results
    ]
    session.execute(update(VerifiableTask), rows)
