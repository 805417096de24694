"""What became of each function of a repository: a task (and what verifier QA made of it),
or the reason it is none. `flywheel ingest repo` prints it as the run's yield.

    functions 37, tasks 13, usable 12 (92% of tasks), unusable 1, pending 0
    src/humanize/number.py::ordinal: task, usable
    src/humanize/lists.py::natural_list: rejected, no_tests (no test of the repository ...)
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from flywheel.signals import verification

MAX_REF_CHARS = 1024  # what the source_ref column holds


@dataclass(frozen=True)
class Outcome:
    """One record's outcome: `reason` is `task` for a record that became tasks."""

    ref: str  # "src/humanize/number.py::ordinal", "commit 1a2b3c4", a skipped file's path
    kind: str  # function, file, commit
    reason: str
    detail: str = ""
    task_refs: tuple[str, ...] = ()  # the tasks' provenance source refs


def yield_report(session: Session, domain_id: uuid.UUID, outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts (functions seen, tasks, usable/unusable/pending at QA, rejections by reason)
    and each record's outcome, with the QA status of its tasks as the database holds it."""
    statuses = _statuses(session, domain_id, [r for o in outcomes for r in o.task_refs])
    functions = [outcome for outcome in outcomes if outcome.kind == "function"]
    tasks = [ref for outcome in outcomes for ref in outcome.task_refs]
    qa = Counter(statuses.get(ref, ("pending", ""))[0] for ref in tasks)
    return {
        "functions": len(functions),
        "tasks": len(tasks),
        "usable": qa["usable"],
        "unusable": qa["unusable"],
        "pending": qa["pending"],
        "usable_share": round(qa["usable"] / len(tasks), 3) if tasks else None,
        "rejected": dict(Counter(o.reason for o in functions if o.reason != "task").most_common()),
        "records": [_record(outcome, statuses) for outcome in outcomes],
    }


def _statuses(
    session: Session, domain_id: uuid.UUID, refs: list[str]
) -> dict[str, tuple[str, str]]:
    """Each task's QA status and reason, by its source ref (as the column holds it)."""
    wanted = {ref[:MAX_REF_CHARS]: ref for ref in refs}
    tasks = verification.pending_tasks(session=session, domain_id=domain_id, include_checked=True)
    return {
        wanted[str(task.source_ref)]: (task.verifier_status, task.verifier_reason or "")
        for task in tasks
        if task.source_ref in wanted
    }


def _record(outcome: Outcome, statuses: dict[str, tuple[str, str]]) -> dict[str, Any]:
    record: dict[str, Any] = {"ref": outcome.ref, "kind": outcome.kind, "outcome": outcome.reason}
    if outcome.detail:
        record["detail"] = outcome.detail
    if outcome.task_refs:
        record["tasks"] = [
            {"ref": ref, "verifier": status, "reason": reason}
            for ref in outcome.task_refs
            for status, reason in [statuses.get(ref, ("pending", ""))]
        ]
    return record


def report_lines(report: dict[str, Any]) -> str:
    """The report for people: the counts, then one line per record."""
    share = report["usable_share"]
    lines = [
        f"functions {report['functions']}, tasks {report['tasks']}, usable {report['usable']}"
        + (f" ({share:.0%} of tasks)" if share is not None else "")
        + f", unusable {report['unusable']}, pending {report['pending']}"
    ]
    for record in report["records"]:
        if "tasks" in record:
            verdicts = ", ".join(_verdict(task) for task in record["tasks"])
            lines.append(f"  {record['ref']}: task, {verdicts}")
        else:
            detail = f" ({record['detail']})" if record.get("detail") else ""
            lines.append(f"  {record['ref']}: rejected, {record['outcome']}{detail}")
    return "\n".join(lines)


def _verdict(task: dict[str, Any]) -> str:
    if task["verifier"] == "unusable":
        return f"unusable ({task['reason']})"
    return str(task["verifier"])
