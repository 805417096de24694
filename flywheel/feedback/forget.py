"""Forgetting a rater or a source record: delete the raw data and every item derived from it,
taint what was built from it, and audit the request.

    forget(sessions, tenant_id=..., rater="u-42" | source_record="zendesk:4711", actor=...)

What goes, in one transaction:
- a rater: every feedback event of the tenant with that rater id;
- a source record (a ticket, a task, a repository function: the `source_ref` ingest gave it):
  every signal item whose `source_ref` is the id or starts with "<id>:" (a ticket's comments),
  and every interaction ingested from it, with its feedback events;
- what the compiler derived from those events: it judges all feedback about one conversation
  together (weights, conflicts, pair or label), so every feedback item of a conversation an
  erased event was about is derived from it. Those items are deleted, then the conversations
  are recompiled from the events that remain, so other raters' judgements survive as new items.

Dataset versions that held a deleted item lose those members (the foreign keys cascade; no row
is left pointing at nothing) and are marked tainted, as is every model version trained on one
of them: each records the first request that tainted it (the audit rows list them all). The
tenant's kept eval indexes (flywheel.datasets.kept_index: hashes of eval items' text) are
deleted; the next builds index from the sketches. The request is a `forget_requests` row that
keeps the subject only as a hash.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, delete, or_, select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.bulk import chunked
from flywheel.datasets.items import KINDS
from flywheel.datasets.kept_index import purge as purge_kept_indexes
from flywheel.datasets.membership import versions_holding
from flywheel.datasets.service import taint_versions
from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput
from flywheel.feedback import retention
from flywheel.feedback.models import FeedbackEvent, ForgetRequest, Interaction, subject_sha256
from flywheel.registry.service import taint_models_trained_on
from flywheel.signals.compile import event_prompts, group_key_of, recompile_prompts
from flywheel.signals.dedup import link_near_duplicates
from flywheel.signals.models import (
    LabeledCompletion,
    PreferencePair,
    SftExample,
    VerifiableTask,
)
from flywheel.signals.store import delete_items

SignalModel = (
    type[SftExample] | type[PreferencePair] | type[LabeledCompletion] | type[VerifiableTask]
)
COMPILED = (SftExample, PreferencePair, LabeledCompletion)  # what the feedback compiler writes


@dataclass
class ForgetReport:
    request_id: uuid.UUID
    subject_kind: str
    counts: Counter[str] = field(default_factory=Counter)
    dataset_version_ids: list[uuid.UUID] = field(default_factory=list)
    model_version_ids: list[uuid.UUID] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": str(self.request_id),
            "subject_kind": self.subject_kind,
            "deleted": dict(sorted(self.counts.items())),
            "tainted_dataset_versions": [str(each) for each in self.dataset_version_ids],
            "tainted_model_versions": [str(each) for each in self.model_version_ids],
        }


def forget(
    sessions: sessionmaker[Session],
    *,
    tenant_id: uuid.UUID,
    rater: str | None = None,
    source_record: str | None = None,
    actor: str,
) -> ForgetReport:
    """Forget exactly one of a rater or a source record (see the module docstring)."""
    if (rater is None) == (source_record is None):
        raise InvalidInput("name exactly one of a rater or a source record to forget")
    subject = rater if rater is not None else source_record
    if not subject or not subject.strip():
        raise InvalidInput("the rater or source record id to forget is empty")
    kind = "rater" if rater is not None else "source_record"
    with unit_of_work(sessions) as session:
        request = ForgetRequest(
            tenant_id=tenant_id,
            actor=actor,
            subject_kind=kind,
            subject_sha256=subject_sha256(tenant_id, kind, subject),
        )
        session.add(request)
        session.flush()
        report = ForgetReport(request.id, kind)
        if rater is not None:
            _forget_events(session, tenant_id, _rater_events(tenant_id, rater), report)
        else:
            _forget_source_record(session, tenant_id, subject, report)
        _forget_purged(session, tenant_id, kind, subject, report)
        purge_kept_indexes(session, tenant_id)
        _taint(session, report)
        request.counts = dict(report.counts)
        request.dataset_version_ids = [str(each) for each in report.dataset_version_ids]
        request.model_version_ids = [str(each) for each in report.model_version_ids]
        return report


def _rater_events(tenant_id: uuid.UUID, rater: str) -> Select[uuid.UUID]:
    return select(FeedbackEvent.id).where(
        FeedbackEvent.tenant_id == tenant_id, FeedbackEvent.rater == rater
    )


def _forget_source_record(
    session: Session, tenant_id: uuid.UUID, record: str, report: ForgetReport
) -> None:
    """The record's own items, then its interactions' events (and what was compiled from
    them), then the interactions."""
    for kind in KINDS:
        model, member_column = kind.model, kind.member_column
        ids = session.scalars(
            select(model.id).where(
                model.tenant_id == tenant_id,
                or_(
                    model.source_ref == record,
                    model.source_ref.startswith(f"{record}:", autoescape=True),
                ),
            )
        ).all()
        _delete_items(session, model, member_column, list(ids), report)
    source_ref = Interaction.metadata_["source_ref"].as_string()
    interactions = list(
        session.scalars(
            select(Interaction.id).where(
                Interaction.tenant_id == tenant_id,
                or_(source_ref == record, source_ref.startswith(f"{record}:", autoescape=True)),
            )
        )
    )
    events = select(FeedbackEvent.id).where(
        FeedbackEvent.tenant_id == tenant_id, FeedbackEvent.interaction_id.in_(interactions)
    )
    _forget_events(session, tenant_id, events, report)
    for chunk in chunked(interactions):
        session.execute(delete(Interaction).where(Interaction.id.in_(chunk)))
    report.counts["interactions"] += len(interactions)


def _forget_events(
    session: Session,
    tenant_id: uuid.UUID,
    events: Select[uuid.UUID],
    report: ForgetReport,
) -> None:
    """Delete the events, what was compiled from their conversations, and recompile those
    conversations from the events that remain."""
    event_ids = list(session.scalars(events))
    prompts = event_prompts(session, tenant_id, event_ids)
    for domain_id, domain_prompts in prompts.items():
        groups = sorted({group_key_of(prompt) for prompt in domain_prompts})
        for kind in KINDS:
            if kind.model in COMPILED:
                ids = _compiled_items(session, kind.model, domain_id, groups)
                _delete_items(session, kind.model, kind.member_column, ids, report)
    for chunk in chunked(event_ids):
        session.execute(delete(FeedbackEvent).where(FeedbackEvent.id.in_(chunk)))
    report.counts["feedback_events"] += len(event_ids)
    for domain_id, domain_prompts in prompts.items():
        recompiled = recompile_prompts(session, tenant_id, domain_id, domain_prompts)
        report.counts["recompiled_items"] += recompiled.inserted
        link_near_duplicates(session, domain_id=domain_id)


def _forget_purged(
    session: Session, tenant_id: uuid.UUID, kind: str, subject: str, report: ForgetReport
) -> None:
    """What was compiled from the subject's events that retention already deleted
    (`flywheel.feedback.retention`): those conversations' items go, and they are recompiled
    from the events that remain."""
    purged = retention.take_traces(session, tenant_id=tenant_id, kind=kind, subject=subject)
    for domain_id, groups in purged.items():
        for item_kind in KINDS:
            if item_kind.model in COMPILED:
                ids = _compiled_items(session, item_kind.model, domain_id, groups)
                _delete_items(session, item_kind.model, item_kind.member_column, ids, report)
        prompts = retention.prompts_of_groups(session, tenant_id, domain_id, groups)
        if prompts:
            recompiled = recompile_prompts(session, tenant_id, domain_id, prompts)
            report.counts["recompiled_items"] += recompiled.inserted
        link_near_duplicates(session, domain_id=domain_id)


def _compiled_items(
    session: Session, model: SignalModel, domain_id: uuid.UUID, groups: list[str]
) -> list[uuid.UUID]:
    found: list[uuid.UUID] = []
    for chunk in chunked(groups):
        found += session.scalars(
            select(model.id).where(
                model.domain_id == domain_id,
                model.source_kind == "feedback",
                model.group_key.in_(chunk),
            )
        )
    return found


def _delete_items(
    session: Session,
    model: SignalModel,
    member_column: str,
    ids: list[uuid.UUID],
    report: ForgetReport,
) -> None:
    """Delete signal rows, noting first the dataset versions that held them."""
    report.dataset_version_ids += versions_holding(session, member_column, ids)
    delete_items(session, model.__tablename__, ids)
    report.counts[model.__tablename__] += len(ids)


def _taint(session: Session, report: ForgetReport) -> None:
    """Mark the dataset versions, and the model versions trained on them, as tainted."""
    report.dataset_version_ids = sorted(set(report.dataset_version_ids))
    taint_versions(session, report.dataset_version_ids, request_id=report.request_id)
    report.model_version_ids = taint_models_trained_on(
        session, report.dataset_version_ids, request_id=report.request_id
    )
