"""Dataset versions and the items they hold, split by split."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin, JsonType


class DatasetVersion(IdMixin, Base):
    """An immutable, content-addressed snapshot of a domain's signal."""

    __tablename__ = "dataset_versions"
    __table_args__ = (
        UniqueConstraint("domain_id", "version"),
        UniqueConstraint("domain_id", "manifest_sha256"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    version: Mapped[int]
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    recipe: Mapped[dict[str, Any]] = mapped_column(
        JsonType, default=dict, doc="Mixing weights, replay share, curriculum: enough to rebuild."
    )
    stats: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    parent_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="RESTRICT")
    )
    tainted_at: Mapped[datetime | None] = mapped_column(
        default=None, doc="Set when data it used was deleted (forget): retrain from a new one."
    )


class DatasetMember(Base):
    """One item of a version, in exactly one split; exactly one of the item columns is set."""

    __tablename__ = "dataset_members"
    __table_args__ = (
        CheckConstraint("split IN ('train', 'eval')", name="split"),
        CheckConstraint(
            "(CASE WHEN sft_example_id IS NULL THEN 0 ELSE 1 END)"
            " + (CASE WHEN preference_pair_id IS NULL THEN 0 ELSE 1 END)"
            " + (CASE WHEN verifiable_task_id IS NULL THEN 0 ELSE 1 END) = 1",
            name="exactly_one_item",
        ),
        Index(None, "dataset_version_id", "split"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    dataset_version_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="CASCADE")
    )
    split: Mapped[str] = mapped_column(String(8))
    group_key: Mapped[str] = mapped_column(String(255))
    sft_example_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("sft_examples.id", ondelete="CASCADE")
    )
    preference_pair_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("preference_pairs.id", ondelete="CASCADE")
    )
    verifiable_task_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("verifiable_tasks.id", ondelete="CASCADE")
    )
