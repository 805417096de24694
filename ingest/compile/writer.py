"""Writing compiled items: stage them in bulk, then upsert and retract with set-based SQL.

Items go into per-transaction staging tables (`COPY` on PostgreSQL, executemany on SQLite),
JSON columns as JSON text. Then, per table:

- upsert: INSERT the new items; UPDATE the items the domain already holds (same content
  hash, written by this compiler) whose weight, `why` or provenance changed, so that a
  retracted item that is supported again comes back; leave an item another source stored
  as that source wrote it;
- retract the compiler's items of the recompiled prompts that the evidence no longer
  supports: weight 0 and `why` prefixed "retracted: ". Nothing is deleted, because dataset
  versions may reference the rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, Text, Uuid, bindparam, text
from sqlalchemy.orm import Session

from flywheel.db import UtcDateTime
from ingest.compile.evidence import psycopg_connection

COMPILER_VERSION = "feedback-compiler/1"
OWN_ROWS = "t.source_kind = 'feedback' AND t.ingestor_version LIKE 'feedback-compiler/%'"
STAGED_COMMON = ("source_ref", "group_key", "content_sha256", "redaction_report", "weight")
STAGED: dict[str, tuple[str, ...]] = {
    "preference_pairs": (*STAGED_COMMON, "messages", "chosen", "rejected", "why"),
    "sft_examples": (*STAGED_COMMON, "messages", "completion"),
    "labeled_completions": (*STAGED_COMMON, "messages", "completion", "is_desirable", "why"),
}
FLUSH_ROWS = 20_000


@dataclass
class WriteCounts:
    inserted: int = 0
    updated: int = 0
    retracted: int = 0


def _staging(table: str) -> str:
    return f"compile_staging_{table}"


class Writer:
    """Collects item rows (tuples in `STAGED[table]` order) and writes them in bulk.

    An item is staged once per run: when two prompts yield the same content (texts that
    differ only in what redaction removed, say), the first one staged is kept.
    """

    def __init__(
        self, session: Session, *, tenant_id: uuid.UUID, domain_id: uuid.UUID, now: datetime
    ) -> None:
        self.session = session
        self.is_postgres = session.get_bind().dialect.name == "postgresql"
        self.params = {"tenant": tenant_id, "domain": domain_id, "now": now}
        self.buffers: dict[str, list[tuple[Any, ...]]] = {table: [] for table in STAGED}
        self.group_keys: list[str] = []
        self.seen: set[str] = set()
        self.staged = dict.fromkeys(STAGED, 0)
        for table in (*STAGED, "groups"):
            self._create_staging(table)

    def add(self, table: str, row: tuple[Any, ...]) -> bool:
        """Stage one item; False when the run already staged its content."""
        content_sha256 = row[2]
        if content_sha256 in self.seen:
            return False
        self.seen.add(content_sha256)
        buffer = self.buffers[table]
        buffer.append(row)
        if len(buffer) >= FLUSH_ROWS:
            self._flush(table)
        return True

    def add_group(self, group_key: str) -> None:
        self.group_keys.append(group_key)

    def finish(self, *, retract: bool) -> WriteCounts:
        """Move the staged items into the tables; with `retract`, retract what the recompiled
        groups no longer support. Drops the staging tables."""
        for table in STAGED:
            self._flush(table)
        counts = WriteCounts()
        if retract and not self.is_postgres:
            self._write("groups", [(key,) for key in self.group_keys])
        for table in STAGED:
            if self.staged[table]:
                inserted, updated = self._upsert(table)
                counts.inserted += inserted
                counts.updated += updated
            if retract:
                counts.retracted += self._retract(table)
        for table in (*STAGED, "groups"):
            self.session.execute(text(f"DROP TABLE {_staging(table)}"))
        return counts

    def _flush(self, table: str) -> None:
        rows = self.buffers[table]
        if rows:
            self._write(table, rows)
            self.staged[table] += len(rows)
            self.buffers[table] = []

    def _create_staging(self, table: str) -> None:
        """A column-for-column twin of the staged columns, without constraints."""
        columns = ", ".join(_columns(table))
        source = "preference_pairs" if table == "groups" else table
        if self.is_postgres:
            sql = (
                f"CREATE TEMP TABLE {_staging(table)} ON COMMIT DROP AS "
                f"SELECT {columns} FROM {source} WITH NO DATA"
            )
        else:
            # pysqlite runs DDL outside the transaction: a failed run may have left one behind
            self.session.execute(text(f"DROP TABLE IF EXISTS temp.{_staging(table)}"))
            sql = f"CREATE TEMP TABLE {_staging(table)} AS SELECT {columns} FROM {source} WHERE 0"
        self.session.execute(text(sql))

    def _write(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        columns = _columns(table)
        if not self.is_postgres:
            marks = ", ".join("?" for _ in columns)
            self.session.connection().exec_driver_sql(
                f"INSERT INTO {_staging(table)} ({', '.join(columns)}) VALUES ({marks})", rows
            )
            return
        with (
            psycopg_connection(self.session).cursor() as cursor,
            cursor.copy(f"COPY {_staging(table)} ({', '.join(columns)}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)

    def _execute(self, sql: str) -> Any:
        types: dict[str, Any] = {
            "tenant": Uuid(),
            "domain": Uuid(),
            "now": UtcDateTime(),
            "groups": ARRAY(Text()),
        }
        params = {**self.params, "groups": self.group_keys}
        used = [name for name in types if f":{name}" in sql]
        statement = text(sql).bindparams(*(bindparam(name, type_=types[name]) for name in used))
        return self.session.execute(statement, {name: params[name] for name in used})

    def _upsert(self, table: str) -> tuple[int, int]:
        """(inserted, updated). New items go in in content-hash order (the unique index then
        grows in order); the compiler's own existing items get the new weight, `why` and
        provenance where those changed. On PostgreSQL one `INSERT ... ON CONFLICT DO UPDATE`
        finds each existing item through the unique index, whatever the table statistics say
        (a join planned on the stale statistics of a freshly filled table was 100x slower)."""
        staged = ", ".join(STAGED[table])
        insert = (
            f"INSERT INTO {table} AS t (id, created_at, tenant_id, domain_id, source_kind, "
            f"ingestor_version, {staged}) "
            f"SELECT {{new_id}}, :now, :tenant, :domain, 'feedback', '{COMPILER_VERSION}', "
            f"{staged} FROM {_staging(table)} WHERE true ORDER BY content_sha256 "
        )
        if self.is_postgres:
            sets, changed = _refreshed(table, "excluded", is_postgres=True)
            upsert = (
                insert.format(new_id="gen_random_uuid()")
                + f"ON CONFLICT (domain_id, content_sha256) DO UPDATE SET {sets} "
                + f"WHERE {changed} RETURNING (xmax = 0) AS is_new"
            )
            result = self._execute(
                f"WITH upserted AS ({upsert}) SELECT count(*) FILTER (WHERE is_new), "
                "count(*) FILTER (WHERE NOT is_new) FROM upserted"
            )
            inserted, updated = result.one()
            return int(inserted), int(updated)
        sets, changed = _refreshed(table, "s", is_postgres=False)
        updated = self._execute(
            f"UPDATE {table} AS t SET {sets} FROM {_staging(table)} AS s "
            f"WHERE t.domain_id = :domain AND t.content_sha256 = s.content_sha256 AND {changed}"
        ).rowcount
        inserted = self._execute(
            insert.format(new_id="lower(hex(randomblob(16)))") + "ON CONFLICT DO NOTHING"
        ).rowcount
        return int(inserted), int(updated)

    def _retract(self, table: str) -> int:
        """Weight 0 and "retracted: " for the compiler's items of the recompiled groups that
        were not staged this time. On PostgreSQL the group keys are an array, so that the
        lookup is an index condition rather than a join planned on statistics."""
        why = ", why = substr('retracted: ' || t.why, 1, 255)" if "why" in STAGED[table] else ""
        groups = (
            "t.group_key = ANY(:groups)"
            if self.is_postgres
            else f"t.group_key IN (SELECT group_key FROM {_staging('groups')})"
        )
        result = self._execute(
            f"UPDATE {table} AS t SET weight = 0{why} "
            f"WHERE t.domain_id = :domain AND {OWN_ROWS} AND t.weight > 0 AND {groups} "
            f"AND t.content_sha256 NOT IN (SELECT content_sha256 FROM {_staging(table)})"
        )
        return int(result.rowcount)


def _refreshed(table: str, new: str, is_postgres: bool) -> tuple[str, str]:
    """(SET list, condition) refreshing one of the compiler's own items from the row `new`
    where its weight, `why` or provenance changed."""
    columns = ["weight", "source_ref", *(["why"] if "why" in STAGED[table] else [])]
    differs = "IS DISTINCT FROM" if is_postgres else "IS NOT"  # both NULL-safe
    sets = ", ".join(f"{column} = {new}.{column}" for column in columns)
    changed = " OR ".join(f"t.{column} {differs} {new}.{column}" for column in columns)
    return sets, f"{OWN_ROWS} AND ({changed})"


def _columns(table: str) -> tuple[str, ...]:
    return STAGED.get(table, ("group_key",))
