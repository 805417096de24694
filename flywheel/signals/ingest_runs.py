"""Ingest runs: the record of one read of a source into a domain (where it got to, its counts,
how it ended), and the lock that keeps two runs off the same source.

`ingest/` drives the reading; every row of `ingest_runs` it needs is written here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import advisory_key, utcnow
from flywheel.errors import Conflict
from flywheel.signals.models import IngestRun

MAX_SOURCE_REF = 1024  # the column's length


@dataclass(frozen=True)
class Source:
    """What a run reads: its kind and format, a reference, a fingerprint of its content, and
    the version of the code that reads it."""

    kind: str
    format: str
    ref: str
    fingerprint: str
    ingestor_version: str


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
    key = advisory_key("ingest", domain_id, fingerprint)
    with engine.connect() as connection:
        if not connection.execute(select(func.pg_try_advisory_lock(key))).scalar():
            raise Conflict("another run is ingesting this source into this domain right now")
        try:
            yield
        finally:
            connection.execute(select(func.pg_advisory_unlock(key)))


def open_ingest_run(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    source: Source,
    counts: dict[str, Any],
) -> IngestRun:
    """The latest unfinished run over exactly this source by this reader version (to resume
    after its checkpoint), or a new one starting at position 0 with `counts`; marked running."""
    run = session.scalars(
        select(IngestRun)
        .where(
            IngestRun.domain_id == domain_id,
            IngestRun.source_kind == source.kind,
            IngestRun.source_format == source.format,
            IngestRun.source_sha256 == source.fingerprint,
            IngestRun.ingestor_version == source.ingestor_version,
            IngestRun.status != "succeeded",
        )
        .order_by(IngestRun.created_at.desc())
        .limit(1)
        .with_for_update()
    ).first()
    if run is None:
        run = _new_run(tenant_id, domain_id, source, checkpoint={"position": 0}, counts=counts)
        session.add(run)
    run.status, run.error = "running", None
    session.flush()
    return run


def record_ingest_run(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    source: Source,
    status: str,
    counts: dict[str, Any],
    checkpoint: dict[str, Any],
    error: str | None = None,
) -> IngestRun:
    """A run recorded whole when it ends: a compile, which has no batches to resume from."""
    run = _new_run(
        tenant_id,
        domain_id,
        source,
        status=status,
        checkpoint=checkpoint,
        counts=counts,
        error=error,
        finished_at=utcnow(),
    )
    session.add(run)
    session.flush()
    return run


def _new_run(
    tenant_id: uuid.UUID, domain_id: uuid.UUID, source: Source, **fields: Any
) -> IngestRun:
    return IngestRun(
        tenant_id=tenant_id,
        domain_id=domain_id,
        source_kind=source.kind,
        source_format=source.format,
        source_ref=source.ref[:MAX_SOURCE_REF],
        source_sha256=source.fingerprint,
        ingestor_version=source.ingestor_version,
        **fields,
    )


def checkpoint_ingest_run(
    session: Session, run_id: uuid.UUID, *, counts: dict[str, Any], position: int
) -> None:
    """The run's counts so far and the position to resume from, in the batch's transaction."""
    run = session.get_one(IngestRun, run_id)
    run.counts = counts
    run.checkpoint = {"position": position}


def finish_ingest_run(
    session: Session,
    run_id: uuid.UUID,
    *,
    status: str,
    counts: dict[str, Any],
    error: str | None = None,
) -> None:
    """How the run ended (succeeded or failed, with the error), with its final counts."""
    run = session.get_one(IngestRun, run_id)
    run.status, run.error, run.counts = status, error, counts
    run.finished_at = utcnow()
