"""Reading export files in constant memory, with errors that say where the file is wrong.

Encodings: UTF-8, with or without a byte-order mark; UTF-16 and UTF-32 when a byte-order
mark says so (Excel's "Unicode text" export is UTF-16 LE with one). Anything else is an
error naming the line and byte where decoding failed: guessing a legacy code page would put
mojibake into training data without anyone noticing. A file that is binary (a NUL byte where
text should be, or the magic number of an archive, spreadsheet, PDF or image) is refused
before parsing, with what it looks like. A `.gz` file is read decompressed.

JSON is streamed with ijson: only one record is in memory at a time, so an export of a
million tickets reads like one of ten. JSON Lines and CSV are read line by line, each line
at most MAX_LINE_BYTES.
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import ijson
import orjson

from flywheel.errors import InvalidInput
from ingest.jsonl import open_source

CHUNK_BYTES = 64 * 1024
MAX_LINE_BYTES = 64 * 1024 * 1024
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_MAGIC = (
    (b"\x1f\x8b", "a gzip archive (name it .gz to have it read decompressed)"),
    (b"PK\x03\x04", "a zip archive or an .xlsx workbook (export as CSV or JSON instead)"),
    (b"\xd0\xcf\x11\xe0", "an .xls workbook (export as CSV instead)"),
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"SQLite format 3", "an SQLite database"),
)


@dataclass(frozen=True)
class Encoding:
    codec: str
    bom_bytes: int


def detect_encoding(path: Path) -> Encoding:
    """The file's encoding from its byte-order mark (UTF-8 without one); InvalidInput when
    the file is binary."""
    with open_source(path) as source:
        head = _read(source, path, CHUNK_BYTES)
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return Encoding(codec, len(bom))
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise InvalidInput(f"{path}: this is {what}, not a ticket export")
    nul = head.find(b"\x00")
    if nul >= 0:
        raise InvalidInput(
            f"{path}: binary data (a NUL byte at byte {nul}), not a text export; "
            "UTF-16 needs a byte-order mark"
        )
    return Encoding("utf-8", 0)


def _read(source: IO[bytes], path: Path, size: int) -> bytes:
    try:
        return source.read(size)
    except (OSError, EOFError) as error:  # a truncated .gz ends with EOFError
        raise InvalidInput(f"{path}: cannot read ({error})") from error


class Utf8Stream:
    """The file's text as UTF-8 bytes, for ijson: checked as it streams, transcoded when the
    file is UTF-16/32. A byte that does not decode is an InvalidInput naming line and byte."""

    def __init__(self, source: IO[bytes], encoding: Encoding, path: Path) -> None:
        self._source, self._path = source, path
        self._codec = encoding.codec
        self._decoder = codecs.getincrementaldecoder(encoding.codec)("strict")
        self._is_utf8 = encoding.codec == "utf-8"
        self._offset = len(_read(source, path, encoding.bom_bytes))
        self._line = 1

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson asks for nothing to learn whether the stream gives bytes
            return b""
        while True:
            chunk = _read(self._source, self._path, CHUNK_BYTES if size < 0 else size)
            text = self._decode(chunk)
            self._offset += len(chunk)
            self._line += text.count("\n")
            if not chunk or text or self._is_utf8:
                return chunk if self._is_utf8 else text.encode("utf-8")

    def _decode(self, chunk: bytes) -> str:
        pending = self._decoder.getstate()[0]
        try:
            return self._decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as error:
            where = self._offset - len(pending) + error.start
            line = self._line + (pending + chunk)[: error.start].count(b"\n")
            raise InvalidInput(
                f"{self._path} line {line} (byte {where}): not valid {self._codec} "
                f"({error.reason}); save the export as UTF-8"
            ) from error


def read_json_records(
    path: Path,
    *,
    array_key: str,
    noun: str,
    name_of: Callable[[Any], str],
    is_array_allowed: bool = False,
    id_key: str = "id",
) -> Iterator[tuple[str, Any]]:
    """(where, record) for each record of a JSON export: the items of the top-level
    `array_key` array, of a top-level array when the vendor's API returns one, or one per
    line of a JSON Lines file. Several documents one after another read as one export:
    pages saved in a row (`gh api --paginate` writes `[...][...]`, paged API responses
    `{"tickets": [...]}{"tickets": [...]}`), gh's `--slurp` (an array of page arrays), and
    records one after another (`--jq '.[]'`), told apart by the first object having the
    record's `id_key` and no `array_key`."""
    encoding = detect_encoding(path)
    if path.name.removesuffix(".gz").endswith(JSON_LINES_SUFFIXES):
        yield from _json_lines(path, encoding, array_key)
        return
    with open_source(path) as source:
        first = _first_char(Utf8Stream(source, encoding, path))
    if not first:
        raise InvalidInput(f"{path}: the file is empty")
    if first == b"[" and not is_array_allowed:
        raise InvalidInput(
            f'{path}: a JSON array, where this export has {{"{array_key}": [...]}}; '
            "is --format right for this export?"
        )
    if first == b"[":
        prefix = "item"
    elif _is_record_stream(path, encoding, array_key, id_key):
        prefix = ""
    else:
        prefix = f"{array_key}.item"
    count = yield from _stream_items(path, encoding, prefix, noun, name_of)
    if count == 0 and prefix == f"{array_key}.item":
        _check_has_array(path, encoding, array_key)


def _stream_items(
    path: Path, encoding: Encoding, prefix: str, noun: str, name_of: Callable[[Any], str]
) -> Generator[tuple[str, Any], None, int]:
    """The values at `prefix` of every top-level document, one at a time; a page array among
    them (gh's --slurp) gives its items. Returns how many were yielded."""
    count, last = 0, ""
    with open_source(path) as source:
        stream = Utf8Stream(source, encoding, path)
        values = ijson.items(stream, prefix, use_float=True, multiple_values=True)
        while True:
            try:
                value = next(values)
            except StopIteration:
                break
            except ijson.JSONError as error:
                after = f" (after {noun} {last})" if count else ""
                raise InvalidInput(
                    f"{path}: truncated or malformed JSON in {noun} #{count + 1}{after}: "
                    f"{_first_line(error)}"
                ) from error
            for record in value if prefix == "item" and isinstance(value, list) else [value]:
                count += 1
                last = name_of(record)
                yield f"#{count}", record
    return count


def _is_record_stream(path: Path, encoding: Encoding, array_key: str, id_key: str) -> bool:
    """Whether the first top-level object is a record itself (records one after another)
    rather than a page holding them under `array_key`."""
    keys: set[str] = set()
    with open_source(path) as source:
        try:
            events = ijson.parse(Utf8Stream(source, encoding, path), multiple_values=True)
            for prefix, event, value in events:
                if prefix == "" and event == "map_key":
                    if value == array_key:
                        return False
                    keys.add(str(value))
                elif prefix == "" and event == "end_map":
                    return id_key in keys
        except ijson.JSONError:
            return False  # the page reader names the error and where
    return False


def read_sideloads(
    path: Path, fields: dict[str, tuple[str, ...]], *, array_key: str
) -> dict[str, list[dict[str, Any]]]:
    """The objects side-loaded beside the record array of every page of a JSON export
    (`{"tickets": [...], "users": [...]}`), keeping only `fields[key]` of each. A file that
    is malformed yields what comes before the error: the record reader reports the error,
    naming the record."""
    found: dict[str, list[dict[str, Any]]] = {key: [] for key in fields}
    encoding = detect_encoding(path)
    if path.name.removesuffix(".gz").endswith(JSON_LINES_SUFFIXES):
        for _, page in _json_lines(path, encoding, array_key=None):
            is_page = isinstance(page, dict) and isinstance(page.get(array_key), list)
            for key, keep in fields.items() if is_page else ():
                items = page.get(key)
                found[key] += _kept(items if isinstance(items, list) else [], keep)
        return found
    for key, keep in fields.items():
        with open_source(path) as source:
            stream = Utf8Stream(source, encoding, path)
            items = ijson.items(stream, f"{key}.item", use_float=True, multiple_values=True)
            try:
                found[key] += _kept(items, keep)
            except (ijson.JSONError, InvalidInput):
                continue
    return found


def read_record_ids(
    path: Path, *, array_key: str, id_key: str, is_array_allowed: bool
) -> Iterator[object]:
    """Each record's `id_key` value in file order, without building the records; stops at
    the first error (reading the records reports it)."""
    encoding = detect_encoding(path)
    if path.name.removesuffix(".gz").endswith(JSON_LINES_SUFFIXES):
        for _, record in _json_lines(path, encoding, array_key):
            yield record.get(id_key) if isinstance(record, dict) else None
        return
    with open_source(path) as source:
        first = _first_char(Utf8Stream(source, encoding, path))
    if first == b"[" and is_array_allowed:
        prefix = f"item.{id_key}"
    elif first == b"{" and _is_record_stream(path, encoding, array_key, id_key):
        prefix = id_key
    else:
        prefix = f"{array_key}.item.{id_key}"
    with open_source(path) as source:
        stream = Utf8Stream(source, encoding, path)
        try:
            yield from ijson.items(stream, prefix, use_float=True, multiple_values=True)
        except ijson.JSONError:
            return


def _kept(items: Iterable[Any], keep: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{name: item.get(name) for name in keep} for item in items if isinstance(item, dict)]


def _first_line(error: Exception) -> str:
    """ijson's message without the excerpt of the file it appends (it may hold PII)."""
    return str(error).strip().split("\n", 1)[0]


def _first_char(stream: Utf8Stream) -> bytes:
    """The first byte that is not whitespace; b"" for an empty file."""
    while chunk := stream.read(CHUNK_BYTES):
        if stripped := chunk.lstrip():
            return stripped[:1]
    return b""


def _check_has_array(path: Path, encoding: Encoding, array_key: str) -> None:
    """An export with no records: fine when it is an empty `array_key` array, an error (with
    the keys it does have) when it is some other JSON document."""
    keys: list[str] = []
    with open_source(path) as source:
        try:
            events = ijson.parse(Utf8Stream(source, encoding, path), multiple_values=True)
            for prefix, event, value in events:
                if prefix == array_key and event == "start_array":
                    return
                if prefix == "" and event == "map_key" and len(keys) < 10:
                    keys.append(str(value))
        except ijson.JSONError as error:
            raise InvalidInput(f"{path}: not JSON ({_first_line(error)})") from error
    found = f"its keys are {', '.join(keys)}" if keys else "it is not a JSON object"
    raise InvalidInput(
        f'{path}: no "{array_key}" array at the top level ({found}); '
        "is --format right for this export?"
    )


def _json_lines(path: Path, encoding: Encoding, array_key: str | None) -> Iterator[tuple[str, Any]]:
    """One record per line; a line that is a page (an object holding `array_key`, as an
    incremental export's response saved one per line) or an array gives its items."""
    for number, line in read_lines(path, encoding):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise InvalidInput(f"{path} line {number}: not JSON ({error})") from error
        items = value.get(array_key) if isinstance(value, dict) and array_key else value
        if isinstance(items, list) and array_key:
            for index, item in enumerate(items, 1):
                yield f"line {number} #{index}", item
        else:
            yield f"line {number}", value


def read_lines(path: Path, encoding: Encoding) -> Iterator[tuple[int, str]]:
    """(line number, line with its ending) of a text file, each line at most MAX_LINE_BYTES."""
    with open_source(path) as source:
        _read(source, path, encoding.bom_bytes)
        if encoding.codec == "utf-8":
            yield from _utf8_lines(source, path)
        else:
            yield from _decoded_lines(source, encoding, path)


def _utf8_lines(source: IO[bytes], path: Path) -> Iterator[tuple[int, str]]:
    number, offset = 0, 0
    while raw := _readline(source, path, number + 1):
        number += 1
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInput(
                f"{path} line {number} (byte {offset + error.start}): not valid UTF-8; "
                "save the export as UTF-8"
            ) from error
        offset += len(raw)


def _readline(source: IO[bytes], path: Path, number: int) -> bytes:
    try:
        line = source.readline(MAX_LINE_BYTES + 1)
    except (OSError, EOFError) as error:
        raise InvalidInput(f"{path}: cannot read line {number} ({error})") from error
    if len(line) > MAX_LINE_BYTES:
        raise InvalidInput(f"{path} line {number}: longer than {MAX_LINE_BYTES} bytes")
    return line


def _decoded_lines(source: IO[bytes], encoding: Encoding, path: Path) -> Iterator[tuple[int, str]]:
    text = io.TextIOWrapper(source, encoding=encoding.codec, errors="strict", newline="")
    number = 0
    try:
        while line := text.readline(MAX_LINE_BYTES):
            number += 1
            yield number, line
    except UnicodeDecodeError as error:
        raise InvalidInput(
            f"{path} near line {number + 1}: not valid {encoding.codec} ({error.reason})"
        ) from error
    finally:
        text.detach()
