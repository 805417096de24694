"""ingest runs, labeled completions, near-duplicate links

Revision ID: 19765dee3014
Revises: b842aa8ad410
Create Date: 2026-11-30 08:12:06.765958
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "19765dee3014"
down_revision: str | None = "b842aa8ad410"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNAL_TABLES = ("preference_pairs", "sft_examples", "verifiable_tasks")


def upgrade() -> None:
    op.create_table(
        "ingest_runs",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("source_kind", sa.String(length=32), nullable=False),
        sa.Column("source_format", sa.String(length=32), nullable=False),
        sa.Column("source_ref", sa.String(length=1024), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=False),
        sa.Column("ingestor_version", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column(
            "checkpoint",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "counts",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source_kind IN ('feedback', 'ticket', 'repository', 'task_file', 'api')",
            name=op.f("ck_ingest_runs_source_kind"),
        ),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed')", name=op.f("ck_ingest_runs_status")
        ),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_ingest_runs_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_ingest_runs_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ingest_runs")),
    )
    op.create_index(
        op.f("ix_ingest_runs_domain_id"),
        "ingest_runs",
        ["domain_id", "source_kind", "source_sha256"],
        unique=False,
    )
    op.create_table(
        "labeled_completions",
        sa.Column(
            "messages",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("is_desirable", sa.Boolean(), nullable=False),
        sa.Column("why", sa.String(length=255), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("source_kind", sa.String(length=32), nullable=False),
        sa.Column("source_ref", sa.String(length=1024), nullable=True),
        sa.Column("group_key", sa.String(length=255), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=False),
        sa.Column("ingestor_version", sa.String(length=64), nullable=False),
        sa.Column(
            "redaction_report",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("minhash", sa.LargeBinary(), nullable=True),
        sa.Column("duplicate_of_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source_kind IN ('feedback', 'ticket', 'repository', 'task_file', 'api')",
            name=op.f("ck_labeled_completions_source_kind"),
        ),
        sa.CheckConstraint("weight >= 0", name=op.f("ck_labeled_completions_weight_non_negative")),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_labeled_completions_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["duplicate_of_id"],
            ["labeled_completions.id"],
            name=op.f("fk_labeled_completions_duplicate_of_id_labeled_completions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_labeled_completions_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_labeled_completions")),
        sa.UniqueConstraint(
            "domain_id",
            "content_sha256",
            name=op.f("uq_labeled_completions_domain_id_content_sha256"),
        ),
    )
    op.create_index(
        op.f("ix_labeled_completions_domain_id"),
        "labeled_completions",
        ["domain_id", "group_key"],
        unique=False,
    )

    for table in SIGNAL_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("minhash", sa.LargeBinary(), nullable=True))
            batch.add_column(sa.Column("duplicate_of_id", sa.Uuid(), nullable=True))
            batch.create_index(batch.f(f"ix_{table}_domain_id"), ["domain_id", "group_key"])
            batch.create_foreign_key(
                batch.f(f"fk_{table}_duplicate_of_id_{table}"),
                table,
                ["duplicate_of_id"],
                ["id"],
                ondelete="SET NULL",
            )


def downgrade() -> None:
    for table in SIGNAL_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(
                batch.f(f"fk_{table}_duplicate_of_id_{table}"), type_="foreignkey"
            )
            batch.drop_index(batch.f(f"ix_{table}_domain_id"))
            batch.drop_column("duplicate_of_id")
            batch.drop_column("minhash")

    op.drop_index(op.f("ix_labeled_completions_domain_id"), table_name="labeled_completions")
    op.drop_table("labeled_completions")
    op.drop_index(op.f("ix_ingest_runs_domain_id"), table_name="ingest_runs")
    op.drop_table("ingest_runs")
