"""Interactions and append-only feedback events, as apps send them.

Both carry the client's optional `Idempotency-Key` and the hash of the request that used it,
so a replay finds the first row by a unique constraint instead of a second table.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin, JsonType

FEEDBACK_KINDS = ("rating", "correction", "comparison", "outcome")
# Which release served a gateway call (NULL for interactions posted through the REST API).
RELEASE_ROLES = ("champion", "challenger", "pinned", "base", "shadow")
CALL_STATUSES = ("ok", "failed")


class Interaction(IdMixin, Base):
    """One model call in production: the conversation, the response and who served it."""

    __tablename__ = "interactions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key"),
        Index(None, "tenant_id", "domain_id", "created_at"),
        CheckConstraint(
            "release_role IN (" + ", ".join(f"'{role}'" for role in RELEASE_ROLES) + ")",
            name="release_role",
        ),
        CheckConstraint(
            "status IN (" + ", ".join(f"'{status}'" for status in CALL_STATUSES) + ")",
            name="status",
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    messages: Mapped[list[Any]] = mapped_column(JsonType)
    # The request's tool definitions (OpenAI function tools), when it offered any.
    tools: Mapped[list[Any] | None] = mapped_column(JsonType)
    response: Mapped[str] = mapped_column(Text)
    # The response's tool calls (OpenAI's `tool_calls`), when it called tools; `response` is
    # then its text, empty when it only called tools.
    response_tool_calls: Mapped[list[Any] | None] = mapped_column(JsonType)
    model_name: Mapped[str | None] = mapped_column(String(255))
    model_version: Mapped[str | None] = mapped_column(String(255))
    adapter: Mapped[str | None] = mapped_column(String(1024))
    session_id: Mapped[str | None] = mapped_column(String(255))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JsonType, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_sha256: Mapped[str] = mapped_column(String(64))
    # What the gateway knows of a call it served (flywheel.inference.recording); NULL for
    # interactions posted through the REST API, whose `status` is 'ok'.
    release_role: Mapped[str | None] = mapped_column(String(16))  # one of RELEASE_ROLES
    end_user: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), server_default="ok")
    error: Mapped[str | None] = mapped_column(Text)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)


class FeedbackEvent(IdMixin, Base):
    """A raw, append-only judgement: never updated, compiled into signal later.

    `interaction_id` is set when the feedback refers to a stored interaction; otherwise the
    event carries its own `messages` and `response` (comparisons carry theirs in `value`).
    """

    __tablename__ = "feedback_events"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key"),
        UniqueConstraint("tenant_id", "event_id"),
        CheckConstraint(
            "kind IN (" + ", ".join(f"'{kind}'" for kind in FEEDBACK_KINDS) + ")", name="kind"
        ),
        Index(None, "tenant_id", "domain_id", "created_at"),
        # An interaction's feedback is read in pages ordered by (created_at, id).
        Index(None, "interaction_id", "created_at", "id"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    interaction_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("interactions.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(16))
    value: Mapped[dict[str, Any]] = mapped_column(JsonType)
    messages: Mapped[list[Any] | None] = mapped_column(JsonType)
    tools: Mapped[list[Any] | None] = mapped_column(JsonType)
    response: Mapped[str | None] = mapped_column(Text)
    rater: Mapped[str | None] = mapped_column(String(255))
    event_id: Mapped[str | None] = mapped_column(String(255))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_sha256: Mapped[str] = mapped_column(String(64))


class FeedbackBatch(IdMixin, Base):
    """A batch sent under an `Idempotency-Key`: the key fingerprints the whole request.

    Its events are stored under `<key>#<index>`; this row holds the hash of the batch's
    canonical JSON, so a replay with any event added, removed or changed is a Conflict.
    """

    __tablename__ = "feedback_batches"
    __table_args__ = (UniqueConstraint("tenant_id", "idempotency_key"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    idempotency_key: Mapped[str] = mapped_column(String(255))
    request_sha256: Mapped[str] = mapped_column(String(64))


class ForgetRequest(IdMixin, Base):
    """The audit of one `flywheel forget`: what was asked, by whom, what it deleted and which
    dataset and model versions it tainted. The subject is kept only as a hash (sha256 of
    "<tenant id>:<kind>:<id>"), so the audit does not keep the identifier it erased."""

    __tablename__ = "forget_requests"
    __table_args__ = (
        CheckConstraint("subject_kind IN ('rater', 'source_record')", name="subject_kind"),
        Index(None, "tenant_id", "subject_sha256"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    actor: Mapped[str] = mapped_column(String(255))
    subject_kind: Mapped[str] = mapped_column(String(16))
    subject_sha256: Mapped[str] = mapped_column(String(64))
    counts: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    dataset_version_ids: Mapped[list[str]] = mapped_column(JsonType, default=list)
    model_version_ids: Mapped[list[str]] = mapped_column(JsonType, default=list)


class PurgedFeedback(IdMixin, Base):
    """What retention keeps of a raw event it deleted: who it came from (its rater, or the
    source record of its interaction, and each record above it: one row per `:`-prefix), as
    `subject_sha256` hashes (never the ids themselves), and which conversation (group key) it
    was about, so that forgetting that subject still finds the signal compiled from it."""

    __tablename__ = "purged_feedback"
    __table_args__ = (
        UniqueConstraint(
            "domain_id",
            "subject_kind",
            "subject_sha256",
            "record_sha256",
            "group_key",
            name="uq_purged_feedback_trace",
        ),
        CheckConstraint("subject_kind IN ('rater', 'source_record')", name="subject_kind"),
        Index(None, "tenant_id", "subject_kind", "subject_sha256"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    subject_kind: Mapped[str] = mapped_column(String(16))
    subject_sha256: Mapped[str] = mapped_column(String(64))
    # The whole subject's hash (a source record's rows for its prefixes share it): forgetting
    # any of them takes every row of that record.
    record_sha256: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(255))


def subject_sha256(tenant_id: uuid.UUID, kind: str, subject: str) -> str:
    """How a forget request or a purged event names a subject (a rater, a source record):
    hashed, so the id itself is not kept; hash the id the same way to find its rows."""
    return hashlib.sha256(f"{tenant_id}:{kind}:{subject}".encode()).hexdigest()
