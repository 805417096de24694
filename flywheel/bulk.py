"""Bulk writes that skip rows a unique constraint refuses, reporting which rows went in.

On PostgreSQL rows are `COPY`-ed into a session-local staging table and moved with one
`INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING id`: no per-row SQL, no giant
parameter lists. On SQLite (the embedded default) one multi-row INSERT does the same.

Rows that are new as a rule (a fresh API batch) take `insert_new_rows`: one `COPY` straight
into the table, inside a savepoint; only when a constraint refuses a row is the savepoint
rolled back and the batch sent through the staging path.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import orjson
import psycopg
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
    session.execute(
        text(f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table.name}) ON COMMIT DELETE ROWS")
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


def insert_new_rows(session: Session, table: Table, rows: list[dict[str, Any]]) -> set[uuid.UUID]:
    """`insert_ignoring_conflicts` for rows that are new as a rule: the same result, cheaper
    when none conflicts. On PostgreSQL one COPY into the table itself (no staging table, no
    `ON CONFLICT` probes), in a savepoint; an integrity error (a stored idempotency key or
    event id, a duplicate within the rows, a deleted domain) rolls the savepoint back and
    the rows take `insert_ignoring_conflicts`, which decides them one by one as before."""
    if not rows or session.get_bind().dialect.name != "postgresql":
        return insert_ignoring_conflicts(session, table, rows)
    try:
        with session.begin_nested():
            _copy_into(session, table.name, list(rows[0]), _json_columns(table, rows[0]), rows)
    except psycopg.errors.IntegrityError:
        return _copy_ignoring_conflicts(session, table, rows)
    return {row["id"] for row in rows}


def _json_columns(table: Table, row: dict[str, Any]) -> list[bool]:
    return [isinstance(table.c[column].type, JSON) for column in row]


def _copy_into(
    session: Session,
    target: str,
    columns: list[str],
    is_json: list[bool],
    rows: list[dict[str, Any]],
) -> None:
    """COPY `rows` (dicts with `columns`) into `target`; JSON values sent as text that
    orjson wrote (a quarter of the cost of psycopg's `Jsonb`, which calls `json.dumps`)."""
    cursor = session.connection().connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    with cursor.copy(f"COPY {target} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(
                [
                    _json_text(row[column]) if json and row[column] is not None else row[column]
                    for column, json in zip(columns, is_json, strict=True)
                ]
            )


def _json_text(value: Any) -> str | Jsonb:
    """`value` as JSON text; what orjson cannot write (an integer beyond 64 bits, a key that
    is not a string) goes as `Jsonb`, as the staging path sends it."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return Jsonb(value)
