"""Bulk writes that skip rows a unique constraint refuses, reporting which rows went in.

On PostgreSQL rows are `COPY`-ed into a session-local staging table and moved with one
`INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING id`: no per-row SQL, no giant
parameter lists. On SQLite (the embedded default) one multi-row INSERT does the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from psycopg.types.json import Jsonb
from sqlalchemy import JSON, Table, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

T = TypeVar("T")
CHUNK = 1_000  # ids per `IN (...)`: bounded statements however many rows a change touches


def chunked(items: Iterable[T], size: int = CHUNK) -> Iterator[list[T]]:
    """`items` in lists of at most `size`."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def insert_ignoring_conflicts(
    session: Session, table: Table, rows: list[dict[str, Any]]
) -> set[uuid.UUID]:
    """Insert `rows` (all with the same keys, including `id`); the ids that were inserted."""
    if not rows:
        return set()
    if session.get_bind().dialect.name == "postgresql":
        return _copy_ignoring_conflicts(session, table, rows)
    statement = sqlite.insert(table).on_conflict_do_nothing().returning(table.c.id)
    return set(session.scalars(statement, rows))


def _copy_ignoring_conflicts(
    session: Session, table: Table, rows: list[dict[str, Any]]
) -> set[uuid.UUID]:
    columns = list(rows[0])
    names = ", ".join(columns)
    staging = f"staging_{table.name}"
    # Temporary tables are per connection; the pool reuses connections, so it is made once.
    # With the table's defaults: rows may leave out a NOT NULL column that has one.
    session.execute(
        text(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table.name} INCLUDING DEFAULTS) "
            "ON COMMIT DELETE ROWS"
        )
    )
    session.execute(text(f"TRUNCATE {staging}"))
    is_json = [isinstance(table.c[column].type, JSON) for column in columns]
    cursor = session.connection().connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    with cursor.copy(f"COPY {staging} ({names}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(
                [
                    Jsonb(row[column]) if json and row[column] is not None else row[column]
                    for column, json in zip(columns, is_json, strict=True)
                ]
            )
    inserted = session.execute(
        text(
            f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {staging} "
            "ON CONFLICT DO NOTHING RETURNING id"
        )
    )
    return {row[0] for row in inserted}
