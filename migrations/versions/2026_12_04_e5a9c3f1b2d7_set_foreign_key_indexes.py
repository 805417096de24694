"""set_foreign_key_indexes: the nullable foreign keys a delete follows get partial indexes

`dataset_members`' four item columns and each signal table's `duplicate_of_id`: deleting an
item (forget, a retraction) cascades to its member rows and unsets its duplicates' links, and
without an index each deleted item scanned every version's members and its whole table
(33 ms per item at 100k members, growing with every version). Partial (`WHERE column IS NOT
NULL`): a member row sets one of the four. Built CONCURRENTLY on PostgreSQL, so a deployment's
writes go on while they build. No row moves; downgrade drops them.

Revision ID: e5a9c3f1b2d7
Revises: c81322ba7f18
Create Date: 2026-12-04 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e5a9c3f1b2d7"
down_revision: str | None = "c81322ba7f18"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = [
    ("dataset_members", "sft_example_id"),
    ("dataset_members", "preference_pair_id"),
    ("dataset_members", "verifiable_task_id"),
    ("dataset_members", "labeled_completion_id"),
    *(
        (table, "duplicate_of_id")
        for table in ("sft_examples", "preference_pairs", "verifiable_tasks", "labeled_completions")
    ),
]


def upgrade() -> None:
    is_postgres = op.get_bind().dialect.name == "postgresql"
    with op.get_context().autocommit_block():
        for table, column in INDEXES:
            where = sa.text(f"{column} IS NOT NULL")
            op.create_index(
                op.f(f"ix_{table}_{column}"),
                table,
                [column],
                postgresql_where=where,
                sqlite_where=where,
                postgresql_concurrently=is_postgres,
            )


def downgrade() -> None:
    for table, column in INDEXES:
        op.drop_index(op.f(f"ix_{table}_{column}"), table_name=table)
