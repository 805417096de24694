"""Driving a compile: one transaction per domain, a watermark, an ingest run with the counts."""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import domain_lock, unit_of_work, utcnow
from flywheel.errors import NotFound
from flywheel.feedback.models import FeedbackEvent
from flywheel.signals.compile.evidence import Scope, count_events, evidence_rows, prepare
from flywheel.signals.compile.items import Prompt, Texts, prompts, stage
from flywheel.signals.compile.prefetch import Prefetch
from flywheel.signals.compile.rules import Verdicts, judge
from flywheel.signals.compile.writer import COMPILER_VERSION, Writer
from flywheel.signals.dedup import link_near_duplicates
from flywheel.signals.ingest_runs import Source, record_ingest_run
from flywheel.signals.models import IngestRun
from flywheel.tenancy.models import Domain

# Events whose transaction commits after a compile read past them would be missed by a plain
# watermark; a compile therefore also revisits the prompts of events stamped this long before
# the last watermark (recompiling an unchanged prompt changes nothing).
REVISIT = timedelta(minutes=10)
PROGRESS_GROUPS = 10_000

Progress = Callable[[int], None]  # called with the number of prompts just compiled


@dataclass
class CompileCounts:
    """What one compile did: events and prompts read, items produced, rows written."""

    events_read: int = 0
    groups: int = 0
    pairs: int = 0
    sft: int = 0
    labels: int = 0
    ties_dropped: int = 0
    conflicts: int = 0
    conflicts_dropped: int = 0
    inserted: int = 0
    updated: int = 0
    retracted: int = 0

    def add(self, other: CompileCounts) -> None:
        for name in (item.name for item in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class DomainCompile:
    """One domain's compile: its ingest run, the watermark it reached, its counts, and how
    many of its new items the near-duplicate pass after it linked (None: no pass ran)."""

    domain_id: uuid.UUID
    domain: str
    run_id: uuid.UUID
    watermark: datetime | None
    counts: CompileCounts
    near_duplicates: int | None = None

    def as_json(self) -> dict[str, Any]:
        linked = {} if self.near_duplicates is None else {"near_duplicate": self.near_duplicates}
        return {
            "domain": self.domain,
            "domain_id": str(self.domain_id),
            "run_id": str(self.run_id),
            "watermark": self.watermark.isoformat() if self.watermark else None,
            **asdict(self.counts),
            **linked,
        }


@dataclass
class CompileReport:
    tenant_id: uuid.UUID
    domains: list[DomainCompile] = field(default_factory=list)

    @property
    def totals(self) -> CompileCounts:
        totals = CompileCounts()
        for domain in self.domains:
            totals.add(domain.counts)
        return totals

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant_id": str(self.tenant_id),
            "totals": asdict(self.totals),
            "domains": [item.as_json() for item in self.domains],
        }


def compile_feedback(
    sessions: sessionmaker[Session],
    *,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID | None = None,
    progress: Progress | None = None,
    link: bool = False,
) -> CompileReport:
    """Compile the feedback of one domain, or of every domain of the tenant (each in its own
    transaction). With `link`, each domain's new signal is then linked to its near-duplicates
    (in a transaction of its own): what `flywheel compile` and a cycle's compile step do.
    NotFound for a domain that is not the tenant's."""
    with sessions() as session:
        query = select(Domain.id, Domain.name).where(Domain.tenant_id == tenant_id)
        if domain_id is not None:
            query = query.where(Domain.id == domain_id)
        domains = [(row[0], row[1]) for row in session.execute(query.order_by(Domain.name))]
    if domain_id is not None and not domains:
        raise NotFound(f"domain {domain_id} not found")
    report = CompileReport(tenant_id)
    for each_id, name in domains:
        compiled = _compile_domain(sessions, tenant_id, each_id, name, progress)
        if link:
            with unit_of_work(sessions) as session:
                linked = sum(link_near_duplicates(session, domain_id=each_id).values())
            compiled = replace(compiled, near_duplicates=linked)
        report.domains.append(compiled)
    return report


def _compile_domain(
    sessions: sessionmaker[Session],
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    name: str,
    progress: Progress | None,
) -> DomainCompile:
    """The compile in one transaction; a failure is recorded as a failed run, then re-raised."""
    try:
        with unit_of_work(sessions) as session:
            return _compile(session, tenant_id, domain_id, name, progress)
    except Exception as error:
        with unit_of_work(sessions) as session:
            _record_run(session, tenant_id, domain_id, status="failed", error=repr(error)[:4000])
        raise


def _compile(
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    name: str,
    progress: Progress | None,
) -> DomainCompile:
    domain_lock(session, domain_id, "compile")
    previous = _previous_watermark(session, domain_id)
    newest = _newest_event(session, tenant_id, domain_id)
    scope = Scope(tenant_id, domain_id, since=None if previous is None else previous - REVISIT)
    counts = _compile_scope(session, scope, retract=previous is not None, progress=progress)
    watermark = max(filter(None, (previous, newest)), default=None)
    run = _record_run(
        session,
        tenant_id,
        domain_id,
        status="succeeded",
        counts=counts,
        watermark=watermark,
        read=f"{scope.since}..{watermark}",
    )
    return DomainCompile(domain_id, name, run.id, watermark, counts)


def recompile_prompts(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, prompts: Iterable[str]
) -> CompileCounts:
    """Recompile these conversations (JSON texts) of the domain from the events they have
    now, inside the caller's transaction, retracting what the evidence no longer supports.
    The compile watermark is left alone (no run is recorded): `flywheel forget` uses it
    after deleting events."""
    domain_lock(session, domain_id, "compile")
    scope = Scope(tenant_id, domain_id, since=None, prompts=tuple(sorted(prompts)))
    return _compile_scope(session, scope, retract=True, progress=None)


def _compile_scope(
    session: Session, scope: Scope, *, retract: bool, progress: Progress | None
) -> CompileCounts:
    """Judge the scope's prompts and write their items (a large domain's redaction runs
    beside it: `prefetch`)."""
    texts = Texts()
    engine = session.get_bind().engine
    prepare(session, scope)
    counts = CompileCounts(events_read=count_events(session, scope))
    with Prefetch(
        engine,
        texts,
        scope.tenant_id,
        scope.domain_id,
        full=not scope.is_partial,
        events=counts.events_read,
    ) as ahead:
        writer = Writer(
            session,
            tenant_id=scope.tenant_id,
            domain_id=scope.domain_id,
            now=utcnow(),
            retract=retract,
        )
        with writer as w:
            for prompt in prompts(ahead.rows(evidence_rows(session, scope)), texts):
                verdicts = judge(prompt.evidence)
                _count(counts, prompt, verdicts, stage(prompt, verdicts, w, texts))
                w.add_group(prompt.group_key)
                if progress is not None and counts.groups % PROGRESS_GROUPS == 0:
                    progress(PROGRESS_GROUPS)
            written = w.finish()
    counts.inserted, counts.updated, counts.retracted = (
        written.inserted,
        written.updated,
        written.retracted,
    )
    if progress is not None and counts.groups % PROGRESS_GROUPS:
        progress(counts.groups % PROGRESS_GROUPS)
    return counts


def _count(counts: CompileCounts, prompt: Prompt, verdicts: Verdicts, staged: Counter[str]) -> None:
    counts.groups += 1
    counts.pairs += staged["pairs"]
    counts.sft += staged["sft"]
    counts.labels += staged["labels"]
    counts.ties_dropped += prompt.evidence.ties
    counts.conflicts += verdicts.conflicts
    counts.conflicts_dropped += verdicts.conflicts_dropped


def _previous_watermark(session: Session, domain_id: uuid.UUID) -> datetime | None:
    checkpoint = session.scalar(
        select(IngestRun.checkpoint)
        .where(
            IngestRun.domain_id == domain_id,
            IngestRun.source_kind == "feedback",
            IngestRun.source_format == "compile",
            IngestRun.status == "succeeded",
        )
        .order_by(IngestRun.created_at.desc())
        .limit(1)
    )
    if not checkpoint or checkpoint.get("watermark") is None:
        return None
    return datetime.fromisoformat(checkpoint["watermark"])


def _newest_event(session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID) -> datetime | None:
    return session.scalar(
        select(FeedbackEvent.created_at)
        .where(FeedbackEvent.tenant_id == tenant_id, FeedbackEvent.domain_id == domain_id)
        .order_by(FeedbackEvent.created_at.desc())
        .limit(1)
    )


def _record_run(
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    *,
    status: str,
    counts: CompileCounts | None = None,
    watermark: datetime | None = None,
    read: str = "",
    error: str | None = None,
) -> IngestRun:
    """The run's record; its fingerprint is that of the span of events it read."""
    source = Source(
        kind="feedback",
        format="compile",
        ref=f"feedback_events of domain {domain_id}",
        fingerprint=hashlib.sha256(f"{domain_id}:{read}".encode()).hexdigest(),
        ingestor_version=COMPILER_VERSION,
    )
    return record_ingest_run(
        session,
        tenant_id=tenant_id,
        domain_id=domain_id,
        source=source,
        status=status,
        counts=asdict(counts) if counts else {},
        checkpoint={"watermark": watermark.isoformat() if watermark else None},
        error=error,
    )
