"""The schedule's memory: which period of which domain has been decided, and how."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin


class ScheduledCycle(IdMixin, Base):
    """One row per domain and schedule period: inserted once, so a period fires once however
    many workers tick (the unique constraint decides the race)."""

    __tablename__ = "scheduled_cycles"
    __table_args__ = (
        UniqueConstraint("domain_id", "period_start"),
        CheckConstraint("decision IN ('queued', 'skipped')", name="decision"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    period_start: Mapped[datetime]
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    training_run_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL")
    )
