"""Reading stored signal, and adding tasks one at a time (the API's path)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from flywheel.signals.candidates import TaskCandidate
from flywheel.signals.models import PreferencePair, VerifiableTask
from flywheel.signals.store import store_one
from flywheel.tenancy.service import get_domain

API_INGESTOR_VERSION = "api/1"

T = TypeVar("T", PreferencePair, VerifiableTask)


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_after: uuid.UUID | None  # pass as `after` for the next page; None: no more


def list_preference_pairs(
    *, session: Session, tenant_id: uuid.UUID, domain: str, after: uuid.UUID | None, limit: int
) -> Page[PreferencePair]:
    """A page of the domain's pairs in id order (keyset pagination: stable under inserts)."""
    domain_id = get_domain(session, tenant_id, domain).id
    query = select(PreferencePair).where(PreferencePair.domain_id == domain_id)
    if after is not None:
        query = query.where(PreferencePair.id > after)
    items = list(session.scalars(query.order_by(PreferencePair.id).limit(limit + 1)))
    return _page(items, limit)


def list_tasks(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    domain: str,
    status: str | None,
    after: uuid.UUID | None,
    limit: int,
) -> Page[VerifiableTask]:
    domain_id = get_domain(session, tenant_id, domain).id
    query = select(VerifiableTask).where(VerifiableTask.domain_id == domain_id)
    if status is not None:
        query = query.where(VerifiableTask.verifier_status == status)
    if after is not None:
        query = query.where(VerifiableTask.id > after)
    items = list(session.scalars(query.order_by(VerifiableTask.id).limit(limit + 1)))
    return _page(items, limit)


def stream_tasks(
    *, session: Session, domain_id: uuid.UUID, status: str | None = None
) -> Iterator[VerifiableTask]:
    """The domain's tasks (only those with `status`, if given) in the order they were stored,
    read in chunks: memory does not grow with the number of tasks."""
    query = select(VerifiableTask).where(VerifiableTask.domain_id == domain_id)
    if status is not None:
        query = query.where(VerifiableTask.verifier_status == status)
    yield from session.scalars(
        query.order_by(VerifiableTask.created_at).execution_options(yield_per=500)
    )


def _page(items: list[T], limit: int) -> Page[T]:
    if len(items) > limit:
        return Page(items[:limit], items[limit - 1].id)
    return Page(items, None)


def add_task(
    *, session: Session, tenant_id: uuid.UUID, domain: str, task: TaskCandidate
) -> tuple[VerifiableTask, bool]:
    """Store one task (redacted and hashed like any ingested one), pending verifier QA.

    The same content again finds the stored task: (task, False).
    """
    domain_id = get_domain(session, tenant_id, domain).id
    task_id, is_new = store_one(
        session=session,
        tenant_id=tenant_id,
        domain_id=domain_id,
        candidate=task,
        ingestor_version=API_INGESTOR_VERSION,
    )
    return session.get_one(VerifiableTask, task_id), is_new
