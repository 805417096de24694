"""webhook deliveries: the outbox of the signed webhooks each champion move sends

One row per move and URL, written in the promotion event's transaction, then sent (retried with
backoff) and recorded delivered or failed. The downgrade drops the table and its history.

Revision ID: 806585e79be7
Revises: 874a2be871ec
Create Date: 2026-12-01 18:26:48.409442
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "806585e79be7"
down_revision: str | None = "874a2be871ec"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
TABLE = "webhook_deliveries"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("domain_id", sa.Uuid(), nullable=False),
        sa.Column("promotion_event_id", sa.Uuid(), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("body", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "event IN ('promoted', 'rolled_back')", name=op.f("ck_webhook_deliveries_event")
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')",
            name=op.f("ck_webhook_deliveries_status"),
        ),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domains.id"],
            name=op.f("fk_webhook_deliveries_domain_id_domains"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["promotion_event_id"],
            ["promotion_events.id"],
            name=op.f("fk_webhook_deliveries_promotion_event_id_promotion_events"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_webhook_deliveries_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(op.f("ix_webhook_deliveries_domain_id"), TABLE, ["domain_id", "created_at"])
    op.create_index(op.f("ix_webhook_deliveries_status"), TABLE, ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_webhook_deliveries_status"), table_name=TABLE)
    op.drop_index(op.f("ix_webhook_deliveries_domain_id"), table_name=TABLE)
    op.drop_table(TABLE)
