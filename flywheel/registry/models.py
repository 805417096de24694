"""Runs (cycles and trainings), registered model versions and append-only promotion events."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin, JsonType, partial_index

RUN_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "skipped")
ACTIVE_CYCLE = "method = 'cycle' AND status = 'running'"
CHAMPION = "champion"  # the registry's aliases (and promotion events' `alias`)
CHALLENGER = "challenger"


class Run(IdMixin, Base):
    """A run of a domain: a cycle (method 'cycle': compile, build, train, evaluate, promote,
    its steps recorded in `steps`) or one training (sft/dpo/kto/grpo) on one dataset version.

    The columns that point at a run keep the name `training_run_id` (model_versions,
    scheduled_cycles): it is also the field name of the API's, the CLI's and MLflow's records."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint("method IN ('sft', 'dpo', 'kto', 'grpo', 'cycle')", name="method"),
        CheckConstraint(
            "status IN (" + ", ".join(f"'{status}'" for status in RUN_STATUSES) + ")",
            name="status",
        ),
        Index(None, "domain_id", "created_at"),
        # One running cycle per domain, whichever process (worker or `flywheel cycle`) runs it.
        partial_index("uq_runs_running_cycle", "domain_id", where=ACTIVE_CYCLE, unique=True),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    dataset_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="RESTRICT")
    )
    method: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    config_sha256: Mapped[str] = mapped_column(String(64))
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    steps: Mapped[dict[str, Any]] = mapped_column(
        JsonType, default=dict, doc="Per-step status and timings of a cycle."
    )
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(
        default=None, doc="A running cycle's last sign of life: a stale one may be taken over."
    )
    cancel_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    job_id: Mapped[int | None] = mapped_column(doc="The procrastinate job that carries it out.")


class ModelVersion(IdMixin, Base):
    """An adapter version in the MLflow registry, with its evaluation and gate evidence."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("registered_model", "version"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    training_run_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("runs.id", ondelete="RESTRICT")
    )
    registered_model: Mapped[str] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(String(32))
    adapter_uri: Mapped[str] = mapped_column(String(1024))
    base_model: Mapped[str] = mapped_column(String(1024))
    eval_results: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    gate_result: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    tainted_at: Mapped[datetime | None] = mapped_column(default=None)
    tainted_by_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("forget_requests.id", ondelete="SET NULL"), doc="The forget that tainted it."
    )


class PromotionEvent(IdMixin, Base):
    """Append-only audit of every alias move: who moved what from where to where, and why.
    `retire` (alias `challenger`, to none): the live watch took a worse challenger off the
    canary."""

    __tablename__ = "promotion_events"
    __table_args__ = (
        CheckConstraint(
            "action IN ('promote', 'rollback', 'auto_rollback', 'retire')", name="action"
        ),
        Index(None, "domain_id", "created_at"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    alias: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(16))
    from_model_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_versions.id", ondelete="RESTRICT")
    )
    to_model_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_versions.id", ondelete="RESTRICT")
    )
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text, default="")
    is_forced: Mapped[bool] = mapped_column(default=False)
    evidence: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)


WEBHOOK_EVENTS = ("promoted", "rolled_back")
WEBHOOK_STATUSES = ("pending", "delivered", "failed")


class WebhookDelivery(IdMixin, Base):
    """One webhook for one alias move to one URL (an outbox row): written in the transaction
    of the promotion event it announces, sent after that commits (`registry.webhooks`)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint("event IN ('promoted', 'rolled_back')", name="event"),
        CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status"),
        Index(None, "domain_id", "created_at"),
        Index(None, "status", "next_attempt_at"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    promotion_event_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("promotion_events.id", ondelete="CASCADE")
    )
    event: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(String(2048))
    body: Mapped[dict[str, Any]] = mapped_column(JsonType, doc="The payload, signed as sent.")
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(default=0)
    last_status_code: Mapped[int | None] = mapped_column(default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    next_attempt_at: Mapped[datetime | None] = mapped_column(
        default=None, doc="When a pending delivery is due (or its sender's claim runs out)."
    )
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
