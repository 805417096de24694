"""Storing candidate signal: redact, hash, skip what the domain holds, write the rest."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Table, delete, func, literal, select, update
from sqlalchemy.orm import Session

from flywheel.bulk import chunked, insert_ignoring_conflicts
from flywheel.db import utcnow
from flywheel.errors import Conflict
from flywheel.feedback.models import FeedbackEvent, Interaction
from flywheel.feedback.service import record_feedback_events
from flywheel.redaction import redact
from flywheel.signals.candidates import (
    Candidate,
    EventCandidate,
    FeedbackItem,
    InteractionCandidate,
    LabelCandidate,
    Messages,
    PairCandidate,
    SftCandidate,
    TaskCandidate,
)
from flywheel.signals.content import content_sha256
from flywheel.signals.message_texts import map_texts
from flywheel.signals.models import LabeledCompletion, PreferencePair, SftExample, VerifiableTask

SIGNAL_TABLES: dict[str, Table] = {
    model.__tablename__: model.__table__  # type: ignore[misc]
    for model in (SftExample, PreferencePair, LabeledCompletion, VerifiableTask)
}
INTERACTIONS: Table = Interaction.__table__  # type: ignore[assignment]
FEEDBACK_EVENTS: Table = FeedbackEvent.__table__  # type: ignore[assignment]


@dataclass
class StoreCounts:
    """What became of a batch: rows accepted per table, exact duplicates, redacted items."""

    accepted: Counter[str] = field(default_factory=Counter)
    duplicate: int = 0
    redacted: int = 0

    def add(self, other: StoreCounts) -> None:
        self.accepted.update(other.accepted)
        self.duplicate += other.duplicate
        self.redacted += other.redacted


def store_candidates(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    candidates: Sequence[Candidate],
    ingestor_version: str,
    replaces_groups: bool = False,
) -> StoreCounts:
    """Redact, hash and insert `candidates`; rows whose content the domain holds are skipped.

    Exact duplicates are refused by the (domain, content hash) unique constraint, so two
    concurrent ingests of the same source cannot store anything twice. Interactions keep
    their feedback: stored as an interaction plus feedback events with the source's ids.

    With `replaces_groups` the candidates are all the signal their groups now yield (a ticket
    thread read again, say): the groups' earlier rows from the same kind of source that are
    not among them are retracted (weight 0, never deleted: dataset versions may hold them),
    and retracted rows produced again get their weight back.
    """
    counts = StoreCounts()
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for candidate in candidates:
        if isinstance(candidate, InteractionCandidate | EventCandidate):
            continue
        table, row = _signal_row(candidate, tenant_id, domain_id, ingestor_version)
        rows[table].append(row)
    for table, table_rows in rows.items():
        inserted = insert_ignoring_conflicts(session, SIGNAL_TABLES[table], table_rows)
        counts.accepted[table] += len(inserted)
        counts.duplicate += len(table_rows) - len(inserted)
        counts.redacted += sum(
            bool(row["redaction_report"]) for row in table_rows if row["id"] in inserted
        )
    if replaces_groups:
        _replace_groups(session, domain_id, candidates, rows)
    interactions = [item for item in candidates if isinstance(item, InteractionCandidate)]
    counts.add(_store_interactions(session, tenant_id, domain_id, interactions))
    counts.add(_store_events(session, tenant_id, domain_id, candidates))
    return counts


RETRACTED = "retracted: "


def retract(session: Session, table: Table, *where: ColumnElement[bool]) -> int:
    """Retract the table's live rows that match `where`: weight 0 and `why` prefixed
    "retracted: ". Never deleted, because dataset versions may hold them. How many."""
    values: dict[str, Any] = {"weight": 0.0}
    if "why" in table.c:
        values["why"] = func.substr(literal(RETRACTED) + table.c.why, 1, 255)
    result = session.execute(update(table).where(table.c.weight > 0, *where).values(values))
    return int(cast(CursorResult[Any], result).rowcount)


def _replace_groups(
    session: Session,
    domain_id: uuid.UUID,
    candidates: Sequence[Candidate],
    rows: dict[str, list[dict[str, Any]]],
) -> None:
    """Retract the groups' rows this batch no longer yields; restore those it yields again."""
    groups = {candidate.provenance.group_key[:255] for candidate in candidates}
    kinds = {candidate.provenance.source_kind for candidate in candidates}
    if not groups:
        return
    for name, table in SIGNAL_TABLES.items():
        kept = [row["content_sha256"] for row in rows.get(name, [])]
        scope = (
            (table.c.domain_id == domain_id)
            & table.c.group_key.in_(groups)
            & table.c.source_kind.in_(kinds)
        )
        retract(session, table, scope, table.c.content_sha256.not_in(kept))
        _restore(session, table, scope, rows.get(name, []))


def _restore(session: Session, table: Table, scope: Any, rows: list[dict[str, Any]]) -> None:
    """Give retracted rows that are yielded again their weight (and reason) back."""
    by_hash = {row["content_sha256"]: row for row in rows}
    retracted = session.scalars(
        select(table.c.content_sha256).where(
            scope, table.c.weight == 0, table.c.content_sha256.in_(list(by_hash))
        )
    ).all()
    for sha256 in retracted:
        values: dict[str, Any] = {"weight": by_hash[sha256]["weight"]}
        if "why" in table.c:
            values["why"] = by_hash[sha256]["why"]
        session.execute(update(table).where(scope, table.c.content_sha256 == sha256).values(values))


def _store_events(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, candidates: Sequence[Candidate]
) -> StoreCounts:
    counts = StoreCounts()
    events = [item for item in candidates if isinstance(item, EventCandidate)]
    if events:
        recorded = record_feedback_events(
            session=session,
            tenant_id=tenant_id,
            events=[item.event for item in events],
            idempotency_keys=[item.idempotency_key for item in events],
            refs=[item.provenance.source_ref for item in events],
            domain_id=domain_id,
        )
        replays = sum(item.is_replay for item in recorded)
        counts.accepted["feedback_events"] += len(recorded) - replays
        counts.duplicate += replays
    return counts


def delete_items(session: Session, table: str, ids: list[uuid.UUID]) -> None:
    """Delete signal rows (forgetting): dataset versions lose them as members (the foreign
    keys cascade), so the caller taints those versions first."""
    for chunk in chunked(ids):
        session.execute(delete(SIGNAL_TABLES[table]).where(SIGNAL_TABLES[table].c.id.in_(chunk)))


def store_one(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    candidate: SftCandidate | PairCandidate | LabelCandidate | TaskCandidate,
    ingestor_version: str,
) -> tuple[uuid.UUID, bool]:
    """Store one candidate like `store_candidates`; its row id, and whether it is new (an
    existing row with the same content is found by its hash)."""
    table_name, row = _signal_row(candidate, tenant_id, domain_id, ingestor_version)
    table = SIGNAL_TABLES[table_name]
    if insert_ignoring_conflicts(session, table, [row]):
        return row["id"], True
    existing = session.scalar(
        select(table.c.id).where(
            table.c.domain_id == domain_id, table.c.content_sha256 == row["content_sha256"]
        )
    )
    if existing is None:  # deleted in between: never guess
        raise Conflict("the same content was stored and removed meanwhile; try again")
    return existing, False


class _Redactor:
    """Redacts one candidate's texts with its source's known names, summing the counts; its
    group (a ticket thread) is the scope within which a person keeps one surrogate."""

    def __init__(self, names: Sequence[str], scope: str, *, people: bool = True) -> None:
        self.names = tuple(names)
        self.scope = scope
        self.people = people  # free-text names; not in code, whose tests may expect them back
        self.report: Counter[str] = Counter()

    def text(self, value: str) -> str:
        # NUL cannot be stored in PostgreSQL text and means nothing in a training example.
        value = value.replace("\x00", "")
        redaction = redact(value, names=self.names, scope=self.scope, people=self.people)
        self.report.update(redaction.counts)
        found = {value[start:end] for start, end, kind in redaction.spans if kind == "NAME"}
        if found - set(self.names):  # a name found in free text is known to the later texts
            self.names = (*self.names, *sorted(found - set(self.names)))
        return redaction.text

    def optional(self, value: str | None) -> str | None:
        return None if value is None else self.text(value)

    def strings(self, value: Any, *, keys: bool = False) -> Any:
        """`value` (JSON) with every string in it redacted, and with `keys` its mappings'
        keys too (an environment's state keyed by a customer's name)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.strings(item, keys=keys) for item in value]
        if isinstance(value, dict):
            return {
                (self.text(key) if keys and isinstance(key, str) else key): self.strings(
                    item, keys=keys
                )
                for key, item in value.items()
            }
        return value

    def messages(self, messages: Messages) -> Messages:
        # Every text: contents, text parts, names, tool call arguments' strings, tool results.
        return [map_texts(message, self.text) for message in messages]


def _signal_row(
    candidate: Candidate, tenant_id: uuid.UUID, domain_id: uuid.UUID, ingestor_version: str
) -> tuple[str, dict[str, Any]]:
    """The candidate's table and row: redacted, hashed, with its provenance."""
    provenance = candidate.provenance
    is_code = isinstance(candidate, TaskCandidate) and candidate.task_kind == "code"
    redactor = _Redactor(provenance.names, provenance.group_key, people=not is_code)
    table, fields = _redacted_fields(candidate, redactor)
    row = {
        "id": uuid.uuid4(),
        "created_at": utcnow(),
        **fields,
        "source_kind": provenance.source_kind,
        "source_ref": provenance.source_ref[:1024],
        "group_key": provenance.group_key[:255],
        "tags": clean_tags(provenance.tags),
        "weight": candidate.weight,  # type: ignore[union-attr]
        "redaction_report": dict(redactor.report),
        "minhash": None,
        "duplicate_of_id": None,
        "tenant_id": tenant_id,
        "domain_id": domain_id,
        "ingestor_version": ingestor_version,
    }
    return table, row


MAX_TAG_CHARS = 128


def clean_tags(tags: Sequence[str]) -> list[str]:
    """Tags as stored: stripped, blanks dropped, each at most MAX_TAG_CHARS, each once,
    sorted (so the same labels are always the same list).

    >>> clean_tags([" ticket.priority:high", "skill:carry", "", "skill:carry"])
    ['skill:carry', 'ticket.priority:high']
    """
    return sorted({tag.strip()[:MAX_TAG_CHARS] for tag in tags if tag.strip()})


def _redacted_fields(candidate: Candidate, redactor: _Redactor) -> tuple[str, dict[str, Any]]:
    match candidate:
        case SftCandidate():
            messages = redactor.messages(candidate.messages)
            completion = redactor.text(candidate.completion)
            fields = {"messages": messages, "completion": completion}
            return "sft_examples", fields | _hash("sft", messages, completion)
        case PairCandidate():
            messages = redactor.messages(candidate.messages)
            chosen, rejected = redactor.text(candidate.chosen), redactor.text(candidate.rejected)
            fields = {"messages": messages, "chosen": chosen, "rejected": rejected}
            return "preference_pairs", fields | {"why": candidate.why[:255]} | _hash(
                "pair", messages, chosen, rejected
            )
        case LabelCandidate():
            messages = redactor.messages(candidate.messages)
            completion = redactor.text(candidate.completion)
            fields = {"messages": messages, "completion": completion}
            return "labeled_completions", fields | {
                "is_desirable": candidate.is_desirable,
                "why": candidate.why[:255],
            } | _hash("label", messages, completion, candidate.is_desirable)
        case TaskCandidate():
            return "verifiable_tasks", _task_fields(candidate, redactor)
    raise TypeError(f"not a signal candidate: {type(candidate).__name__}")


def _task_fields(candidate: TaskCandidate, redactor: _Redactor) -> dict[str, Any]:
    # A value the prompt names (an email to send to, a person to look up) is in the expected
    # calls and the environment's state too: each string is redacted with the record's
    # surrogates, so the task stays solvable. The environment's source code is code.
    environment = candidate.environment
    if environment is not None:
        environment = {
            key: value if key == "source" else redactor.strings(value, keys=key == "classes")
            for key, value in environment.items()
        }
    fields = {
        "task_kind": candidate.task_kind,
        "language": candidate.language,
        "prompt": redactor.text(candidate.prompt),
        "entry_point": candidate.entry_point,
        "visible_tests": redactor.optional(candidate.visible_tests),
        "hidden_tests": redactor.optional(candidate.hidden_tests),
        "reference_solution": redactor.optional(candidate.reference_solution),
        "answer": redactor.optional(candidate.answer),
        "messages": None if candidate.messages is None else redactor.messages(candidate.messages),
        "tools": candidate.tools,
        "expected_calls": redactor.strings(candidate.expected_calls),
        "environment": environment,
        "verifier_status": "pending",
        "verifier_reason": None,
        "difficulty": None,
    }
    checked = [fields[name] for name in ("messages", "tools", "expected_calls", "environment")]
    return fields | _hash(
        "task",
        fields["prompt"],
        fields["hidden_tests"] or "",
        fields["answer"] or "",
        # Code and answer tasks hash as before (their hashes are stored).
        *([checked] if any(part is not None for part in checked) else []),
    )


def _hash(kind: str, *parts: object) -> dict[str, str]:
    return {"content_sha256": content_sha256(kind, *parts)}


INGESTED_NAMESPACE = uuid.UUID("6f1c2b1e-3c1a-4e8a-9a57-2f5f0d1f7e01")


def _store_interactions(
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    interactions: Sequence[InteractionCandidate],
) -> StoreCounts:
    """Interactions get an id derived from (domain, source ref) and events an id made of the
    domain and the source's own id, so a second ingest of the same export into the same domain
    finds both and adds nothing, and another domain gets its own copies."""
    counts = StoreCounts()
    if not interactions:
        return counts
    now = utcnow()
    interaction_rows, event_rows = [], []
    for item in interactions:
        redactor = _Redactor(item.provenance.names, item.provenance.group_key)
        interaction_id = uuid.uuid5(INGESTED_NAMESPACE, f"{domain_id}:{item.provenance.source_ref}")
        interaction_rows.append(
            {
                "id": interaction_id,
                "created_at": now,
                "tenant_id": tenant_id,
                "domain_id": domain_id,
                "messages": redactor.messages(item.messages),
                "response": redactor.text(item.response),
                "model_name": None,
                "model_version": None,
                "adapter": None,
                "session_id": None,
                "metadata": {"source_ref": item.provenance.source_ref},
                "idempotency_key": f"ingest:{domain_id}:{item.provenance.source_ref}"[:255],
                "request_sha256": "",
            }
        )
        counts.redacted += bool(redactor.report)
        event_rows += [
            _event_row(tenant_id, domain_id, interaction_id, feedback, now)
            for feedback in item.feedback
        ]
    inserted = insert_ignoring_conflicts(session, INTERACTIONS, interaction_rows)
    counts.accepted["interactions"] += len(inserted)
    counts.duplicate += len(interaction_rows) - len(inserted)
    inserted = insert_ignoring_conflicts(session, FEEDBACK_EVENTS, event_rows)
    counts.accepted["feedback_events"] += len(inserted)
    counts.duplicate += len(event_rows) - len(inserted)
    return counts


def _event_row(
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    interaction_id: uuid.UUID,
    feedback: FeedbackItem,
    now: datetime,
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "created_at": now,
        "tenant_id": tenant_id,
        "domain_id": domain_id,
        "interaction_id": interaction_id,
        "kind": feedback.kind,
        "value": feedback.value,
        "messages": None,
        "response": None,
        "rater": feedback.rater,
        "event_id": f"ingest:{domain_id}:{feedback.event_id}"[:255],
        "idempotency_key": None,
        "request_sha256": "",
    }
