"""interactions carry the tool calls of their response

A nullable JSON column `response_tool_calls` on `interactions`: the assistant's `tool_calls`
(OpenAI's shape: id, type, function name, JSON arguments) when the response called tools, NULL
otherwise and for every existing row (they were all text answers; the text stays in
`response`, which is empty for a response that only called tools). Downgrade drops it.

Revision ID: 5b1e9c2d7a40
Revises: 806585e79be7
Create Date: 2026-12-02 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "5b1e9c2d7a40"
down_revision: str | None = "806585e79be7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.add_column("interactions", sa.Column("response_tool_calls", json_type, nullable=True))


def downgrade() -> None:
    op.drop_column("interactions", "response_tool_calls")
