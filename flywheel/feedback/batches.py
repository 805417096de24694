"""Batch idempotency: a batch's `Idempotency-Key` fingerprints the whole request.

Each event of a batch sent under key K is stored under `K#<index>` (what finds it on a
replay); the batch itself is claimed first, with the hash of its canonical JSON, so the same
key with any event added, removed or changed is a Conflict before anything is written.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flywheel.db import utcnow
from flywheel.errors import Conflict
from flywheel.feedback.models import FeedbackBatch, FeedbackEvent

FEEDBACK_BATCHES: Table = FeedbackBatch.__table__  # type: ignore[assignment]


def claim_batch_key(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    idempotency_key: str,
    request_sha256: str,
    event_count: int,
) -> bool:
    """Claim the key for this batch: True when it was free, False for a replay of the same
    batch, Conflict for a different one.

    One INSERT ... ON CONFLICT DO NOTHING decides: of two concurrent batches under one key,
    the second waits for the first to commit, then compares with its row.
    """
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    claim = (
        insert(FEEDBACK_BATCHES)
        .values(
            id=uuid.uuid4(),
            created_at=utcnow(),
            tenant_id=tenant_id,
            idempotency_key=idempotency_key,
            request_sha256=request_sha256,
        )
        .on_conflict_do_nothing()
        .returning(FEEDBACK_BATCHES.c.id)
    )
    if session.execute(claim).scalar() is not None:
        return not _refuse_changed_legacy_batch(session, tenant_id, idempotency_key, event_count)
    stored = session.scalars(
        select(FeedbackBatch.request_sha256).where(
            FeedbackBatch.tenant_id == tenant_id, FeedbackBatch.idempotency_key == idempotency_key
        )
    ).one_or_none()
    if stored != request_sha256:  # None: deleted in between; never guess
        raise _reused(idempotency_key)
    return False


def _refuse_changed_legacy_batch(
    session: Session, tenant_id: uuid.UUID, idempotency_key: str, event_count: int
) -> bool:
    """A batch stored before batches were claimed has events under `K#i` but no batch row, so
    its key was claimed just now. Its replay must find exactly `K#0` to `K#<n-1>` stored: one
    of them missing (an event appended) or `K#<n>` stored (an event removed) is a Conflict;
    an edited event is refused by its own fingerprint when it is recorded. True for such a
    replay, False when no event is stored under the key."""
    keys = [f"{idempotency_key}#{index}" for index in range(event_count + 1)]
    stored = set(
        session.scalars(
            select(FeedbackEvent.idempotency_key).where(
                FeedbackEvent.tenant_id == tenant_id, FeedbackEvent.idempotency_key.in_(keys)
            )
        )
    )
    if stored and stored != set(keys[:-1]):
        raise _reused(idempotency_key)
    return bool(stored)


def _reused(idempotency_key: str) -> Conflict:
    return Conflict(f"Idempotency-Key {idempotency_key!r} was already used for a different request")
