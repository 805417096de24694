"""Training signal: SFT examples, weighted preference pairs and verifiable tasks.

Every row carries its provenance and a content hash that is unique within its domain, so the
same signal can never be stored twice however often a source is ingested.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from flywheel.db import Base, IdMixin, JsonType, set_index

SOURCE_KINDS = ("feedback", "ticket", "repository", "task_file", "api")
VERIFIER_STATUSES = ("pending", "usable", "unusable")
TASK_KINDS = ("code", "answer", "tool_call", "environment")
INGEST_RUN_STATUSES = ("running", "succeeded", "failed")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN (" + ", ".join(f"'{value}'" for value in values) + ")"


class ProvenanceMixin(IdMixin):
    """Where a piece of signal came from, and how much it should count."""

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    source_kind: Mapped[str] = mapped_column(String(32))
    source_ref: Mapped[str | None] = mapped_column(String(1024))
    group_key: Mapped[str] = mapped_column(
        String(255), doc="Items sharing a group (thread, repository…) never straddle splits."
    )
    content_sha256: Mapped[str] = mapped_column(String(64))
    ingestor_version: Mapped[str] = mapped_column(String(64))
    redaction_report: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    tags: Mapped[list[str]] = mapped_column(
        JsonType,
        default=list,
        server_default=text("'[]'"),
        doc="The source's own labels (`ticket.category:billing`, `skill:carry`): the eval "
        "slices the gate judges. Not part of the content hash (see signals.store).",
    )
    minhash: Mapped[bytes | None] = mapped_column(
        LargeBinary, doc="MinHash signature of the text, for the near-duplicate pass."
    )

    @declared_attr
    def duplicate_of_id(cls) -> Mapped[uuid.UUID | None]:
        """The canonical item this one nearly duplicates (kept and counted, not dropped)."""
        table: str = cls.__tablename__  # type: ignore[attr-defined]  # set by each subclass
        return mapped_column(ForeignKey(f"{table}.id", ondelete="SET NULL"))

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (
            UniqueConstraint("domain_id", "content_sha256"),
            Index(None, "domain_id", "group_key"),
            set_index("duplicate_of_id"),  # deleting an item unsets its duplicates' links
            CheckConstraint(_in("source_kind", SOURCE_KINDS), name="source_kind"),
            CheckConstraint("weight >= 0", name="weight_non_negative"),
            *cls.__extra_table_args__,
        )

    __extra_table_args__: tuple[Any, ...] = ()


class SftExample(ProvenanceMixin, Base):
    """A conversation prefix and the completion the model should give."""

    __tablename__ = "sft_examples"

    messages: Mapped[list[Any]] = mapped_column(JsonType)
    completion: Mapped[str] = mapped_column(Text)
    # The conversation's tools (OpenAI function tools), when it offered any; the completion's
    # tool calls (OpenAI's `tool_calls`) when it calls tools, `completion` then its text.
    tools: Mapped[list[Any] | None] = mapped_column(JsonType)
    completion_tool_calls: Mapped[list[Any] | None] = mapped_column(JsonType)


class PreferencePair(ProvenanceMixin, Base):
    """`chosen` is preferred over `rejected` for the same prompt, with a weight and a reason."""

    __tablename__ = "preference_pairs"

    messages: Mapped[list[Any]] = mapped_column(JsonType)
    chosen: Mapped[str] = mapped_column(Text)
    rejected: Mapped[str] = mapped_column(Text)
    why: Mapped[str] = mapped_column(String(255))
    tools: Mapped[list[Any] | None] = mapped_column(JsonType)
    chosen_tool_calls: Mapped[list[Any] | None] = mapped_column(JsonType)
    rejected_tool_calls: Mapped[list[Any] | None] = mapped_column(JsonType)


class LabeledCompletion(ProvenanceMixin, Base):
    """An unpaired judgement (KTO-style): this completion to this prompt was good, or bad."""

    __tablename__ = "labeled_completions"

    messages: Mapped[list[Any]] = mapped_column(JsonType)
    completion: Mapped[str] = mapped_column(Text)
    is_desirable: Mapped[bool]
    why: Mapped[str] = mapped_column(String(255))
    tools: Mapped[list[Any] | None] = mapped_column(JsonType)
    completion_tool_calls: Mapped[list[Any] | None] = mapped_column(JsonType)


class VerifiableTask(ProvenanceMixin, Base):
    """A task whose answers can be checked: code against tests, a question against an answer,
    tool calls against the expected calls, or an episode against an environment's final state.

    Hidden tests and the reference solution never appear in a prompt.
    """

    __tablename__ = "verifiable_tasks"
    __extra_table_args__ = (
        CheckConstraint(_in("verifier_status", VERIFIER_STATUSES), name="verifier_status"),
        CheckConstraint(_in("task_kind", TASK_KINDS), name="task_kind"),
    )

    task_kind: Mapped[str] = mapped_column(String(16), default="code")
    language: Mapped[str] = mapped_column(String(32), default="python")
    prompt: Mapped[str] = mapped_column(Text)
    entry_point: Mapped[str | None] = mapped_column(String(255))
    visible_tests: Mapped[str | None] = mapped_column(Text)
    hidden_tests: Mapped[str | None] = mapped_column(Text)
    reference_solution: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text)
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JsonType, doc="The prompt as chat messages, when it is more than one user turn."
    )
    tools: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JsonType, doc="OpenAI function tools offered to the model (tool_call, environment)."
    )
    expected_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JsonType,
        doc="tool_call: the call set to make, order-free; each argument's acceptable values.",
    )
    environment: Mapped[dict[str, Any] | None] = mapped_column(
        JsonType,
        doc="environment: source, classes with their initial state, turns, ground-truth calls.",
    )
    verifier_status: Mapped[str] = mapped_column(String(16), default="pending")
    verifier_reason: Mapped[str | None] = mapped_column(Text)
    difficulty: Mapped[float | None] = mapped_column(Float, doc="A model's pass rate, 0..1.")


class IngestRun(IdMixin, Base):
    """One pass of an ingestor (or the feedback compiler) over one source, with its counts.

    `checkpoint` is where a crashed run resumes (records already committed, or the compiler's
    watermark); `counts` holds read, accepted, duplicate, near_duplicate, redacted and
    rejected (by reason).
    """

    __tablename__ = "ingest_runs"
    __table_args__ = (
        CheckConstraint(_in("status", INGEST_RUN_STATUSES), name="status"),
        CheckConstraint(_in("source_kind", SOURCE_KINDS), name="source_kind"),
        Index(None, "domain_id", "source_kind", "source_sha256"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    source_kind: Mapped[str] = mapped_column(String(32))
    source_format: Mapped[str] = mapped_column(String(32))
    source_ref: Mapped[str] = mapped_column(String(1024))
    source_sha256: Mapped[str] = mapped_column(String(64), doc="What was read, fingerprinted.")
    ingestor_version: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="running")
    checkpoint: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    counts: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[datetime | None]
