"""forget requests (the audit of `flywheel forget`) and what tainted a dataset or model version

Revision ID: a7d3c1e5f920
Revises: 6c4095906c0a
Create Date: 2026-11-30 11:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "a7d3c1e5f920"
down_revision: str | None = "6c4095906c0a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TAINTED = ("dataset_versions", "model_versions")
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "forget_requests",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("subject_kind", sa.String(length=16), nullable=False),
        sa.Column("subject_sha256", sa.String(length=64), nullable=False),
        sa.Column("counts", JSON, nullable=False),
        sa.Column("dataset_version_ids", JSON, nullable=False),
        sa.Column("model_version_ids", JSON, nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "subject_kind IN ('rater', 'source_record')",
            name=op.f("ck_forget_requests_subject_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_forget_requests_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_forget_requests")),
    )
    op.create_index(
        op.f("ix_forget_requests_tenant_id"),
        "forget_requests",
        ["tenant_id", "subject_sha256"],
    )
    for table in TAINTED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("tainted_by_id", sa.Uuid(), nullable=True))
            batch.create_foreign_key(
                batch.f(f"fk_{table}_tainted_by_id_forget_requests"),
                "forget_requests",
                ["tainted_by_id"],
                ["id"],
                ondelete="SET NULL",
            )


def downgrade() -> None:
    for table in TAINTED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(
                batch.f(f"fk_{table}_tainted_by_id_forget_requests"), type_="foreignkey"
            )
            batch.drop_column("tainted_by_id")
    op.drop_index(op.f("ix_forget_requests_tenant_id"), table_name="forget_requests")
    op.drop_table("forget_requests")
