"""training signal carries tool calling: the tools offered and the completions' tool calls

Nullable JSON columns: `tools` (the conversation's OpenAI function tools) on sft_examples,
preference_pairs and labeled_completions; `completion_tool_calls` on sft_examples and
labeled_completions, `chosen_tool_calls` and `rejected_tool_calls` on preference_pairs (the
assistant's `tool_calls` when that completion calls tools; the text column then holds its
text, empty when it only calls tools). Existing rows are text completions without tools:
NULL is their value, so no row moves. Downgrade drops the columns.

Revision ID: 9c3f7a1e4b28
Revises: a4f7c9e1d2b8
Create Date: 2026-12-02 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "9c3f7a1e4b28"
down_revision: str | None = "a4f7c9e1d2b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = {
    "sft_examples": ("tools", "completion_tool_calls"),
    "preference_pairs": ("tools", "chosen_tool_calls", "rejected_tool_calls"),
    "labeled_completions": ("tools", "completion_tool_calls"),
}


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for name in columns:
                batch.add_column(sa.Column(name, json_type, nullable=True))


def downgrade() -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for name in reversed(columns):
                batch.drop_column(name)
