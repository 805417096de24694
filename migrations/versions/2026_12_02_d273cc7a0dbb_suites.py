"""suites: named sets of domains trained as one adapter, gated per member

`suites` (tenant-owned, named, a curriculum), `suite_members` (a domain of the same tenant and
its sampling weight, > 0) and `suite_runs` (one training of a suite: status, and in `result`
the export, training runs, registered versions and every member's verdict). New tables only:
no row moves; downgrade drops them.

Revision ID: d273cc7a0dbb
Revises: d41b7e93a6c5
Create Date: 2026-12-02 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d273cc7a0dbb"
down_revision: str | None = "d41b7e93a6c5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "suites",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("curriculum", sa.String(length=16), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "curriculum IN ('easy_first', 'none')", name=op.f("ck_suites_curriculum")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_suites_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suites")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_suites_tenant_id_name")),
    )
    op.create_table(
        "suite_members",
        sa.Column("suite_id", sa.Uuid(), nullable=False),
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("weight > 0", name=op.f("ck_suite_members_weight")),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_suite_members_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["suite_id"],
            ["suites.id"],
            name=op.f("fk_suite_members_suite_id_suites"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suite_members")),
        sa.UniqueConstraint(
            "suite_id", "domain_id", name=op.f("uq_suite_members_suite_id_domain_id")
        ),
    )
    op.create_table(
        "suite_runs",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("suite_id", sa.Uuid(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'refused', 'failed')",
            name=op.f("ck_suite_runs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["suite_id"],
            ["suites.id"],
            name=op.f("fk_suite_runs_suite_id_suites"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_suite_runs_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suite_runs")),
    )
    op.create_index(
        op.f("ix_suite_runs_suite_id"), "suite_runs", ["suite_id", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_suite_runs_suite_id"), table_name="suite_runs")
    op.drop_table("suite_runs")
    op.drop_table("suite_members")
    op.drop_table("suites")
