"""Deletes that follow a foreign key find the referencing rows through an index.

Forget and retraction delete signal items, retention deletes raw interactions and events;
each deleted row makes the database look up the rows that reference it (to cascade, or to set
NULL). Without an index led by the referencing column every deleted item scanned the whole
referencing table: `dataset_members` (every version's rows) and its own table (its
duplicates' links), 33 ms per item at 100k members and growing with each version.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import PrimaryKeyConstraint, Table, UniqueConstraint, text
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import Base

# Rows the platform deletes in normal operation (not only when a tenant or domain goes).
DELETED_ROWS = (
    "sft_examples",
    "preference_pairs",
    "verifiable_tasks",
    "labeled_completions",
    "interactions",
    "feedback_events",
)


def referencing_columns() -> list[tuple[Table, str]]:
    """(table, column) of every foreign key to a table whose rows are deleted in use."""
    return [
        (table, key.parent.name)
        for table in Base.metadata.sorted_tables
        for key in table.foreign_keys
        if key.column.table.name in DELETED_ROWS
    ]


def leading_columns(table: Table) -> set[str]:
    """The first column of each index, unique constraint and primary key of the table."""
    keys = [
        *table.indexes,
        *(c for c in table.constraints if isinstance(c, UniqueConstraint | PrimaryKeyConstraint)),
    ]
    return {next(iter(key.columns)).name for key in keys if key.columns}


def test_every_key_to_a_deleted_row_leads_an_index() -> None:
    assert len(referencing_columns()) >= 8  # members' four items, four duplicate links
    unindexed = [
        f"{table.name}.{column}"
        for table, column in referencing_columns()
        if column not in leading_columns(table)
    ]
    assert unindexed == []


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("dataset_members", "sft_example_id"),
        ("dataset_members", "verifiable_task_id"),
        ("sft_examples", "duplicate_of_id"),
        ("preference_pairs", "duplicate_of_id"),
    ],
)
def test_the_lookup_a_delete_makes_uses_the_index(
    sessions: sessionmaker[Session], table: str, column: str
) -> None:
    """In the migrated database, the query a cascade or SET NULL runs per deleted row (the
    column equal to the row's id) searches the partial index, on either database."""
    query = f"SELECT 1 FROM {table} WHERE {column} = '{uuid.uuid4().hex}'"
    with sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SET LOCAL enable_seqscan = off"))  # small tables: the plan
            plan = "\n".join(session.scalars(text(f"EXPLAIN {query}")))
        else:
            rows = session.execute(text(f"EXPLAIN QUERY PLAN {query}"))
            plan = "\n".join(str(row[-1]) for row in rows)
        assert f"ix_{table}_{column}" in plan, plan
