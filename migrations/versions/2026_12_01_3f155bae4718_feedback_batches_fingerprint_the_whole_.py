"""feedback batches fingerprint the whole request; feedback pages by interaction, time, id

`feedback_batches` holds, per tenant and batch `Idempotency-Key`, the hash of the whole
batch, so the same key with an event added, removed or changed is refused (409). Batches
stored before it have no row: the service recognises their replays from the events' keys.

The interaction index gains `created_at, id`: an interaction's feedback is read in pages in
that order. Plain index operations, no batch mode: SQLite keeps the table and the triggers
that make feedback events append-only.

Revision ID: 3f155bae4718
Revises: 6e6c8668ee6b
Create Date: 2026-12-01 14:15:48.962843
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3f155bae4718"
down_revision: str | None = "6e6c8668ee6b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feedback_batches",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_feedback_batches_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback_batches")),
        sa.UniqueConstraint(
            "tenant_id",
            "idempotency_key",
            name=op.f("uq_feedback_batches_tenant_id_idempotency_key"),
        ),
    )
    _index_interactions("interaction_id", "created_at", "id")


def downgrade() -> None:
    _index_interactions("interaction_id")
    op.drop_table("feedback_batches")


def _index_interactions(*columns: str) -> None:
    name = op.f("ix_feedback_events_interaction_id")
    op.drop_index(name, table_name="feedback_events")
    op.create_index(name, "feedback_events", list(columns), unique=False)
