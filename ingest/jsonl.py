"""JSON Lines sources: streamed line by line (plain or .gz), every error naming its line."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from flywheel.errors import InvalidInput

MAX_LINE_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024


def open_source(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed when it ends in .gz; a clear error when unreadable."""
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    try:
        if path.suffix == ".gz":
            return cast(IO[bytes], gzip.open(path, "rb"))
        return path.open("rb")
    except OSError as error:
        raise InvalidInput(f"cannot read {path}: {error.strerror or error}") from error


def file_sha256(path: Path) -> str:
    """sha256 of the file as stored (compressed or not), read in chunks."""
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    digest = hashlib.sha256()
    try:
        with path.open("rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                digest.update(chunk)
    except OSError as error:
        raise InvalidInput(f"cannot read {path}: {error.strerror or error}") from error
    return digest.hexdigest()


def read_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; InvalidInput names a bad line."""
    with open_source(path) as source:
        for number, raw in enumerate(_lines(source, path), 1):
            if not raw.strip():
                continue
            yield number, _parse(raw, number, path)


def _lines(source: IO[bytes], path: Path) -> Iterator[bytes]:
    try:
        while line := source.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES:
                raise InvalidInput(f"{path}: a line is over {MAX_LINE_BYTES} bytes")
            yield line
    except (OSError, EOFError) as error:  # a truncated .gz ends with EOFError
        raise InvalidInput(f"{path}: cannot read ({error})") from error


def _parse(raw: bytes, number: int, path: Path) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise InvalidInput(
            f"{path} line {number}: not UTF-8 (byte {error.start}); re-encode the file as UTF-8"
        ) from error
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidInput(f"{path} line {number}: not JSON ({error.msg})") from error
    if not isinstance(value, dict):
        raise InvalidInput(f"{path} line {number}: expected a JSON object")
    return value
