"""Drive an ingestor over its source: batches, atomic writes, counts, resume, progress.

Each batch of records is converted, stored and checkpointed in one transaction, so a crash
loses at most the batch in flight and a re-run of the same source resumes after the last
committed batch. A malformed record fails the run (with the record named) and writes nothing
of its batch; the run is never reported as a success. Re-reading a source that is already in
adds nothing: every row's content hash is unique per domain. Once all batches are in, the
near-duplicate pass links new items to the canonical ones they nearly repeat.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.errors import Conflict, FlywheelError, InvalidInput
from flywheel.signals.candidates import Candidate
from flywheel.signals.dedup import link_near_duplicates
from flywheel.signals.models import IngestRun
from flywheel.signals.store import StoreCounts, store_candidates
from ingest.framework import Ingestor, Rejected, SourceRecord

BATCH_RECORDS = 500

Progress = Callable[[int], None]  # called with the number of records just handled


@dataclass
class RunCounts:
    """The counts an ingest run reports (and stores in `ingest_runs.counts`)."""

    read: int = 0
    accepted: Counter[str] = field(default_factory=Counter)
    duplicate: int = 0
    near_duplicate: int = 0
    redacted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "accepted": dict(+self.accepted),
            "duplicate": self.duplicate,
            "near_duplicate": self.near_duplicate,
            "redacted": self.redacted,
            "rejected": dict(self.rejected),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunCounts:
        return cls(
            read=data.get("read", 0),
            accepted=Counter(data.get("accepted", {})),
            duplicate=data.get("duplicate", 0),
            near_duplicate=data.get("near_duplicate", 0),
            redacted=data.get("redacted", 0),
            rejected=Counter(data.get("rejected", {})),
        )

    def add(self, stored: StoreCounts) -> None:
        self.accepted.update(stored.accepted)
        self.duplicate += stored.duplicate
        self.redacted += stored.redacted


@dataclass(frozen=True)
class RunResult:
    run_id: uuid.UUID
    counts: RunCounts
    resumed_from: int  # records skipped because an earlier, crashed run committed them


@dataclass
class _Batch:
    candidates: list[Candidate] = field(default_factory=list)
    read: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    next_position: int = 0
    refs: list[str] = field(default_factory=list)  # the first and the last record's

    @property
    def span(self) -> str:
        return " to ".join(dict.fromkeys([self.refs[0], self.refs[-1]])) if self.refs else ""


def run_ingest(
    sessions: sessionmaker[Session],
    ingestor: Ingestor,
    *,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    progress: Progress | None = None,
    batch_records: int = BATCH_RECORDS,
) -> RunResult:
    """Ingest everything `ingestor` reads into the domain; the run's id and counts."""
    fingerprint = ingestor.fingerprint()
    with source_lock(sessions, domain_id, fingerprint):
        with unit_of_work(sessions) as session:
            run = _resumable_run(session, ingestor, domain_id, fingerprint)
            if run is None:
                run = _new_run(session, ingestor, tenant_id, domain_id, fingerprint)
            run.status, run.error = "running", None
            run_id, start = run.id, int(run.checkpoint.get("position", 0))
            counts = RunCounts.from_json(run.counts)
        try:
            for batch in _batches(ingestor, start, batch_records, progress):
                _commit_batch(sessions, run_id, batch, counts, tenant_id, domain_id, ingestor)
            with unit_of_work(sessions) as session:
                links = link_near_duplicates(session, domain_id=domain_id)
            counts.near_duplicate += sum(links.values())
        except Exception as error:
            _finish(sessions, run_id, "failed", counts, error=_describe(error))
            raise
        except BaseException:  # Ctrl-C: resumable, like a crash
            _finish(sessions, run_id, "failed", counts, error="interrupted")
            raise
        _finish(sessions, run_id, "succeeded", counts)
    return RunResult(run_id, counts, resumed_from=start)


@contextmanager
def source_lock(
    sessions: sessionmaker[Session], domain_id: uuid.UUID, fingerprint: str
) -> Iterator[None]:
    """One run at a time per (domain, source): two would resume from the same checkpoint and
    overwrite each other's counts. A PostgreSQL session lock, so a crashed process's lock goes
    with its connection; SQLite serialises writers itself."""
    engine = sessions.kw["bind"].engine  # bound to an engine, or to a caller's connection
    if engine.dialect.name != "postgresql":
        yield
        return
    digest = hashlib.sha256(f"ingest:{domain_id}:{fingerprint}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    with engine.connect() as connection:
        if not connection.execute(select(func.pg_try_advisory_lock(key))).scalar():
            raise Conflict("another run is ingesting this source into this domain right now")
        try:
            yield
        finally:
            connection.execute(select(func.pg_advisory_unlock(key)))


def _resumable_run(
    session: Session, ingestor: Ingestor, domain_id: uuid.UUID, fingerprint: str
) -> IngestRun | None:
    """The latest unfinished run over exactly this source by this ingestor version."""
    return session.scalars(
        select(IngestRun)
        .where(
            IngestRun.domain_id == domain_id,
            IngestRun.source_kind == ingestor.source_kind,
            IngestRun.source_format == ingestor.source_format,
            IngestRun.source_sha256 == fingerprint,
            IngestRun.ingestor_version == ingestor.version,
            IngestRun.status != "succeeded",
        )
        .order_by(IngestRun.created_at.desc())
        .limit(1)
        .with_for_update()
    ).first()


def _new_run(
    session: Session,
    ingestor: Ingestor,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    fingerprint: str,
) -> IngestRun:
    run = IngestRun(
        tenant_id=tenant_id,
        domain_id=domain_id,
        source_kind=ingestor.source_kind,
        source_format=ingestor.source_format,
        source_ref=ingestor.source_ref[:1024],
        source_sha256=fingerprint,
        ingestor_version=ingestor.version,
        checkpoint={"position": 0},
        counts=RunCounts().as_json(),
    )
    session.add(run)
    session.flush()
    return run


def _batches(
    ingestor: Ingestor, start: int, size: int, progress: Progress | None
) -> Iterator[_Batch]:
    batch = _Batch(next_position=start)
    for record in ingestor.records():
        if record.position < start:
            continue
        _convert_into(batch, ingestor, record)
        if progress is not None:
            progress(1)
        if batch.read >= size:
            yield batch
            batch = _Batch(next_position=batch.next_position)
    if batch.read:
        yield batch


def _convert_into(batch: _Batch, ingestor: Ingestor, record: SourceRecord) -> None:
    batch.read += 1
    batch.next_position = record.position + 1
    batch.refs[1:] = [record.ref] if batch.refs else []
    if not batch.refs:
        batch.refs.append(record.ref)
    try:
        batch.candidates += ingestor.convert(record)
    except Rejected as rejected:
        batch.rejected[rejected.reason] += 1


def _commit_batch(
    sessions: sessionmaker[Session],
    run_id: uuid.UUID,
    batch: _Batch,
    counts: RunCounts,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    ingestor: Ingestor,
) -> None:
    """Store the batch and move the checkpoint past it, in one transaction."""
    try:
        with unit_of_work(sessions) as session:
            updated = _store_batch(session, run_id, batch, counts, tenant_id, domain_id, ingestor)
    except (DataError, IntegrityError, UnicodeEncodeError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise InvalidInput(f"{batch.span}: the database refused a record: {reason}") from error
    counts.__dict__.update(updated.__dict__)  # only once the batch is committed


def _store_batch(
    session: Session,
    run_id: uuid.UUID,
    batch: _Batch,
    counts: RunCounts,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    ingestor: Ingestor,
) -> RunCounts:
    """The batch's rows and the run's new counts and checkpoint, in `session`."""
    stored = store_candidates(
        session=session,
        tenant_id=tenant_id,
        domain_id=domain_id,
        candidates=batch.candidates,
        ingestor_version=ingestor.version,
        replaces_groups=ingestor.records_are_groups,
    )
    updated = RunCounts.from_json(counts.as_json())
    updated.read += batch.read
    updated.rejected.update(batch.rejected)
    updated.add(stored)
    run = session.get_one(IngestRun, run_id)
    run.counts = updated.as_json()
    run.checkpoint = {"position": batch.next_position}
    return updated


def _finish(
    sessions: sessionmaker[Session],
    run_id: uuid.UUID,
    status: str,
    counts: RunCounts,
    *,
    error: str | None = None,
) -> None:
    with unit_of_work(sessions) as session:
        run = session.get_one(IngestRun, run_id)
        run.status, run.error, run.counts = status, error, counts.as_json()
        run.finished_at = utcnow()


def _describe(error: BaseException) -> str:
    if isinstance(error, FlywheelError):
        return error.message
    return f"{type(error).__name__}: {error}"
