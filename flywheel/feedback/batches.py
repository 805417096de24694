"""Batch writes: where each event goes, its row, and the batch's idempotency key.

A batch's `Idempotency-Key` fingerprints the whole request.

Each event of a batch sent under key K is stored under `K#<index>` (what finds it on a
replay); the batch itself is claimed first, with the hash of its canonical JSON, so the same
key with any event added, removed or changed is a Conflict before anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flywheel.db import utcnow
from flywheel.errors import Conflict, NotFound
from flywheel.feedback.models import FeedbackBatch, FeedbackEvent, Interaction
from flywheel.tenancy.models import Domain

if TYPE_CHECKING:  # the service imports this module
    from flywheel.feedback.service import NewFeedback

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


@dataclass
class Targets:
    """Where each event goes: domain ids by name, (domain id, name) by interaction id."""

    domain_ids: dict[str, uuid.UUID]
    interactions: dict[uuid.UUID, tuple[uuid.UUID, str]]
    errors: list[dict[str, Any]]

    def domain_of(self, event: NewFeedback) -> tuple[uuid.UUID, str]:
        if event.interaction_id is not None:
            return self.interactions[event.interaction_id]
        assert event.domain is not None  # checked by resolve_targets
        return self.domain_ids[event.domain], event.domain


def resolve_targets(
    session: Session, tenant_id: uuid.UUID, events: Sequence[NewFeedback]
) -> Targets:
    """Each event's domain, looked up in two queries; an error naming each unknown target."""
    names = {event.domain for event in events if event.domain is not None}
    interaction_ids = {event.interaction_id for event in events if event.interaction_id}
    targets = Targets(
        domain_ids=_domain_ids(session, tenant_id, names),
        interactions=_interaction_domains(session, tenant_id, interaction_ids),
        errors=[],
    )
    for index, event in enumerate(events):
        if event.interaction_id is not None:
            is_known = event.interaction_id in targets.interactions
        else:
            is_known = event.domain in targets.domain_ids
        if not is_known:
            message = missing_target(event)
            targets.errors.append({"index": index, "code": NotFound.code, "message": message})
    return targets


def missing_target(event: NewFeedback) -> str:
    if event.interaction_id is not None:
        return f"interaction {event.interaction_id} not found"
    return f"domain {event.domain!r} not found"


def _domain_ids(
    session: Session, tenant_id: uuid.UUID, names: Iterable[str]
) -> dict[str, uuid.UUID]:
    names = set(names)
    if not names:
        return {}
    query = select(Domain.name, Domain.id).where(
        Domain.tenant_id == tenant_id, Domain.name.in_(names)
    )
    return {name: domain_id for name, domain_id in session.execute(query)}  # noqa: C416 - rows are not pairs to dict()


def _interaction_domains(
    session: Session, tenant_id: uuid.UUID, ids: set[uuid.UUID]
) -> dict[uuid.UUID, tuple[uuid.UUID, str]]:
    if not ids:
        return {}
    query = (
        select(Interaction.id, Domain.id, Domain.name)
        .join(Domain, Domain.id == Interaction.domain_id)
        .where(Interaction.tenant_id == tenant_id, Interaction.id.in_(ids))
    )
    return {row[0]: (row[1], row[2]) for row in session.execute(query)}


def event_row(
    tenant_id: uuid.UUID,
    event: NewFeedback,
    idempotency_key: str | None,
    request_sha256: str,
    domain_id: uuid.UUID | None,
    now: datetime,
) -> dict[str, Any]:
    """An event's columns (its fingerprint computed by the caller: a batch's with the
    batch's); without `domain_id` when None (a single event's is resolved in its INSERT)."""
    domain = {} if domain_id is None else {"domain_id": domain_id}
    return {
        "id": uuid.uuid4(),
        "created_at": now,
        "tenant_id": tenant_id,
        **domain,
        "interaction_id": event.interaction_id,
        "kind": event.kind,
        "value": event.value,
        "messages": event.messages,
        "tools": event.tools,
        "response": event.response,
        "rater": event.rater,
        "event_id": event.event_id,
        "idempotency_key": idempotency_key,
        "request_sha256": request_sha256,
    }
