"""Write a dataset version to files a trainer reads: streamed, checked, and all-or-nothing.

Records stream through one at a time (constant memory whatever the version's size) into a
hidden staging directory next to `out_dir`; `manifest.json`, with each file's row count,
size and sha256, is written last, and the staging directory is then renamed to `out_dir` in
one step. So `out_dir` either does not exist or holds a complete export: a crash or a bad
record midway leaves no directory that looks finished (a hard kill may leave the hidden
`.NAME.partial-*` staging directory, never `out_dir` itself).

A kind with no records writes no file (its absence, and the manifest, say so): an empty JSONL
file gives `datasets` a dataset without columns and a trainer a late, confusing failure.
Formats and row shapes are in `flywheel.datasets.export_formats`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from flywheel.datasets.export_formats import FORMATS, LAYOUTS, FileSpec, Format, Row, Source
from flywheel.datasets.export_records import KINDS, ItemStreams, Kind, refuse
from flywheel.errors import Conflict, InvalidInput

MANIFEST_NAME = "manifest.json"
_SPLIT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


@dataclass(frozen=True)
class ExportedFile:
    path: str  # relative to the export directory, "/"-separated: "train/dpo.jsonl"
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ExportSummary:
    """What was written, as the manifest records it.

    `skipped` counts records read but not representable in the format (per kind);
    `omitted_kinds` names kinds that had records the format has no file for (they were not read).
    """

    out_dir: Path
    format: Format
    files: tuple[ExportedFile, ...]
    manifest_sha256: str
    skipped: Mapping[str, int] = field(default_factory=dict)
    omitted_kinds: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(exported.rows for exported in self.files)


def export_version(
    out_dir: Path,
    fmt: Format,
    splits: Mapping[str, ItemStreams],
    manifest: Mapping[str, Any],
) -> ExportSummary:
    """Export `splits` (name -> that split's item streams) to `out_dir` in `fmt`.

    `out_dir` must not exist or be empty: an export is never overwritten or mixed with another.
    `manifest` (the version's own: id, recipe, lineage...) is copied into manifest.json with an
    `export` section added. Raises InvalidInput naming the item for a bad record.
    """
    layout = _layout(fmt)
    _check_splits(splits)
    manifest_doc = _check_manifest(manifest)
    target = _prepare_target(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        files, skipped, omitted = _write_splits(staging, splits, layout)
        manifest_doc["export"] = _export_section(fmt, files, skipped, omitted)
        manifest_sha256 = _write_manifest(staging / MANIFEST_NAME, manifest_doc)
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportSummary(target, fmt, tuple(files), manifest_sha256, dict(skipped), omitted)


def _layout(fmt: str) -> tuple[FileSpec, ...]:
    if fmt not in LAYOUTS:
        raise InvalidInput(f"unknown export format {fmt!r}; expected one of {list(FORMATS)}")
    return LAYOUTS[fmt]


def _check_splits(splits: Mapping[str, ItemStreams]) -> None:
    """Split names become directory names: keep them to plain, safe path components."""
    if not splits:
        raise InvalidInput("nothing to export: no splits given")
    for name, streams in splits.items():
        if not isinstance(name, str) or not _SPLIT_NAME.fullmatch(name):
            raise InvalidInput(f"split name {name!r} must match {_SPLIT_NAME.pattern}")
        if not isinstance(streams, ItemStreams):
            raise InvalidInput(
                f"split {name!r}: expected ItemStreams, got {type(streams).__name__}"
            )


def _check_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Fail before any data is read if the manifest cannot be written as JSON."""
    doc = dict(manifest)
    if "export" in doc:
        raise InvalidInput("the manifest's 'export' key is the exporter's; rename it")
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"the manifest is not plain JSON: {error}") from error
    return doc


def _prepare_target(out_dir: Path) -> Path:
    target = Path(out_dir).absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise Conflict(
            f"{target} already exists and is not an empty directory; exports are never overwritten"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _write_splits(
    staging: Path, splits: Mapping[str, ItemStreams], layout: tuple[FileSpec, ...]
) -> tuple[list[ExportedFile], Counter[str], tuple[str, ...]]:
    files: list[ExportedFile] = []
    skipped: Counter[str] = Counter()
    read_kinds = {source.kind for spec in layout for source in spec.sources}
    omitted: set[str] = set()
    for split, streams in splits.items():
        for spec in layout:
            with _LazyJsonl(staging, f"{split}/{spec.name}") as writer:
                for source in spec.sources:
                    skipped[source.kind] += _write_source(writer, source, streams)
            if writer.exported is not None:
                files.append(writer.exported)
        omitted.update(kind for kind in KINDS if kind not in read_kinds and _has_any(streams, kind))
    return files, +skipped, tuple(sorted(omitted))


def _write_source(writer: _LazyJsonl, source: Source[Any], streams: ItemStreams) -> int:
    """Stream one kind into `writer`; returns how many records the format had no row for."""
    skipped = 0
    for record in getattr(streams, source.kind):
        if not isinstance(record, source.record_type):
            raise InvalidInput(
                f"{source.kind} stream holds a {type(record).__name__}, "
                f"expected {source.record_type.__name__}"
            )
        row = source.build(record)
        if row is None:
            skipped += 1
        else:
            writer.write(row, record.item_id)
    return skipped


def _has_any(streams: ItemStreams, kind: Kind) -> bool:
    """Whether a kind the format cannot hold had records: peeks one, reads no further."""
    return next(iter(getattr(streams, kind)), None) is not None


class _LazyJsonl:
    """One output file, created on its first row so that an empty kind leaves no file."""

    def __init__(self, root: Path, relative: str) -> None:
        self.root, self.relative = root, relative
        self.rows = self.bytes = 0
        self.exported: ExportedFile | None = None
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()

    def __enter__(self) -> _LazyJsonl:
        return self

    def write(self, row: Row, item_id: str) -> None:
        try:
            line = json.dumps(row, ensure_ascii=False, allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as error:  # UnicodeEncodeError is a ValueError
            raise refuse(item_id, f"not representable as JSON: {error}") from error
        if self._file is None:
            path = self.root / self.relative
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("xb")
        self._file.write(line)
        self._hash.update(line)
        self.rows += 1
        self.bytes += len(line)

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        if self._file is None:
            return
        try:
            if error_type is None:
                _sync(self._file)
                self.exported = ExportedFile(
                    self.relative, self.rows, self.bytes, self._hash.hexdigest()
                )
        finally:
            self._file.close()


def _sync(file: IO[bytes]) -> None:
    file.flush()
    os.fsync(file.fileno())


def _export_section(
    fmt: Format, files: list[ExportedFile], skipped: Counter[str], omitted: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "format": fmt,
        "files": {f.path: {"rows": f.rows, "bytes": f.bytes, "sha256": f.sha256} for f in files},
        "skipped": dict(sorted(skipped.items())),
        "omitted_kinds": list(omitted),
    }


def _write_manifest(path: Path, doc: dict[str, Any]) -> str:
    data = (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    with path.open("xb") as file:
        file.write(data)
        _sync(file)
    return hashlib.sha256(data).hexdigest()


def _publish(staging: Path, target: Path) -> None:
    """Rename the finished staging directory to `target` (replacing it only if empty)."""
    for directory in _directories(staging):
        _sync_directory(directory)
    try:
        staging.rename(target)
    except OSError as error:
        raise Conflict(f"{target} appeared while exporting; nothing was written there") from error
    _sync_directory(target.parent)


def _directories(root: Path) -> Iterator[Path]:
    yield from (path for path in root.rglob("*") if path.is_dir())
    yield root


def _sync_directory(directory: Path) -> None:
    """Make a rename or new entries durable: fsync the directory itself."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
