"""purged_feedback: what retention keeps of the raw events it deletes

One row per (domain, subject, conversation) whose raw feedback events retention deleted: the
subject is the event's rater or its interaction's source record, the conversation its group
key. `flywheel forget` of that subject reads them to find the signal compiled from the deleted
events. A new table only: no row moves; downgrade drops it.

Revision ID: c37d41a273ac
Revises: d273cc7a0dbb
Create Date: 2026-12-04 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c37d41a273ac"
down_revision: str | None = "d273cc7a0dbb"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "purged_feedback",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("subject_kind", sa.String(length=16), nullable=False),
        sa.Column("subject_sha256", sa.String(length=64), nullable=False),
        sa.Column("record_sha256", sa.String(length=64), nullable=False),
        sa.Column("group_key", sa.String(length=255), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "subject_kind IN ('rater', 'source_record')",
            name=op.f("ck_purged_feedback_subject_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_purged_feedback_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_purged_feedback_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_purged_feedback")),
        sa.UniqueConstraint(
            "domain_id",
            "subject_kind",
            "subject_sha256",
            "record_sha256",
            "group_key",
            name=op.f("uq_purged_feedback_trace"),
        ),
    )
    op.create_index(
        op.f("ix_purged_feedback_tenant_id"),
        "purged_feedback",
        ["tenant_id", "subject_kind", "subject_sha256"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_purged_feedback_tenant_id"), table_name="purged_feedback")
    op.drop_table("purged_feedback")
