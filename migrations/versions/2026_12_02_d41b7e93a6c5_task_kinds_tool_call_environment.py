"""verifiable tasks of two new kinds: tool_call and environment

`task_kind` may now be 'tool_call' (the prompt offers `tools`; the check is `expected_calls`,
compared as BFCL compares them) or 'environment' (a Python environment run in the sandbox for
the whole episode; `environment` holds its source, initial state, turns and ground-truth calls).
Nullable JSON columns `messages` (the prompt as chat messages when it is more than one user
turn), `tools`, `expected_calls` and `environment`. Existing rows are code and answer tasks:
NULL is their value, so no row moves. Downgrade refuses while a row of a new kind exists (it
could not be kept), then drops the columns and restores the old check.

Revision ID: d41b7e93a6c5
Revises: 9c3f7a1e4b28
Create Date: 2026-12-02 23:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d41b7e93a6c5"
down_revision: str | None = "9c3f7a1e4b28"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("messages", "tools", "expected_calls", "environment")
CHECK = "ck_verifiable_tasks_task_kind"


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("verifiable_tasks") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, json_type, nullable=True))
        batch.drop_constraint(op.f(CHECK), type_="check")
        batch.create_check_constraint(
            op.f(CHECK), "task_kind IN ('code', 'answer', 'tool_call', 'environment')"
        )


def downgrade() -> None:
    new_kinds = op.get_bind().execute(
        sa.text(
            "SELECT count(*) FROM verifiable_tasks WHERE task_kind IN ('tool_call', 'environment')"
        )
    )
    if new_kinds.scalar_one():
        raise RuntimeError(
            "verifiable_tasks holds tool_call or environment tasks, which the older schema "
            "cannot hold: delete them (or their domain) before downgrading"
        )
    with op.batch_alter_table("verifiable_tasks") as batch:
        batch.drop_constraint(op.f(CHECK), type_="check")
        batch.create_check_constraint(op.f(CHECK), "task_kind IN ('code', 'answer')")
        for name in reversed(COLUMNS):
            batch.drop_column(name)
