"""The gateway's spool: served calls the database could not take, kept on disk until it can.

An append-only JSONL file (`FLYWHEEL_GATEWAY_SPOOL_PATH`, one interaction row per line, already
redacted), capped at `FLYWHEEL_GATEWAY_SPOOL_MAX_MB`: a batch is appended with one `write` and
made durable with one `fsync`; lines that do not fit are refused, and the caller counts them
dropped. The file is created mode 0600.

Replay claims the file by renaming it to `<name>.replaying` (new calls go on to a fresh
`<name>`), hands its lines out in chunks, and deletes it once every line was written. A crash
mid-replay leaves `<name>.replaying`: the next replay starts it again from its first line, and
the rows already written are skipped by their id (the writer inserts with ON CONFLICT DO
NOTHING), so nothing is lost and nothing is written twice.

Several processes may share one spool (a host's gateway workers): appends and the rename hold
an exclusive `flock` on `<name>.lock` for the moment they take, so no append lands in a file
already being replayed; a replay holds `<name>.replaying.lock` from claim to delete, so one
process replays at a time (the others skip it, and try again later).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

MIB = 1024 * 1024


@dataclass
class _Claim:
    lock_fd: int
    offset: int = 0  # bytes of the claimed file already written to the database


@dataclass(frozen=True)
class Chunk:
    """Lines of the claimed file, and where the next chunk starts; `torn` counts a last line a
    crash cut short (never complete, never written: the caller counts it dropped)."""

    lines: list[bytes]
    end: int
    torn: int = 0


class Spool:
    """One spool file and its replay (see the module's docstring). Not thread-safe: one
    thread of a process uses it at a time (the recorder's writer)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.replaying = path.with_name(path.name + ".replaying")
        self.max_bytes = max_bytes
        self._append_lock = path.with_name(path.name + ".lock")
        self._replay_lock = path.with_name(path.name + ".replaying.lock")
        self._claim: _Claim | None = None

    def size_bytes(self) -> int:
        """Bytes spooled and not yet replayed (both files)."""
        return _size(self.path) + _size(self.replaying)

    def append(self, lines: Sequence[bytes]) -> int:
        """Append `lines` (each one JSON document, no newline) in order while they fit, with one
        write and one fsync; how many were appended (the rest were refused)."""
        if not lines:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(self._append_lock):
            room = self.max_bytes - self.size_bytes()
            taken: list[bytes] = []
            for line in lines:
                if len(line) + 1 > room:
                    break
                taken.append(line)
                room -= len(line) + 1
            if taken:
                self._write(b"".join(line + b"\n" for line in taken))
        return len(taken)

    def has_lines(self) -> bool:
        return self.size_bytes() > 0

    def next_chunk(self, limit: int) -> Chunk | None:
        """Up to `limit` lines to replay, claiming the spool first; None when there is none to
        replay, or another process is replaying it. Call `done(chunk)` once they are written."""
        if self._claim is None and not self._claim_file():
            return None
        assert self._claim is not None
        lines: list[bytes] = []
        torn = 0
        with open(self.replaying, "rb") as handle:
            handle.seek(self._claim.offset)
            while len(lines) < limit:
                line = handle.readline()
                if not line:
                    break
                if not line.endswith(b"\n"):
                    torn += 1  # a crash cut the last append short: that batch never completed
                elif line.strip():
                    lines.append(line.rstrip(b"\n"))
            end = handle.tell()
        return Chunk(lines, end, torn)

    def done(self, chunk: Chunk) -> None:
        """The chunk's lines are written: move on, and delete the file after its last line."""
        assert self._claim is not None
        self._claim.offset = chunk.end
        if chunk.end >= _size(self.replaying):
            self.replaying.unlink(missing_ok=True)
            _fsync_directory(self.path.parent)
            self._release()

    def close(self) -> None:
        """Let go of a claimed replay (its file stays, for the next replay)."""
        self._release()

    def _claim_file(self) -> bool:
        if not self.has_lines():
            return False
        lock_fd = os.open(self._replay_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            return False
        with self._locked(self._append_lock):
            if not self.replaying.exists() and _size(self.path) > 0:
                os.replace(self.path, self.replaying)
                _fsync_directory(self.path.parent)
        if not self.replaying.exists():
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
            return False
        self._claim = _Claim(lock_fd)
        return True

    def _release(self) -> None:
        if self._claim is not None:
            fcntl.flock(self._claim.lock_fd, fcntl.LOCK_UN)
            os.close(self._claim.lock_fd)
            self._claim = None

    def _write(self, data: bytes) -> None:
        is_new = not self.path.exists()
        descriptor = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(descriptor).st_size
            if size and os.pread(descriptor, 1, size - 1) != b"\n":
                data = b"\n" + data  # a crash cut the last append short: keep lines apart
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        if is_new:
            _fsync_directory(self.path.parent)

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # closing releases the lock


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _fsync_directory(path: Path) -> None:
    """Make a created, renamed or deleted name durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# Lines: one interaction row each, as orjson writes it (ids and times as strings).

UUID_COLUMNS = ("id", "tenant_id", "domain_id")


def encode_row(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row)


def decode_rows(
    lines: Sequence[bytes], columns: frozenset[str]
) -> tuple[list[dict[str, Any]], int]:
    """The rows of spooled lines, and how many lines were not rows with exactly `columns`
    (cut short by a crash, or written by a version with other columns)."""
    rows: list[dict[str, Any]] = []
    for line in lines:
        try:
            rows.append(_decode_row(orjson.loads(line), columns))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            continue
    return rows, len(lines) - len(rows)


def _decode_row(row: dict[str, Any], columns: frozenset[str]) -> dict[str, Any]:
    if row.keys() != columns:
        raise ValueError("not an interaction row of this version")
    for column in UUID_COLUMNS:
        row[column] = uuid.UUID(row[column])
    row["created_at"] = datetime.fromisoformat(row["created_at"])
    return row
