"""Retention: raw feedback events and interactions older than N weeks are deleted; the
signal compiled from them stays, with its provenance, and forgetting still reaches it.

    purge_raw_events(sessions, weeks=26, now=utcnow()) -> PurgeReport

`FLYWHEEL_RETENTION_RAW_EVENT_WEEKS` sets N for every domain (unset: nothing is deleted); a
domain's config `{"retention": {"raw_event_weeks": 8}}` sets its own. The scheduler runs it
daily (`flywheel.retention`, a periodic job).

Per domain, in its own transaction, an event goes when it is older than N weeks *and* the
domain's compiler has read it (older than the compile watermark, less its revisit window):
an event never compiled is never deleted. An interaction goes when it is older than N weeks
and no event about it remains. What the compiler wrote from them (`sft_examples`,
`preference_pairs`, `labeled_completions`) is left as it is: its `source_ref` still names the
events and interactions it came from, and dataset versions keep their members.

Forgetting. A deleted event's rater, and its interaction's source record (`metadata.
source_ref`), are kept with the conversation's group key in `purged_feedback`; `flywheel
forget` of that rater or record deletes the compiled items of those conversations (and the
rows), and recompiles them from the events that remain (`forget_purged` in forget.py).

Known limit: a conversation that gets new feedback after its old events were deleted is
recompiled from the events that remain, so items only the deleted events supported are
retracted (weight 0, kept with their provenance), as they would be if those raters had
withdrawn.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import orjson
from sqlalchemy import Table, delete, exists, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from flywheel.bulk import chunked, insert_ignoring_conflicts
from flywheel.db import unit_of_work, utcnow
from flywheel.errors import FlywheelError
from flywheel.feedback.models import FeedbackEvent, Interaction, PurgedFeedback, subject_sha256
from flywheel.signals.compile.compiler import REVISIT, _previous_watermark
from flywheel.signals.compile.evidence import event_prompt
from flywheel.signals.compile.items import group_key_of
from flywheel.tenancy.models import Domain

log = logging.getLogger(__name__)
MAX_PREFIXES = 16
"""Source records kept per event: the record and up to 15 records above it (`record_prefixes`)."""


@dataclass
class PurgeReport:
    counts: Counter[str] = field(default_factory=Counter)
    domains: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # domain id -> why, left as it was

    def as_json(self) -> dict[str, Any]:
        return {
            "domains": self.domains,
            "deleted": dict(sorted(self.counts.items())),
            "failed": self.failed,
        }


def retention_weeks(domain: Domain, default: int | None) -> int | None:
    """The domain's `retention.raw_event_weeks`, else `default`; None keeps everything. A
    bad value is logged and keeps everything (retention never guesses)."""
    section = (domain.config or {}).get("retention") or {}
    raw = section.get("raw_event_weeks", default) if isinstance(section, dict) else section
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        log.warning("not purging %s: retention.raw_event_weeks %r is not >= 1", domain.name, raw)
        return None
    return raw


def purge_raw_events(
    sessions: sessionmaker[Session], *, weeks: int | None, now: datetime
) -> PurgeReport:
    """Delete every domain's raw events and interactions past its retention (see above). A
    domain that fails is rolled back, logged and named in the report; the others go on."""
    report = PurgeReport()
    with sessions() as session:
        domains = [(d.id, d.tenant_id, retention_weeks(d, weeks)) for d in session.scalars(
            select(Domain).order_by(Domain.created_at, Domain.id)
        )]  # fmt: skip
    for domain_id, tenant_id, domain_weeks in domains:
        if domain_weeks is None:
            continue
        try:
            with unit_of_work(sessions) as session:
                counts = purge_domain(
                    session, tenant_id, domain_id, before=now - timedelta(weeks=domain_weeks)
                )
        except (SQLAlchemyError, FlywheelError) as error:  # one domain's failure is its own
            log.exception("retention: domain %s left as it was", domain_id)
            report.failed[str(domain_id)] = f"{type(error).__name__}: {error}"[:500]
            continue
        report.counts.update(counts)
        report.domains += 1
    return report


def purge_domain(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, *, before: datetime
) -> Counter[str]:
    """Delete the domain's compiled events older than `before`, then its interactions older
    than `before` that no event is about; what was deleted, by table."""
    counts: Counter[str] = Counter()
    watermark = _previous_watermark(session, domain_id)
    if watermark is None:
        return counts  # never compiled: nothing may go
    limit = min(before, watermark - REVISIT)
    old = select(FeedbackEvent.id).where(
        FeedbackEvent.domain_id == domain_id, FeedbackEvent.created_at < limit
    )
    for chunk in chunked(list(session.scalars(old))):
        _keep_traces(session, tenant_id, domain_id, chunk)
        session.execute(delete(FeedbackEvent).where(FeedbackEvent.id.in_(chunk)))
        counts["feedback_events"] += len(chunk)
    unreferenced = select(Interaction.id).where(
        Interaction.domain_id == domain_id,
        Interaction.created_at < before,
        ~exists().where(FeedbackEvent.interaction_id == Interaction.id),
    )
    for chunk in chunked(list(session.scalars(unreferenced))):
        session.execute(delete(Interaction).where(Interaction.id.in_(chunk)))
        counts["interactions"] += len(chunk)
    return counts


def _keep_traces(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, event_ids: list[uuid.UUID]
) -> None:
    """Record each event's subjects (rater, interaction's source record) and conversation."""
    source_ref = Interaction.metadata_["source_ref"].as_string()
    rows = session.execute(
        select(
            FeedbackEvent.kind,
            FeedbackEvent.value,
            FeedbackEvent.interaction_id,
            FeedbackEvent.messages,
            Interaction.messages,
            FeedbackEvent.rater,
            source_ref,
        )
        .outerjoin(Interaction, Interaction.id == FeedbackEvent.interaction_id)
        .where(FeedbackEvent.id.in_(event_ids))
    )
    traces: set[tuple[str, str, str, str]] = set()
    for kind, value, interaction_id, own, of, rater, record in rows:
        prompt = event_prompt(kind, value, interaction_id, own, of)
        if prompt is None:
            continue
        group = group_key_of(orjson.dumps(prompt).decode())
        for subject_kind, subject, names in (
            ("rater", rater, [rater] if rater else []),
            ("source_record", record, record_prefixes(record)),
        ):
            whole = subject_sha256(tenant_id, subject_kind, subject) if subject else ""
            traces.update(
                (subject_kind, subject_sha256(tenant_id, subject_kind, name), whole, group)
                for name in names
            )
    insert_ignoring_conflicts(
        session,
        cast(Table, PurgedFeedback.__table__),
        [
            {
                "id": uuid.uuid4(),
                "created_at": utcnow(),
                "tenant_id": tenant_id,
                "domain_id": domain_id,
                "subject_kind": subject_kind,
                "subject_sha256": hashed,
                "record_sha256": whole,
                "group_key": group,
            }
            for subject_kind, hashed, whole, group in sorted(traces)
        ],
    )


def record_prefixes(record: str | None) -> list[str]:
    """A source record and each record above it, as forget names them: "zendesk:4711:c9" is
    found by forgetting "zendesk:4711:c9", "zendesk:4711" or "zendesk" (the record itself and
    at most MAX_PREFIXES - 1 records above it, the shortest).

    >>> record_prefixes("zendesk:4711:c9")
    ['zendesk', 'zendesk:4711', 'zendesk:4711:c9']
    """
    if not record:
        return []
    parts = record.split(":")
    prefixes = [":".join(parts[:end]) for end in range(1, min(len(parts), MAX_PREFIXES))]
    return [*prefixes, record]


def take_traces(
    session: Session, *, tenant_id: uuid.UUID, kind: str, subject: str
) -> dict[uuid.UUID, list[str]]:
    """The conversations (group keys, by domain) of the subject's deleted events, and delete
    those rows: a source record matches its own id and the ids under it ("<id>:...", through
    the rows `record_prefixes` wrote)."""
    where = (
        PurgedFeedback.tenant_id == tenant_id,
        PurgedFeedback.subject_kind == kind,
        PurgedFeedback.subject_sha256 == subject_sha256(tenant_id, kind, subject),
    )
    found: dict[uuid.UUID, set[str]] = {}
    records: set[str] = set()
    for domain_id, group, record in session.execute(
        select(
            PurgedFeedback.domain_id, PurgedFeedback.group_key, PurgedFeedback.record_sha256
        ).where(*where)
    ):
        found.setdefault(domain_id, set()).add(group)
        records.add(record)
    for chunk in chunked(sorted(records)):  # every row of those records, each prefix's too
        session.execute(
            delete(PurgedFeedback).where(
                PurgedFeedback.tenant_id == tenant_id,
                PurgedFeedback.subject_kind == kind,
                PurgedFeedback.record_sha256.in_(chunk),
            )
        )
    return {domain_id: sorted(groups) for domain_id, groups in found.items()}


def prompts_of_groups(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, groups: Iterable[str]
) -> set[str]:
    """The conversations (JSON texts) of the domain's remaining events in these groups: what
    to recompile after their deleted events' items went. Reads the domain's events (forget
    is rare; a group key is a hash, not a column of the events)."""
    wanted = set(groups)
    rows = session.execute(
        select(
            FeedbackEvent.kind,
            FeedbackEvent.value,
            FeedbackEvent.interaction_id,
            FeedbackEvent.messages,
            Interaction.messages,
        )
        .outerjoin(Interaction, Interaction.id == FeedbackEvent.interaction_id)
        .where(FeedbackEvent.tenant_id == tenant_id, FeedbackEvent.domain_id == domain_id)
    )
    found = set()
    for kind, value, interaction_id, own, of in rows:
        prompt = event_prompt(kind, value, interaction_id, own, of)
        if prompt is not None:
            text = orjson.dumps(prompt).decode()
            if group_key_of(text) in wanted:
                found.add(text)
    return found
