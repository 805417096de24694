"""Writing compiled items: stage them in bulk, then upsert and retract with set-based SQL.

Items are buffered and written in chunks, JSON columns as JSON text. Per table:

- upsert: INSERT the new items; UPDATE the items the domain already holds (same content
  hash, written by this compiler) whose weight, `why` or provenance changed, so that a
  retracted item that is supported again comes back; leave an item another source stored
  as that source wrote it;
- retract the compiler's items of the recompiled prompts that the evidence no longer
  supports: weight 0 and `why` prefixed "retracted: ". Nothing is deleted, because dataset
  versions may reference the rows.

On PostgreSQL each chunk is COPYed into a temporary chunk table and upserted from there at
once, by one background thread, so that the server inserts one chunk while Python judges
the next (the thread and the evidence cursor share the transaction's connection, whose lock
takes their statements in turn). Every item is staged once per run, so upserting chunk by
chunk writes what one upsert of everything would. The staged content hashes are kept (for
a recompile) in a keys table that the retraction reads at the end. SQLite (small data)
stages everything with executemany and upserts at the end.
"""

from __future__ import annotations

import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

from sqlalchemy import ARRAY, Text, Uuid, any_, bindparam, column, select, text
from sqlalchemy import table as sql_table
from sqlalchemy.orm import Session

from flywheel.db import UtcDateTime, psycopg_connection
from flywheel.signals.store import SIGNAL_TABLES, retract

COMPILER_VERSION = "feedback-compiler/1"
OWN_VERSIONS = COMPILER_VERSION.split("/")[0] + "/%"  # any version of this compiler
OWN_ROWS = f"t.source_kind = 'feedback' AND t.ingestor_version LIKE '{OWN_VERSIONS}'"
STAGED_COMMON = ("source_ref", "group_key", "content_sha256", "redaction_report", "weight")
STAGED: dict[str, tuple[str, ...]] = {
    "preference_pairs": (
        *STAGED_COMMON,
        *("messages", "chosen", "rejected", "why"),
        *("tools", "chosen_tool_calls", "rejected_tool_calls"),
    ),
    "sft_examples": (*STAGED_COMMON, "messages", "completion", "tools", "completion_tool_calls"),
    "labeled_completions": (
        *STAGED_COMMON,
        *("messages", "completion", "is_desirable", "why"),
        *("tools", "completion_tool_calls"),
    ),
}
FLUSH_ROWS = 5_000
MAX_PENDING_CHUNKS = 2  # chunks queued for the background writer before `add` waits


@dataclass
class WriteCounts:
    inserted: int = 0
    updated: int = 0
    retracted: int = 0


def _staging(table: str) -> str:
    return f"compile_staging_{table}"


def _chunk(table: str) -> str:
    return f"compile_chunk_{table}"


class Writer:
    """Collects item rows (tuples in `STAGED[table]` order) and writes them in bulk; with
    `retract`, `finish` retracts what the recompiled groups no longer support.

    An item is staged once per run: when two prompts yield the same content (texts that
    differ only in what redaction removed, say), the first one staged is kept. Use it as a
    context manager: leaving waits for the background writer (PostgreSQL), so that nothing
    touches the connection after the transaction ends.
    """

    def __init__(
        self,
        session: Session,
        *,
        tenant_id: uuid.UUID,
        domain_id: uuid.UUID,
        now: datetime,
        retract: bool,
    ) -> None:
        self.session = session
        self.is_postgres = session.get_bind().dialect.name == "postgresql"
        self.retract = retract
        self.params = {"tenant": tenant_id, "domain": domain_id, "now": now}
        self.buffers: dict[str, list[tuple[Any, ...]]] = {table: [] for table in STAGED}
        self.group_keys: list[str] = []
        self.seen: set[str] = set()
        self.counts = WriteCounts()
        self.pending: deque[Future[tuple[int, int]]] = deque()
        self.pool: ThreadPoolExecutor | None = None
        if self.is_postgres:
            self.connection = psycopg_connection(session)  # the thread's: never the session
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-writer")
        for table in STAGED:
            self._create_staging(table)
        if retract and not self.is_postgres:
            self._create_staging("groups")

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

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

    def finish(self) -> WriteCounts:
        """Write what is left, wait for every chunk, then retract (if asked) and drop the
        staging tables."""
        for table in STAGED:
            self._flush(table)
        while self.pending:
            self._collect()
        if not self.is_postgres:
            self._finish_sqlite()
        if self.retract:
            for table in STAGED:
                self.counts.retracted += self._retract(table)
        for name in self._staging_tables():
            self.session.execute(text(f"DROP TABLE {name}"))
        return self.counts

    def _staging_tables(self) -> list[str]:
        if not self.is_postgres:
            return [_staging(table) for table in (*STAGED, *(["groups"] if self.retract else []))]
        keys = [_staging(table) for table in STAGED] if self.retract else []
        return [*(_chunk(table) for table in STAGED), *keys]

    def _flush(self, table: str) -> None:
        rows = self.buffers[table]
        if not rows:
            return
        self.buffers[table] = []
        if self.pool is None:
            self._write_sqlite(table, rows)
            return
        self.pending.append(self.pool.submit(self._store_chunk, table, rows))
        while len(self.pending) > MAX_PENDING_CHUNKS:
            self._collect()

    def _collect(self) -> None:
        """Wait for the oldest chunk; its failure is the compile's."""
        inserted, updated = self.pending.popleft().result()
        self.counts.inserted += inserted
        self.counts.updated += updated

    def _create_staging(self, table: str) -> None:
        """Column-for-column twins of the staged columns, without constraints: on PostgreSQL
        a chunk table, and a keys table for the retraction; on SQLite a staging table."""
        columns = ", ".join(_columns(table))
        source = "preference_pairs" if table == "groups" else table
        if self.is_postgres:
            twin = "CREATE TEMP TABLE {0} ON COMMIT DROP AS SELECT {1} FROM {2} WITH NO DATA"
            self.session.execute(text(twin.format(_chunk(table), columns, source)))
            if self.retract:
                self.session.execute(text(twin.format(_staging(table), "content_sha256", source)))
            return
        # pysqlite runs DDL outside the transaction: a failed run may have left one behind
        self.session.execute(text(f"DROP TABLE IF EXISTS temp.{_staging(table)}"))
        sql = f"CREATE TEMP TABLE {_staging(table)} AS SELECT {columns} FROM {source} WHERE 0"
        self.session.execute(text(sql))

    def _store_chunk(self, table: str, rows: list[tuple[Any, ...]]) -> tuple[int, int]:
        """(inserted, updated) for one chunk, on PostgreSQL (in the background thread: only
        the psycopg connection, never the session)."""
        with self.connection.cursor() as cursor:
            columns = ", ".join(STAGED[table])
            with cursor.copy(f"COPY {_chunk(table)} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cursor.execute(_upsert_sql(table, _chunk(table)), self.params)
            found = cursor.fetchone()
            if self.retract:
                cursor.execute(
                    f"INSERT INTO {_staging(table)} SELECT content_sha256 FROM {_chunk(table)}"
                )
            cursor.execute(f"TRUNCATE {_chunk(table)}")
        if found is None:
            raise RuntimeError("the upsert returned no counts")
        return int(found[0]), int(found[1])

    def _write_sqlite(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:  # pysqlite reads an empty executemany as one row with no values
            return
        columns = _columns(table)
        marks = ", ".join("?" for _ in columns)
        self.session.connection().exec_driver_sql(
            f"INSERT INTO {_staging(table)} ({', '.join(columns)}) VALUES ({marks})", rows
        )

    def _finish_sqlite(self) -> None:
        """The upserts of everything staged, then the recompiled group keys to retract in."""
        for table in STAGED:
            sets, changed = _refreshed(table, "s", is_postgres=False)
            self.counts.updated += self._execute(
                f"UPDATE {table} AS t SET {sets} FROM {_staging(table)} AS s "
                f"WHERE t.domain_id = :domain AND t.content_sha256 = s.content_sha256 "
                f"AND {changed}"
            ).rowcount
            insert = _insert_sql(table, _staging(table), new_id="lower(hex(randomblob(16)))")
            self.counts.inserted += self._execute(
                insert.format(now=":now", tenant=":tenant", domain=":domain")
                + "ON CONFLICT DO NOTHING"
            ).rowcount
        if self.retract:
            self._write_sqlite("groups", [(key,) for key in self.group_keys])

    def _execute(self, sql: str) -> Any:
        types: dict[str, Any] = {"tenant": Uuid(), "domain": Uuid(), "now": UtcDateTime()}
        used = [name for name in types if f":{name}" in sql]
        statement = text(sql).bindparams(*(bindparam(name, type_=types[name]) for name in used))
        return self.session.execute(statement, {name: self.params[name] for name in used})

    def _retract(self, name: str) -> int:
        """Retract the compiler's items of the recompiled groups that were not staged this
        time. On PostgreSQL the group keys are an array, so that the lookup is an index
        condition rather than a join planned on statistics."""
        table = SIGNAL_TABLES[name]
        if self.is_postgres:
            groups = bindparam("groups", self.group_keys, type_=ARRAY(Text()))
            in_groups = table.c.group_key == any_(groups)
        else:
            staged_groups = sql_table(_staging("groups"), column("group_key"))
            in_groups = table.c.group_key.in_(select(staged_groups.c.group_key))
        staged = sql_table(_staging(name), column("content_sha256"))
        return retract(
            self.session,
            table,
            table.c.domain_id == self.params["domain"],
            table.c.source_kind == "feedback",
            table.c.ingestor_version.like(OWN_VERSIONS),
            in_groups,
            table.c.content_sha256.not_in(select(staged.c.content_sha256)),
        )


def _insert_sql(table: str, source: str, *, new_id: str) -> str:
    """New items in content-hash order (the unique index then grows in order); `{now}`,
    `{tenant}` and `{domain}` are left for the driver's parameter marks."""
    staged = ", ".join(STAGED[table])
    return (
        f"INSERT INTO {table} AS t (id, created_at, tenant_id, domain_id, source_kind, "
        f"ingestor_version, {staged}) "
        f"SELECT {new_id}, {{now}}, {{tenant}}, {{domain}}, 'feedback', "
        f"'{COMPILER_VERSION}', {staged} FROM {source} WHERE true ORDER BY content_sha256 "
    )


def _upsert_sql(table: str, source: str) -> str:
    """(inserted, updated) of one `INSERT ... ON CONFLICT DO UPDATE`: it finds each existing
    item through the unique index, whatever the table statistics say (a join planned on the
    stale statistics of a freshly filled table was 100x slower)."""
    sets, changed = _refreshed(table, "excluded", is_postgres=True)
    changed = changed.replace("%", "%%")  # the LIKE pattern, among psycopg's parameter marks
    upsert = (
        _insert_sql(table, source, new_id="gen_random_uuid()").format(
            now="%(now)s", tenant="%(tenant)s", domain="%(domain)s"
        )
        + f"ON CONFLICT (domain_id, content_sha256) DO UPDATE SET {sets} "
        + f"WHERE {changed} RETURNING (xmax = 0) AS is_new"
    )
    return (
        f"WITH upserted AS ({upsert}) SELECT count(*) FILTER (WHERE is_new), "
        "count(*) FILTER (WHERE NOT is_new) FROM upserted"
    )


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
