"""A domain's flywheel history as one self-contained HTML file.

    report = gather_report(session, tenant_id=..., domain="billing", tracking_uri=...)
    html = render_html(report)
    write_report(sessions, tenant_id=..., domain="billing", settings=settings, out=path)

The database gives the dataset versions, runs (a cycle's per-step timings), model
versions with their held-out evaluation and gate decision, and the promotion audit trail;
MLflow gives each training run's loss and reward curves. A run whose metrics MLflow cannot
give (unknown run id, store down) is reported as "metrics unavailable": the rest stands.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.models import DatasetVersion
from flywheel.db import utcnow
from flywheel.evaluation.service import PRIMARY_ORDER
from flywheel.registry.models import ModelVersion, PromotionEvent, Run
from flywheel.registry.service import (
    current_champion,
    latest_champion_event,
    registered_model_name,
)
from flywheel.reporting.metrics import MetricReader, MlflowMetricReader, RunMetrics
from flywheel.reporting.records import (
    DatasetRow,
    DomainReport,
    EvalRow,
    EventRow,
    RunRow,
    SliceRow,
    StepRow,
)
from flywheel.reporting.render import render_html
from flywheel.settings import Settings
from flywheel.tenancy.models import Tenant
from flywheel.tenancy.service import get_domain

__all__ = ["DomainReport", "gather_report", "render_html", "write_report"]

STEP_ORDER = ("compile", "build", "train", "evaluate", "promote")
"""A cycle's steps in pipeline order (`train_sft` and the like count as `train`)."""


def gather_report(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    domain: str,
    tracking_uri: str,
    metrics: MetricReader | None = None,
) -> DomainReport:
    """Everything the report shows, as plain data. NotFound for an unknown domain. `metrics`
    replaces the MLflow reader at `tracking_uri` (a fake, in tests)."""
    found = get_domain(session, tenant_id, domain)
    datasets = session.scalars(
        select(DatasetVersion)
        .where(DatasetVersion.domain_id == found.id)
        .order_by(DatasetVersion.version)
    ).all()
    versions = sorted(
        session.scalars(select(ModelVersion).where(ModelVersion.domain_id == found.id)).all(),
        key=lambda row: (_version_key(row.version), row.created_at),
    )
    runs = session.scalars(
        select(Run).where(Run.domain_id == found.id).order_by(Run.created_at, Run.id)
    ).all()
    events = session.scalars(
        select(PromotionEvent)
        .where(PromotionEvent.domain_id == found.id)
        .order_by(PromotionEvent.created_at, PromotionEvent.id)
    ).all()
    champion = current_champion(session, found.id)
    since = latest_champion_event(session, found.id) if champion else None
    dataset_numbers = {row.id: row.version for row in datasets}
    made_by = {row.training_run_id: row.version for row in versions if row.training_run_id}
    names = {row.id: row.version for row in versions}
    reader = metrics if metrics is not None else MlflowMetricReader(tracking_uri)
    return DomainReport(
        tenant=session.get_one(Tenant, tenant_id).name,
        domain=found.name,
        registered_model=registered_model_name(session, found),
        generated_at=utcnow(),
        champion=champion.version if champion else None,
        champion_since=since.created_at if since else None,
        datasets=[_dataset_row(row) for row in datasets],
        runs=[_run_row(row, dataset_numbers, made_by, reader) for row in runs],
        evaluations=[_eval_row(row) for row in versions],
        events=[_event_row(row, names) for row in events],
    )


def write_report(
    sessions: sessionmaker[Session],
    *,
    tenant_id: uuid.UUID,
    domain: str,
    settings: Settings,
    out: Path,
) -> Path:
    """Gather, render and write the report to `out` atomically (a reader never sees half a
    file); the path written."""
    with sessions() as session:
        report = gather_report(
            session,
            tenant_id=tenant_id,
            domain=domain,
            tracking_uri=settings.resolved_mlflow_tracking_uri,
        )
    document = render_html(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(document)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return out


def _dataset_row(row: DatasetVersion) -> DatasetRow:
    stats = _dict(row.stats)
    return DatasetRow(
        version=row.version,
        created_at=row.created_at,
        train=_counts(stats.get("train")),
        eval=_counts(stats.get("eval")),
        is_tainted=row.tainted_at is not None,
    )


def _run_row(
    run: Run,
    dataset_numbers: Mapping[uuid.UUID, int],
    made_by: Mapping[uuid.UUID, str],
    reader: MetricReader,
) -> RunRow:
    metrics, error = _read_metrics(reader, run.mlflow_run_id) if run.mlflow_run_id else (None, None)
    return RunRow(
        id=str(run.id),
        method=run.method,
        status=run.status,
        dataset_version=dataset_numbers.get(run.dataset_version_id)
        if run.dataset_version_id
        else None,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        error=run.error,
        mlflow_run_id=run.mlflow_run_id,
        model_version=made_by.get(run.id),
        steps=_steps(run.steps),
        metrics=metrics,
        metrics_error=error,
    )


def _read_metrics(reader: MetricReader, run_id: str) -> tuple[RunMetrics | None, str | None]:
    try:
        return reader.read(run_id), None
    except Exception as error:  # any MLflow, store or network failure spoils this run only
        text = " ".join(str(error).split()) or type(error).__name__
        return None, text[:300]


def _steps(raw: object) -> list[StepRow]:
    """A cycle's steps, whatever shape the column holds: unknown shapes give no steps, a step
    that is not a mapping is read as its status."""
    if not isinstance(raw, dict):
        return []
    rows = [_step(str(name), value) for name, value in raw.items()]
    return sorted(rows, key=lambda row: (_step_rank(row.name), row.started_at or "", row.name))


def _step(name: str, value: object) -> StepRow:
    data = _dict(value) if isinstance(value, dict) else {"status": value}
    started, finished = _iso(data.get("started_at")), _iso(data.get("finished_at"))
    duration = _number(data.get("duration_s"))
    if duration is None:
        duration = _seconds_between(started, finished)
    status = data.get("status")
    return StepRow(name, str(status) if status else "unknown", started, finished, duration)


def _step_rank(name: str) -> int:
    stem = name.split("_", 1)[0]
    return STEP_ORDER.index(stem) if stem in STEP_ORDER else len(STEP_ORDER)


def _eval_row(row: ModelVersion) -> EvalRow:
    results, gate = _dict(row.eval_results), _dict(row.gate_result)
    against = _dict(results.get("against"))
    summary = _floats(results.get("summary"))
    losses = _dict(results.get("losses"))
    promoted = gate.get("is_promoted")
    reasons = gate.get("reasons")
    against_name = against.get("version") or gate.get("against")
    return EvalRow(
        version=row.version,
        created_at=row.created_at,
        against=str(against_name) if against_name is not None else None,
        dataset_version=_int(results.get("dataset_version")),
        summary=summary,
        against_summary=_floats(against.get("summary")),
        loss_names=sorted(name for name in summary if name in losses or name.endswith("loss")),
        primary_metric=_primary(gate, summary),
        is_promoted=promoted if isinstance(promoted, bool) else None,
        reasons=[str(reason) for reason in reasons] if isinstance(reasons, list) else [],
        is_tainted=row.tainted_at is not None,
        slices=slice_rows(gate.get("evidence")),
    )


def slice_rows(evidence: object) -> list[SliceRow]:
    """The per-slice before/after of a gate decision's evidence (older evidence, whose slices
    carry only an interval, gives what it has)."""
    entries = _dict(evidence).get("slices")
    rows = []
    for entry in entries if isinstance(entries, list) else []:
        item = _dict(entry)
        rows.append(
            SliceRow(
                label=str(item.get("slice")),
                n=_int(item.get("n")) or _int(_dict(item.get("interval")).get("n")) or 0,
                champion_mean=_number(item.get("champion_mean")),
                challenger_mean=_number(item.get("challenger_mean")),
                tolerance=_number(item.get("tolerance")),
                is_judged=bool(item.get("judged")),
                is_regressed=bool(item.get("regressed")),
            )
        )
    return rows


def _primary(gate: dict[str, Any], summary: Mapping[str, float]) -> str | None:
    evidence = gate.get("evidence")
    primary = evidence.get("primary") if isinstance(evidence, dict) else None
    if isinstance(primary, dict) and isinstance(primary.get("metric"), str):
        return str(primary["metric"])
    return next((name for name in PRIMARY_ORDER if name in summary), None)


def _event_row(row: PromotionEvent, names: Mapping[uuid.UUID, str]) -> EventRow:
    def name(version_id: uuid.UUID | None) -> str | None:
        return names.get(version_id, "?") if version_id is not None else None

    return EventRow(
        at=row.created_at,
        alias=row.alias,
        action=row.action,
        from_version=name(row.from_model_version_id),
        to_version=name(row.to_model_version_id),
        actor=row.actor,
        is_forced=row.is_forced,
        reason=row.reason,
    )


def _version_key(version: str) -> tuple[int, int, str]:
    """Registry versions in numeric order ("2" before "10"), anything else after them."""
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


def _dict(raw: object) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else {}


def _counts(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    return {str(kind): int(n) for kind, n in raw.items() if _int(n) is not None}


def _floats(raw: object) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    return {str(name): value for name, item in raw.items() if (value := _number(item)) is not None}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _iso(value: object) -> str | None:
    return str(value) if value else None


def _seconds_between(started: str | None, finished: str | None) -> float | None:
    if started is None or finished is None:
        return None
    try:
        return (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()
    except (TypeError, ValueError):  # not ISO, or one naive and one aware
        return None
