"""Redaction beside the compile: a child process finds the PII spans of the domain's texts.

Finding spans (`find_spans`, the expensive part of redaction) was 6 of a full compile's 17 s
(the benchmark's 200k events, loaded 2-core machine), all of it on the compiler's one core:
it is Python, so a thread cannot run it beside the compiler. So a full compile of a large
domain on PostgreSQL starts a child process (`flywheel.signals.spans_ahead`) that reads the
domain's texts on a connection of its own and finds their spans while the server aggregates
the evidence and, after that, while the compiler judges and stages. A reader thread here puts
what it sends into the compile's `Texts` (`Texts.ahead`, by text digest); whatever it has not
sent yet when the compiler needs it, the compiler finds itself, as before.

Finds are a pure function of the text, so this changes no stored item (a test compiles one
domain with the child and its twin without, and compares): surrogates (scoped per
conversation) are still drawn by the compiler, and the child reads only the compiled tenant's
domain. A child that cannot start or connect costs only the head start (logged). Small
compiles and partial ones (a recompile, a forget) start no child, whose start-up (~0.5 s of
CPU) would cost more than it saves; a thread warms the name lists redaction loads once per
process while the query runs.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

import orjson
from sqlalchemy import Engine

from flywheel.children import die_with_parent
from flywheel.redaction import Span, warm
from flywheel.signals.compile.items import TEXT_CACHE_SIZE, Texts

logger = logging.getLogger(__name__)

AHEAD_MIN_EVENTS = 20_000
"""A full compile of fewer events starts no child (its start-up would not pay)."""
AHEAD_LIMIT = 5 * TEXT_CACHE_SIZE  # texts the child finds at most (memory: ~100 B each here)
STOP_WAIT_S = 5.0


class Prefetch:
    """A context manager around the compile: warms redaction in a thread and, for a large full
    compile on PostgreSQL, starts the child; stopped on leaving."""

    def __init__(
        self,
        engine: Engine,
        texts: Texts,
        tenant_id: uuid.UUID,
        domain_id: uuid.UUID,
        *,
        full: bool,
        events: int,
    ) -> None:
        self.engine = engine
        self.texts = texts
        self.asked = {"tenant": str(tenant_id), "domain": str(domain_id), "limit": AHEAD_LIMIT}
        self.is_ahead = full and engine.dialect.name == "postgresql" and events >= AHEAD_MIN_EVENTS
        self.warming = threading.Thread(target=warm, name="compile-warm", daemon=True)
        self.child: _Child | None = None

    def __enter__(self) -> Prefetch:
        self.warming.start()
        if self.is_ahead:
            self.child = _Child.start(self.engine, self.asked, self.texts.ahead)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.warming.join()
        if self.child is not None:
            self.child.stop()
        self.texts.ahead.clear()

    def rows(self, rows: Iterator[Any]) -> Iterator[Any]:
        """`rows`, once redaction's name lists are loaded (the first row waits for them)."""
        for row in rows:
            if self.warming.is_alive():
                self.warming.join()
            yield row


@dataclass
class _Child:
    """The child process, the thread that reads what it sends into `ahead`, and its stderr
    (a file: a pipe nobody reads could fill and stall it)."""

    process: subprocess.Popen[bytes]
    reader: threading.Thread
    errors: IO[bytes]

    @classmethod
    def start(
        cls, engine: Engine, asked: dict[str, Any], ahead: dict[bytes, list[Span]]
    ) -> _Child | None:
        """The child, reading; None if it could not start (only the head start is lost)."""
        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by `stop`)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "flywheel.signals.spans_ahead"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                preexec_fn=die_with_parent(),  # one prctl call in the child
            )
        except OSError as error:
            logger.info("compile spans ahead not started: %s", error)
            errors.close()
            return None
        assert process.stdin is not None
        assert process.stdout is not None
        with contextlib.suppress(OSError):  # one that died at once says why on stderr
            # the password goes down a pipe, never on a command line
            process.stdin.write(orjson.dumps(asked | {"dsn": dsn}) + b"\n")
            process.stdin.close()
        reader = threading.Thread(
            target=_read, args=(process.stdout, ahead), name="compile-spans-ahead", daemon=True
        )
        reader.start()
        return cls(process, reader, errors)

    def stop(self) -> None:
        """Stop it (the compile is over: what it has not found is not needed), and log why it
        ended if it failed."""
        process = self.process
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self.reader.join()
        if process.stdout is not None:
            process.stdout.close()
        self.errors.seek(0)
        problem = self.errors.read().decode(errors="replace").strip()
        self.errors.close()
        if process.returncode not in (0, -signal.SIGTERM):
            logger.info("compile spans ahead exited %s: %s", process.returncode, problem[-500:])


def _read(stdout: IO[bytes], ahead: dict[bytes, list[Span]]) -> None:
    for line in stdout:
        if not line.endswith(b"\n"):
            return  # cut short by its end
        for digest, spans in orjson.loads(line):
            ahead[bytes.fromhex(digest)] = [Span(*span) for span in spans]
