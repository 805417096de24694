"""interactions and feedback events carry the request's tools (OpenAI function tools)

A nullable JSON column `tools` on `interactions` and `feedback_events`; existing rows get
NULL (no tools were offered, or none were recorded). Nothing to move: the messages already
stored are valid under the widened message schema (every one has a role and text content,
the only shape accepted before; tool calls, tool messages, names and content parts are new,
optional fields). Downgrade drops the columns, and with them any tools recorded since.

Plain ALTER TABLE on both databases (SQLite >= 3.35 drops a column in place): a batch
recreation would lose feedback_events' append-only triggers.

Revision ID: 874a2be871ec
Revises: 3f155bae4718
Create Date: 2026-12-01 18:27:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "874a2be871ec"
down_revision: str | None = "3f155bae4718"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("interactions", "feedback_events")


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    for table in TABLES:
        op.add_column(table, sa.Column("tools", json_type, nullable=True))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "tools")
