"""Recording every served call as an interaction, without slowing the answer.

The gateway hands each call to `Recorder.submit` (sync, O(1), never blocks, never raises): it
goes into a bounded in-memory queue. A background task takes the queue in batches (up to
`batch_size` records, or what came within `flush_interval_ms` of the first one) and writes
each batch off the event loop (`asyncio.to_thread`) in one transaction: one query checks that
every record's domain belongs to its tenant (a record whose domain is not its tenant's is
dropped and counted, never written), then one set-based insert (`COPY` on PostgreSQL, one
multi-row INSERT on SQLite; `flywheel.bulk.insert_ignoring_conflicts`) that skips ids already
stored.

Before anything is written or spooled, the conversation, the response, its tool calls'
arguments, tool results and the error are redacted as the feedback compiler redacts them
(what `flywheel.redaction.redact` does, on every text `flywheel.signals.message_texts`
reaches, with the conversation's compile group key as the scope of its surrogates: the stored
conversation is the one compile would store); each record's report (how many of each type were
replaced) goes to the interaction's `metadata["redaction"]`. Redaction runs on the writer's
thread, which gives the GIL up between records (the event loop waits for it at most one
record's redaction, not the 5 ms switch interval), and remembers the finds of texts it saw
lately (`SpanCache`): a chat resends its history with every turn.

The interaction id is the caller's: the gateway returns it to the app before the row exists.
Feedback that arrives for it before the batch is written is answered as for any unknown
interaction — `POST /v1/feedback` returns 404 `not_found` — until the row lands, within about
`flush_interval_ms` plus one write; an app that rates at once retries. `flush()` writes
everything submitted so far (tests wait on it).

When the database cannot take a batch (a connection or server error), the batch goes to the
spool (`flywheel.inference.spool`): a bounded JSONL file, fsync'd per batch. When the queue is
full, records skip the database and go to the spool too; when the spool is full, they are
dropped and counted. After the next successful write (and at start, and every
`retry_interval_s` while the spool holds lines), spooled rows are written back a chunk at a
time, idempotently by id. A batch the database refuses for its data (an integrity or data
error) is written row by row in the same transaction, each row in a savepoint, and only the
refused rows are dropped and counted.

What is only in memory (the queue, a batch being written) dies with the process; `aclose()`,
on shutdown, writes or spools all of it. The gateway starts the recorder in its lifespan
(`await recorder.start()`), closes it there (`await recorder.aclose()`), and registers
`recorder_collector(recorder)` in its own metrics registry.

Counters (`.counters`, and `recorder_collector(recorder)` for a Prometheus registry):
recorded, spooled, replayed, dropped (by reason in `.dropped`), duplicates (ids already
stored), spool_bytes, queue_depth.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import Table, select
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from flywheel.bulk import insert_ignoring_conflicts
from flywheel.feedback.models import Interaction
from flywheel.inference.row_worker import RowWorker
from flywheel.inference.spool import MIB, Spool, decode_rows, encode_row
from flywheel.redaction import Span, Surrogates, apply, find_spans
from flywheel.redaction.keys import redaction_key
from flywheel.settings import Settings
from flywheel.signals.compile.items import group_key_of
from flywheel.signals.message_texts import map_texts
from flywheel.tenancy.models import Domain

log = logging.getLogger(__name__)

INTERACTIONS: Table = Interaction.__table__  # type: ignore[assignment]
ReleaseRole = Literal["champion", "challenger", "pinned", "base", "shadow"]
CallStatus = Literal["ok", "failed"]
Row = dict[str, Any]
DROP_REASONS = (
    "queue_full",  # the queue and the spool's queue were both full
    "spool_full",
    "spool_failed",  # the spool could not be written (a disk error)
    "foreign_domain",  # the record's domain is not its tenant's
    "refused",  # the database refused the row for its data
    "torn",  # a spooled line a crash cut short
    "closed",  # submitted after aclose()
    "unexpected",  # a record that could not be made a row
)


@dataclass(frozen=True)
class CallRecord:
    """One call the gateway served (or failed to), as the caller saw it, unredacted."""

    interaction_id: uuid.UUID
    tenant_id: uuid.UUID
    domain_id: uuid.UUID
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    response: str
    response_tool_calls: list[dict[str, Any]] | None
    model_name: str | None
    model_version: str | None  # None: the base model
    adapter: str | None
    release_role: ReleaseRole
    end_user: str
    status: CallStatus
    error: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float
    ttft_ms: float | None
    created_at: datetime


class Recorder:
    """Records calls in the background (see the module's docstring). `submit` is called on
    the event loop's thread; `start`, `flush` and `aclose` are awaited on the same loop."""

    def __init__(
        self,
        sessions: Callable[[], Session],
        settings: Settings,
        *,
        batch_size: int = 500,
        flush_interval_ms: float = 50.0,
        queue_size: int = 10_000,
        retry_interval_s: float = 5.0,
        redact_in_child: bool = False,
    ) -> None:
        self.sessions = sessions
        self._worker = RowWorker(redaction_key()) if redact_in_child else None
        self.spool = Spool(
            settings.resolved_gateway_spool_path, int(settings.gateway_spool_max_mb * MIB)
        )
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_ms / 1000
        self.queue_size = queue_size
        self.retry_interval_s = retry_interval_s
        self._queue: deque[CallRecord] = deque()
        self._overflow: deque[CallRecord] = deque()  # the queue was full: to the spool
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._is_closed = False
        self._failed_at: float | None = None  # when the database last failed a write
        self._is_replaying = False  # a chunk was replayed and more are spooled
        self._spans = SpanCache()  # the writer thread's
        self._counts_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    async def start(self) -> None:
        """Start the background writer; it first replays what an earlier run spooled."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="flywheel-recorder")

    def submit(self, record: CallRecord) -> None:
        """Queue `record`: O(1), never blocks, never raises."""
        try:
            if self._is_closed:
                self._drop("closed", 1, quiet=True)
            elif len(self._queue) < self.queue_size:
                self._queue.append(record)
                if len(self._queue) >= self.batch_size:
                    self._full.set()
            elif len(self._overflow) < self.queue_size:
                self._overflow.append(record)
                self._full.set()
            else:
                self._drop("queue_full", 1, quiet=True)  # the spool's queue is full too
            self._wake.set()
        except Exception:  # never let recording fail a call
            log.exception("could not queue a call record")
            self._drop("unexpected", 1, quiet=True)

    async def flush(self, *, replay: bool = True) -> None:
        """Write (or spool) everything submitted so far, trying the database even if it was
        down a moment ago; with `replay`, also write back what the spool holds, if it can."""
        # Try now: also in a background step that has the lock before this flush does (it
        # takes what was submitted, and would spool it while a failure was recent).
        self._failed_at = None
        async with self._write_lock:
            self._failed_at = None  # again: that step may have failed meanwhile
            while self._queue or self._overflow:
                await self._step(replay=replay)
            while replay and self._is_database_up() and self.spool.has_lines():
                if not await asyncio.to_thread(self._replay_chunk):
                    break

    async def aclose(self) -> None:
        """Stop the writer: what is queued is written, or spooled when the database refuses."""
        self._is_closed = True
        self._wake.set()
        self._full.set()
        if self._task is not None:  # it ends after its step: a write is never cut short
            await self._task
            self._task = None
        await self.flush(replay=False)
        self.spool.close()
        if self._worker is not None:
            await asyncio.to_thread(self._worker.close)

    @property
    def counters(self) -> dict[str, int]:
        with self._counts_lock:
            counts = {name: self._counts[name] for name in ("recorded", "spooled", "replayed")}
            counts["dropped"] = sum(self.dropped.values())
            counts["duplicates"] = self._counts["duplicates"]
        counts["spool_bytes"] = self.spool.size_bytes()
        counts["queue_depth"] = len(self._queue) + len(self._overflow)
        return counts

    # The background task, on the event loop.

    async def _run(self) -> None:
        self._is_replaying = self.spool.has_lines()  # an earlier run's spool, first
        while not self._is_closed:
            try:
                await self._next_batch()
                async with self._write_lock:
                    await self._step(replay=not self._is_closed)
            except Exception:  # a bug must not end recording: log, and go on
                log.exception("the call recorder's writer failed a step")
                await asyncio.sleep(self.flush_interval_s)

    async def _next_batch(self) -> None:
        """Wait for a record (not while a replay is under way; with lines spooled and the
        database down, until the next retry), then up to the flush interval for a full batch."""
        if self._is_closed:
            return
        if not self._queue and not self._overflow:
            if self._is_replaying:
                await asyncio.sleep(0)  # one chunk a step: calls queued meanwhile go in between
                return
            self._wake.clear()
            timeout = self.retry_interval_s if self.spool.has_lines() else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        if self._queue and len(self._queue) < self.batch_size and not self._overflow:
            self._full.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.flush_interval_s)

    async def _step(self, *, replay: bool) -> None:
        batch = _take(self._queue, self.batch_size)
        spill = _take(self._overflow, self.batch_size)
        await asyncio.to_thread(self._write_step, batch, spill, replay)

    def _is_database_up(self) -> bool:
        """Up, or down long enough ago to try again: while it is down, batches go straight to
        the spool instead of each waiting for a connection to fail."""
        failed_at = self._failed_at
        return failed_at is None or time.monotonic() - failed_at >= self.retry_interval_s

    # The writer, on a worker thread: one step at a time (the write lock).

    def _write_step(self, batch: list[CallRecord], spill: list[CallRecord], replay: bool) -> None:
        if spill:
            self._spool_rows(self._rows(spill))
        rows = self._rows(batch)
        if rows and self._is_database_up():
            self._write_rows(rows, counter="recorded")
        elif rows:
            self._spool_rows(rows)
        self._is_replaying = False
        if replay and self._is_database_up() and self.spool.has_lines():
            self._is_replaying = self._replay_chunk() and self.spool.has_lines()

    def _rows(self, records: list[CallRecord]) -> list[Row]:
        """The records' rows, redacted (by the child process with `redact_in_child`, else or
        when it fails, here); a record that cannot be made one is dropped, counted."""
        made = self._worker.rows(records) if self._worker is not None and records else None
        if made is None:
            return self._rows_here(records)
        self._drop("unexpected", made.count(None))
        return [row for row in made if row is not None]

    def _rows_here(self, records: list[CallRecord]) -> list[Row]:
        rows = []
        for record in records:
            # Redacting holds the GIL; giving it up between records lets the event loop in at
            # once, instead of after the interpreter's 5 ms switch interval.
            time.sleep(0)
            try:
                rows.append(interaction_row(record, self._spans))
            except Exception:  # a malformed record must not lose the rest of its batch
                log.exception("could not make a call record an interaction row")
                self._drop("unexpected", 1)
        return rows

    def _write_rows(self, rows: list[Row], *, counter: str) -> bool:
        """Write `rows` in one transaction; spool them when the database cannot. Whether the
        database took them."""
        try:
            stored = self._store(rows)
        except Exception as error:  # the database is down, or something else broke: keep them
            log.warning("could not write %d call records; spooling them: %s", len(rows), error)
            self._failed_at = time.monotonic()
            self._spool_rows(rows)
            return False
        self._failed_at = None
        self._count_stored(stored, len(rows), counter=counter)
        return True

    def _store(self, rows: list[Row]) -> _Stored:
        """Write `rows` in one transaction, set-based; when the database refuses the batch for
        its data, again in one transaction, row by row (each in a savepoint), leaving out the
        refused ones. Raises what a database that is down raises."""
        try:
            with self.sessions() as session, session.begin():
                kept = _tenants_own(session, rows)
                inserted = len(insert_ignoring_conflicts(session, INTERACTIONS, kept))
            return _Stored(inserted, len(rows) - len(kept))
        except (IntegrityError, DataError):
            pass
        refused = inserted = 0
        with self.sessions() as session, session.begin():
            kept = _tenants_own(session, rows)
            for row in kept:
                try:
                    with session.begin_nested():
                        inserted += len(insert_ignoring_conflicts(session, INTERACTIONS, [row]))
                except (IntegrityError, DataError) as error:
                    log.error("the database refused call record %s: %s", row["id"], error)
                    refused += 1
        return _Stored(inserted, len(rows) - len(kept), refused)

    def _count_stored(self, stored: _Stored, submitted: int, *, counter: str) -> None:
        self._count(counter, stored.inserted)
        self._count("duplicates", submitted - stored.inserted - stored.foreign - stored.refused)
        self._drop("foreign_domain", stored.foreign)
        self._drop("refused", stored.refused)

    def _spool_rows(self, rows: list[Row]) -> None:
        try:
            appended = self.spool.append([encode_row(row) for row in rows])
        except OSError:
            log.exception("could not spool %d call records", len(rows))
            self._drop("spool_failed", len(rows))
            return
        self._count("spooled", appended)
        self._drop("spool_full", len(rows) - appended)

    def _replay_chunk(self) -> bool:
        """Write back one chunk of the spool; whether one was written."""
        chunk = self.spool.next_chunk(self.batch_size)
        if chunk is None:
            return False
        rows, torn = decode_rows(chunk.lines, ROW_COLUMNS)
        if rows:
            try:
                stored = self._store(rows)
            except Exception as error:  # still down: the chunk stays, for the next attempt
                log.warning("replaying the spool failed; it stays for later: %s", error)
                self._failed_at = time.monotonic()
                return False
            self._failed_at = None
            self._count_stored(stored, len(rows), counter="replayed")
        self._drop("torn", chunk.torn + torn)
        self.spool.done(chunk)
        return True

    def _count(self, name: str, amount: int) -> None:
        if amount:
            with self._counts_lock:
                self._counts[name] += amount

    def _drop(self, reason: str, amount: int, *, quiet: bool = False) -> None:
        """Count dropped records; logged unless `quiet` (a call's own path: an overloaded
        gateway would log once per call; the counters tell)."""
        if amount:
            with self._counts_lock:
                self.dropped[reason] += amount
            if not quiet:
                log.warning("dropped %d call records (%s)", amount, reason)


@dataclass(frozen=True)
class _Stored:
    inserted: int
    foreign: int  # left out: the record's domain is not its tenant's
    refused: int = 0  # left out: the database refused the row for its data


def _take(queue: deque[CallRecord], limit: int) -> list[CallRecord]:
    return [queue.popleft() for _ in range(min(limit, len(queue)))]


def _tenants_own(session: Session, rows: list[Row]) -> list[Row]:
    """The rows whose domain belongs to their tenant (one query for the batch)."""
    domain_ids = {row["domain_id"] for row in rows}
    query = select(Domain.id, Domain.tenant_id).where(Domain.id.in_(domain_ids))
    owners: dict[uuid.UUID, uuid.UUID] = dict(session.execute(query).all())
    return [row for row in rows if owners.get(row["domain_id"]) == row["tenant_id"]]


# Rows: redacted, as written and as spooled.


def interaction_row(
    record: CallRecord,
    spans: Callable[[str], list[Span]] = find_spans,
    *,
    key: bytes | None = None,
) -> Row:
    """The `interactions` row of a call: its texts redacted (`spans` finds what to replace: a
    `SpanCache` remembers; `key` keys surrogates, `redaction_key()` when None), the report in
    its metadata."""
    messages_json = orjson.dumps(record.messages).decode()
    redactor = _Redactor(group_key_of(messages_json), spans, key or redaction_key())
    messages = [map_texts(message, redactor) for message in record.messages]
    response = redactor(record.response)
    tool_calls = _redacted_tool_calls(record.response_tool_calls, redactor)
    error = None if record.error is None else redactor(record.error)
    content = {
        "messages": messages,
        "tools": record.tools,
        "response": response,
        "response_tool_calls": tool_calls,
    }
    return {
        "id": record.interaction_id,
        "created_at": record.created_at,
        "tenant_id": record.tenant_id,
        "domain_id": record.domain_id,
        **content,
        "model_name": record.model_name,
        "model_version": record.model_version,
        "adapter": record.adapter,
        "session_id": None,
        "metadata": {"source": "gateway", "redaction": redactor.report()},
        "idempotency_key": None,
        "request_sha256": hashlib.sha256(
            orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
        ).hexdigest(),
        "release_role": record.release_role,
        "end_user": record.end_user[:255],
        "status": record.status,
        "error": error,
        "finish_reason": None if record.finish_reason is None else record.finish_reason[:32],
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "latency_ms": record.latency_ms,
        "ttft_ms": record.ttft_ms,
    }


class SpanCache:
    """`find_spans` of texts seen lately: a chat resends its whole history with every turn, so
    most texts of a call were scanned before. Keyed by a digest of the text, never the text
    (no PII kept in memory); emptied when it holds `size` entries. One thread at a time."""

    def __init__(self, size: int = 50_000) -> None:
        self.size = size
        self._found: dict[bytes, list[Span]] = {}

    def __call__(self, text: str) -> list[Span]:
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= self.size:
                self._found.clear()
            found = self._found[key] = find_spans(text)
        return found


class _Redactor:
    """`redact` on each text of one call, in the scope of its conversation, summing counts."""

    def __init__(self, scope: str, spans: Callable[[str], list[Span]], key: bytes) -> None:
        self.spans = spans
        self.surrogates = Surrogates(key, scope)
        self.counts: Counter[str] = Counter()

    def __call__(self, text: str) -> str:
        # NUL cannot be stored in PostgreSQL text or JSONB, and means nothing in a conversation.
        text = text.replace("\x00", "")
        spans = self.spans(text)
        if not spans:
            return text
        redaction = apply(text, spans, self.surrogates)
        self.counts.update(redaction.counts)
        return redaction.text

    def report(self) -> dict[str, Any]:
        return {"total": sum(self.counts.values()), "counts": dict(self.counts)}


def _redacted_tool_calls(
    calls: list[dict[str, Any]] | None, redactor: _Redactor
) -> list[dict[str, Any]] | None:
    if calls is None:
        return None
    redacted: list[dict[str, Any]] = map_texts({"tool_calls": calls}, redactor)["tool_calls"]
    return redacted


# The columns `interaction_row` fills: every one of `interactions`.
ROW_COLUMNS = frozenset(INTERACTIONS.c.keys())


class RecorderCollector:
    """The recorder's counters as Prometheus metrics, read at each scrape: register it in the
    gateway app's own registry (`registry.register(RecorderCollector(recorder))`), so app
    instances never share, or doubly register, a collector."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Metric]:
        counts = self.recorder.counters
        for name, help_text in COUNTER_HELP.items():
            yield CounterMetricFamily(f"flywheel_gateway_records_{name}", help_text, counts[name])
        dropped = CounterMetricFamily(
            "flywheel_gateway_records_dropped",
            "Call records dropped, never written, by reason.",
            labels=["reason"],
        )
        for reason in DROP_REASONS:
            dropped.add_metric([reason], self.recorder.dropped[reason])
        yield dropped
        yield GaugeMetricFamily(
            "flywheel_gateway_spool_bytes",
            "Bytes of call records spooled and not yet replayed.",
            counts["spool_bytes"],
        )
        yield GaugeMetricFamily(
            "flywheel_gateway_record_queue_depth",
            "Call records queued in memory, not yet written or spooled.",
            counts["queue_depth"],
        )


COUNTER_HELP = {
    "recorded": "Call records written to the database as they came.",
    "spooled": "Call records written to the spool (the database or the queue could not take them).",
    "replayed": "Spooled call records written back to the database.",
    "duplicates": "Call records whose interaction id was already stored (skipped).",
}


def recorder_collector(recorder: Recorder) -> RecorderCollector:
    """A collector for `recorder`, to register in a registry of the caller's."""
    return RecorderCollector(recorder)
