"""signal items carry tags: the source's own labels, the slices the gate judges

Every signal table gets `tags`, a JSON list of strings that defaults to `[]` on the server
(existing rows, and the feedback compiler's bulk inserts that do not name the column).
Downgrade drops the column in batch mode, so SQLite recreates the tables.

Revision ID: 77d28e7aed8b
Revises: c3169587dbd3
Create Date: 2026-12-01 10:59:44.909744
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "77d28e7aed8b"
down_revision: str | None = "c3169587dbd3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("sft_examples", "preference_pairs", "labeled_completions", "verifiable_tasks")
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(
            table, sa.Column("tags", JSON, server_default=sa.text("'[]'"), nullable=False)
        )


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("tags")
