"""Bulk writes that skip rows a unique constraint refuses, reporting which rows went in.

On PostgreSQL rows are `COPY`-ed into a session-local staging table and moved with one
`INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING id`: no per-row SQL, no giant
parameter lists. On SQLite (the embedded default) one multi-row INSERT does the same.

Rows that are new as a rule (a fresh API batch) take `insert_new_rows`: one `COPY` straight
into the table, inside a savepoint; only when a constraint refuses a row is the savepoint
rolled back and the batch sent through the staging path.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import orjson
from sqlalchemy import JSON, DateTime, String, Table, TypeDecorator, Uuid, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeEngine

from flywheel.db import psycopg_connection

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
    from psycopg.types.json import Jsonb  # here: only PostgreSQL's paths need the driver

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
    is_json = [_is_json(table.c[column].type) for column in columns]
    cursor = psycopg_connection(session).cursor()
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
    the rows take `insert_ignoring_conflicts`, which decides them one by one as before.
    (So does a table with a column type `_text_writer` does not know.)"""
    if not rows or session.get_bind().dialect.name != "postgresql":
        return insert_ignoring_conflicts(session, table, rows)
    import psycopg  # here: only PostgreSQL's paths need the driver

    columns = list(rows[0])
    writers = [_text_writer(table.c[column].type) for column in columns]
    if not all(writers):
        return insert_ignoring_conflicts(session, table, rows)
    try:
        with session.begin_nested():
            data = _copy_text(columns, writers, rows)  # type: ignore[arg-type]
            _copy_into(session, table.name, columns, data)
    except psycopg.errors.IntegrityError:
        return _copy_ignoring_conflicts(session, table, rows)
    return {row["id"] for row in rows}


def _copy_into(session: Session, target: str, columns: list[str], data: bytes) -> None:
    """COPY `data` (rows in COPY's text format, written by `_copy_text`) into `target`:
    half the CPU of psycopg's `write_row`, which calls a Python dumper per UUID and
    `json.dumps` per JSON value."""
    cursor = psycopg_connection(session).cursor()
    with cursor.copy(f"COPY {target} ({', '.join(columns)}) FROM STDIN") as copy:
        copy.write(data)


Writer = Callable[[Any], str]
COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})
NEEDS_ESCAPE = re.compile(r"[\\\n\r\t]")


def _copy_text(columns: list[str], writers: list[Writer], rows: list[dict[str, Any]]) -> bytes:
    """The rows as COPY text: tab-separated fields, `\\N` for NULL, one line each."""
    lines = [
        "\t".join(
            [
                "\\N" if row[column] is None else write(row[column])
                for column, write in zip(columns, writers, strict=True)
            ]
        )
        for row in rows
    ]
    lines.append("")
    return "\n".join(lines).encode()


def _text_writer(column_type: TypeEngine[Any]) -> Writer | None:
    """How a value of the column's type is written in COPY text, if it is one of these."""
    if _is_json(column_type):
        return _json_text
    if isinstance(column_type, TypeDecorator):
        column_type = column_type.impl_instance
    if isinstance(column_type, Uuid):
        return _uuid_text
    if isinstance(column_type, DateTime):
        return _timestamp_text
    if isinstance(column_type, String):  # Text too
        return _escaped
    return None


def _is_json(column_type: TypeEngine[Any]) -> bool:
    """Whether a column holds JSON: `flywheel.db.JsonType` (a decorator) or a plain `JSON`."""
    if isinstance(column_type, TypeDecorator):
        column_type = column_type.impl_instance
    return isinstance(column_type, JSON)


def _escaped(value: str) -> str:
    """A text field: backslash, newline, carriage return and tab escaped, as COPY reads it."""
    return value.translate(COPY_ESCAPES) if NEEDS_ESCAPE.search(value) else value


def _json_text(value: Any) -> str:
    """JSON as orjson writes it (no raw control characters: they are escaped in strings);
    what orjson cannot write (an integer beyond 64 bits, a key that is not a string) as
    `json.dumps` writes it, as psycopg's `Jsonb` does."""
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        text = json.dumps(value)
    return _escaped(text)


def _uuid_text(value: uuid.UUID) -> str:
    return value.hex


@functools.lru_cache(maxsize=64)
def _timestamp_text(value: datetime) -> str:
    """ISO 8601 with its offset; cached, as a batch's rows share one timestamp."""
    return value.isoformat()
