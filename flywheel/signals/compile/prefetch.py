"""A head start on redaction while the server aggregates the evidence.

The evidence query of a full compile sorts and aggregates every event of the domain before
its first row comes back; until then the compiler's Python sits idle (measured on the
benchmark's 200k events, on a loaded 2-core machine: the first row after 3-6 s; finding the
spans of all 113k distinct texts, 2.3 s of CPU).
So, meanwhile, a thread reads the domain's texts on a connection of its own (the
conversations and responses of the interactions with feedback, the corrections' texts and the
comparisons' responses) and finds their PII spans (`find_spans`, the expensive part of
redaction) into the compile's `Texts` cache, until the first evidence row arrives. The
server's query and the thread's Python then run on two cores at once.

Finds are a pure function of the text, so the cache holds nothing a compile would not compute
itself: surrogates (scoped per conversation) are still drawn by the compiler, the thread reads
only the compiled tenant's domain, and whatever it did not reach is found as before. A failure
here (no second connection) costs only the head start. A partial compile (a recompile, a
forget) warms only the name lists redaction loads once per process.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import orjson
import psycopg
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from flywheel.redaction import find_spans, warm
from flywheel.signals.compile.items import TEXT_CACHE_SIZE, Texts
from flywheel.signals.message_texts import map_texts

logger = logging.getLogger(__name__)

PREFETCH_LIMIT = TEXT_CACHE_SIZE // 2  # leave the compile room before its cache is emptied
FETCH_ROWS = 2_000
# Interactions with feedback only: the gateway records every call, and most get none.
TEXTS_SQL = """
SELECT i.messages::text, i.response, NULL::jsonb FROM interactions i
WHERE i.tenant_id = %(tenant)s AND i.domain_id = %(domain)s
  AND EXISTS (SELECT 1 FROM feedback_events e WHERE e.interaction_id = i.id)
"""
EVENT_TEXTS_SQL = """
SELECT NULL::text, CASE WHEN kind = 'correction' THEN value ->> 'text' END,
       CASE WHEN kind = 'comparison' THEN value -> 'responses' END
FROM feedback_events
WHERE tenant_id = %(tenant)s AND domain_id = %(domain)s AND kind IN ('correction', 'comparison')
"""


class Prefetch:
    """A context manager around the compile: starts the thread, `stop()` when the evidence
    starts to arrive, joined on leaving."""

    def __init__(
        self,
        engine: Engine,
        texts: Texts,
        tenant_id: uuid.UUID,
        domain_id: uuid.UUID,
        *,
        full: bool,
    ) -> None:
        self.engine = engine
        self.texts = texts
        self.params = {"tenant": tenant_id, "domain": domain_id}
        self.is_full = full and engine.dialect.name == "postgresql"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="compile-prefetch", daemon=True)

    def __enter__(self) -> Prefetch:
        self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
        self.thread.join()

    def stop(self) -> None:
        self.stopping.set()

    def rows(self, rows: Iterator[Any]) -> Iterator[Any]:
        """`rows`, stopping the thread (and waiting for it) once the first has come."""
        for row in rows:
            if not self.stopping.is_set():
                self.stop()
                self.thread.join()
            yield row

    def _run(self) -> None:
        warm()
        if not self.is_full or self.stopping.is_set():
            return
        try:
            self._prefetch()
        except (psycopg.Error, SQLAlchemyError) as error:  # only the head start is lost
            logger.info("compile prefetch stopped: %s", error)

    def _prefetch(self) -> None:
        own = create_engine(self.engine.url, poolclass=NullPool)
        try:
            connection = own.raw_connection()
            driver = connection.driver_connection
            try:
                for sql in (TEXTS_SQL, EVENT_TEXTS_SQL):
                    if driver is None or not self._find_in(driver, sql):
                        return
            finally:
                connection.close()
        finally:
            own.dispose()

    def _find_in(self, connection: psycopg.Connection[Any], sql: str) -> bool:
        """Find the spans of the query's texts; False once told to stop (or the cache is full)."""
        finds = self.texts.finds
        with connection.cursor(name="compile_prefetch") as cursor:
            cursor.itersize = FETCH_ROWS
            cursor.execute(sql, self.params)
            for row in cursor:
                for raw in _row_texts(*row):
                    if self.stopping.is_set() or len(finds) >= PREFETCH_LIMIT:
                        return False
                    if raw not in finds:
                        finds[raw] = find_spans(raw)
        return True


def _row_texts(messages_json: str | None, text: str | None, more: Any) -> Iterator[str]:
    """The texts of a row: every text of a conversation (as `items._prompt` redacts them), a
    response or correction, a comparison's responses."""
    if messages_json is not None:
        seen: list[str] = []

        def collect(raw: str) -> str:
            seen.append(raw)
            return raw

        for message in orjson.loads(messages_json):
            if isinstance(message, dict):
                map_texts(message, collect)
        yield from seen
    if text is not None:
        yield text
    if isinstance(more, list):
        yield from (item for item in more if isinstance(item, str))
