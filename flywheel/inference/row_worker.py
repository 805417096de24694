"""Call records made interaction rows (redacted) in a child process, off the gateway's GIL.

Redaction is CPU-heavy Python (170-450 us a record): on the recorder's writer thread it holds
the GIL the event loop needs, and every answer waits for it. `RowWorker.rows` sends a whole
batch to one spawned child (`ProcessPoolExecutor`, `spawn` context: nothing of the gateway's
threads or sockets is inherited) and waits for its rows with the GIL released; the only work
left in the gateway's process is pickling the batch and its rows (a few us a record).
Measured (`python -m bench.gateway`, child vs thread, 2 loaded cores): a small edge, within
the noise — zero-delay 1,269 vs 1,179 req/s, added p50 1.30 vs 1.57 ms; the bench's texts
repeat, so its `SpanCache` hits and redaction is cheap there; real chats redact more.

The child keeps its own `SpanCache` across batches and redacts with the key the gateway's
process resolved (passed at spawn, so both agree even when the key came from settings the
child cannot see). When the child cannot do a batch (it died, a record does not pickle), the
batch goes to a fresh child; when that fails too, the caller is told (`None`) and makes the
rows itself, in its thread, as before: nothing is lost.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flywheel.inference.recording import CallRecord, Row, SpanCache

log = logging.getLogger(__name__)

_child: tuple[bytes, SpanCache] | None = None  # in the child: its key and span cache


class RowWorker:
    """One child process making rows of batches; `rows` is called from one thread at a time."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._pool: ProcessPoolExecutor | None = None

    def rows(self, records: list[CallRecord]) -> list[Row | None] | None:
        """The records' rows (None for one that could not be made a row), or None when the
        child could not do the batch, nor a fresh one in its place."""
        for attempt in range(2):
            try:
                return self._pool_now().submit(_rows_in_child, records).result()
            except Exception as error:  # a dead child, an unpicklable record
                log.warning("the redaction process failed a batch (try %d): %r", attempt, error)
                self.close()
        return None

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_child,
                initargs=(self._key,),
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _start_child(key: bytes) -> None:
    global _child
    from flywheel.inference.recording import SpanCache

    _child = (key, SpanCache())
    parent = os.getppid()
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()


def _exit_when_orphaned(parent: int) -> None:
    """A gateway killed outright (SIGKILL) cannot stop its child: the child stops itself."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def _rows_in_child(records: list[CallRecord]) -> list[Row | None]:
    from flywheel.inference.recording import interaction_row

    assert _child is not None
    key, spans = _child
    rows: list[Row | None] = []
    for record in records:
        try:
            rows.append(interaction_row(record, spans, key=key))
        except Exception:  # a malformed record must not lose the rest of its batch
            log.exception("could not make a call record an interaction row")
            rows.append(None)
    return rows
