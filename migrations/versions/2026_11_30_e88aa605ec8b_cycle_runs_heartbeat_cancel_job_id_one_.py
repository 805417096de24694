"""cycle runs: heartbeat, cancel request, job id, a `skipped` status, one running cycle per
domain; scheduled cycles (one row per domain and schedule period)

Revision ID: e88aa605ec8b
Revises: a7d3c1e5f920
Create Date: 2026-11-30 14:38:38.869732
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e88aa605ec8b"
down_revision: str | None = "a7d3c1e5f920"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNNING_CYCLE = sa.text("method = 'cycle' AND status = 'running'")
OLD_STATUSES = "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')"
NEW_STATUSES = "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')"


def upgrade() -> None:
    op.create_table(
        "scheduled_cycles",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("training_run_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "decision IN ('queued', 'skipped')", name=op.f("ck_scheduled_cycles_decision")
        ),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_scheduled_cycles_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_scheduled_cycles_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["training_run_id"],
            ["training_runs.id"],
            name=op.f("fk_scheduled_cycles_training_run_id_training_runs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduled_cycles")),
        sa.UniqueConstraint(
            "domain_id", "period_start", name=op.f("uq_scheduled_cycles_domain_id_period_start")
        ),
    )
    with op.batch_alter_table("training_runs") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
        batch.drop_constraint(op.f("ck_training_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_training_runs_status"), NEW_STATUSES)
    op.create_index(
        "uq_training_runs_running_cycle",
        "training_runs",
        ["domain_id"],
        unique=True,
        postgresql_where=RUNNING_CYCLE,
        sqlite_where=RUNNING_CYCLE,
    )


def downgrade() -> None:
    op.drop_index("uq_training_runs_running_cycle", table_name="training_runs")
    op.execute("UPDATE training_runs SET status = 'succeeded' WHERE status = 'skipped'")
    with op.batch_alter_table("training_runs") as batch:
        batch.drop_constraint(op.f("ck_training_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_training_runs_status"), OLD_STATUSES)
        batch.drop_column("job_id")
        batch.drop_column("cancel_requested_at")
        batch.drop_column("heartbeat_at")
    op.drop_table("scheduled_cycles")
