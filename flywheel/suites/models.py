"""A suite (a tenant's named set of domains, each with a sampling weight), and its runs."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, Float, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin, JsonType

CURRICULA = ("easy_first", "none")
SUITE_RUN_STATUSES = ("running", "succeeded", "refused", "failed")


class Suite(IdMixin, Base):
    """Domains trained as one adapter: `curriculum` orders the combined train rows (easy_first:
    tasks by measured pass rate, highest first, across every member)."""

    __tablename__ = "suites"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name"),
        CheckConstraint("curriculum IN ('easy_first', 'none')", name="curriculum"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    curriculum: Mapped[str] = mapped_column(String(16), default="easy_first")


class SuiteMember(IdMixin, Base):
    """A member domain and its share of the suite's draws (weights are relative: 0.7 and 0.3
    draw 70% and 30% of the rows, whatever the domains' sizes)."""

    __tablename__ = "suite_members"
    __table_args__ = (
        UniqueConstraint("suite_id", "domain_id"),
        CheckConstraint("weight > 0", name="weight"),
    )

    suite_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("suites.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    weight: Mapped[float] = mapped_column(Float)


class SuiteRun(IdMixin, Base):
    """One training of a suite: its export, the training runs (one per member, one trainer),
    the member versions registered, every member's verdict and what was promoted (`result`).
    `refused`: a member's gate failed, so no member was promoted."""

    __tablename__ = "suite_runs"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'succeeded', 'refused', 'failed')", name="status"),
        Index(None, "suite_id", "created_at"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    suite_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("suites.id", ondelete="CASCADE"))
    method: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="running")
    result: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
