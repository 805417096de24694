"""Reading a dataset export (`flywheel dataset export --format trl`) for a recipe.

The export's manifest lists every file with its rows and sha256; `open_export` checks them all
before anything trains, so a missing, truncated or edited export is a one-line error, not a
run that dies (or silently trains on less) an hour in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

from finetune.errors import TrainingInputError

MANIFEST = "manifest.json"
FILES = {"sft": "sft.jsonl", "dpo": "dpo.jsonl", "kto": "kto.jsonl", "grpo": "grpo.jsonl"}
CHUNK_BYTES = 1 << 20
TASK_KINDS = ("code", "answer", "tool_call", "environment")


@dataclass(frozen=True)
class Export:
    root: Path
    manifest: dict[str, Any]

    @property
    def dataset_version_id(self) -> str | None:
        return self.manifest.get("dataset_version_id")

    @property
    def manifest_sha256(self) -> str:
        """The version's own content hash when the export came from a version, else the
        manifest file's hash."""
        found = self.manifest.get("manifest_sha256")
        if found:
            return str(found)
        return hashlib.sha256((self.root / MANIFEST).read_bytes()).hexdigest()

    def path(self, method: str, split: str = "train") -> Path | None:
        relative = f"{split}/{FILES[method]}"
        return self.root / relative if relative in self.manifest["export"]["files"] else None


def open_export(root: Path, export_format: str = "trl") -> Export:
    """The export at `root` (in `export_format`), every file checked against the manifest."""
    manifest_path = root / MANIFEST
    if not root.is_dir():
        raise TrainingInputError(f"dataset export {root} does not exist (flywheel dataset export)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        found, files = manifest["export"].get("format"), manifest["export"]["files"]
        if not isinstance(files, dict):
            raise TypeError("export.files is not a mapping")
    except FileNotFoundError as error:
        raise TrainingInputError(f"{root} has no {MANIFEST}: not a dataset export") from error
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise TrainingInputError(f"{manifest_path} is corrupt: {error}") from error
    if found != export_format:
        raise TrainingInputError(f"{root} is a {found} export: use {export_format}")
    for relative, expected in files.items():
        _check_file(root / relative, expected)
    return Export(root, manifest)


def file_sha256(path: Path) -> str:
    """A file's sha256, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _check_file(path: Path, expected: Any) -> None:
    try:
        found = file_sha256(path)
    except FileNotFoundError as error:
        raise TrainingInputError(f"{path} is missing from the export") from error
    if not isinstance(expected, dict) or found != expected.get("sha256"):
        raise TrainingInputError(f"{path} does not match the manifest's sha256: corrupt export")


def train_dataset(export: Export, method: str, cache_dir: Path) -> Dataset:
    """The method's train split as a `datasets.Dataset` (the file TRL would read)."""
    path = export.path(method)
    if path is None:
        raise TrainingInputError(
            f"{export.root} has no train/{FILES[method]}: the version holds nothing for {method}"
        )
    if method == "grpo":
        check_tasks(path)
    return load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache_dir))


def check_tasks(path: Path) -> None:
    """Every GRPO task must be checkable: code tasks need tests and an entry point, answer
    tasks an answer, tool_call tasks their tools and expected calls, environment tasks their
    tools and environment (the reward has nothing else to go on)."""
    with path.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            _check_task(json.loads(line), index, path)


def _check_task(row: dict[str, Any], index: int, path: Path) -> None:
    kind = row.get("task_kind")
    if kind == "code" and not (row.get("tests") and row.get("entry_point")):
        raise TrainingInputError(f"{path} row {index + 1}: a code task without tests")
    if kind == "answer" and not row.get("answer"):
        raise TrainingInputError(f"{path} row {index + 1}: an answer task without an answer")
    if kind == "tool_call" and not (row.get("tools") and row.get("expected_calls")):
        raise TrainingInputError(f"{path} row {index + 1}: a tool_call task without its calls")
    if kind == "environment" and not (row.get("tools") and row.get("environment")):
        raise TrainingInputError(f"{path} row {index + 1}: an environment task without one")
    if kind not in TASK_KINDS:
        raise TrainingInputError(f"{path} row {index + 1}: unknown task kind {kind!r}")
