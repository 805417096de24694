"""Checkpoints that are complete or absent, resume from the latest complete one, and a clean
stop on SIGTERM.

The trainer writes `checkpoint-N/` (adapter weights as safetensors, optimizer, scheduler and
RNG state); when it is done, `CheckpointManifest` writes `flywheel-checkpoint.json` with the
sha256 of every file, to a temporary name first and then renamed: that rename is the commit
point. A directory without a manifest, or whose files no longer match it (a crash mid-save, a
full disk), is not a checkpoint, and resume passes over it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.data import file_sha256

MANIFEST = "flywheel-checkpoint.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory` (but a manifest), by relative path."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.endswith(".tmp"):
            found[path.relative_to(directory).as_posix()] = file_sha256(path)
    return found


def write_manifest(directory: Path, **extra: Any) -> Path:
    """Seal `directory`: its manifest, written aside and renamed into place."""
    pickled = [name for name in file_digests(directory) if name.startswith("adapter_model.")]
    if any(not name.endswith(".safetensors") for name in pickled):
        raise RuntimeError(f"{directory} holds adapter weights that are not safetensors")
    doc = {"files": file_digests(directory), **extra}
    target = directory / MANIFEST
    staging = directory / (MANIFEST + ".tmp")
    with staging.open("w", encoding="utf-8") as file:
        json.dump(doc, file, indent=2, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())
    staging.replace(target)
    return target


def is_complete(directory: Path) -> bool:
    try:
        doc = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(doc.get("files")) and doc["files"] == file_digests(directory)


def latest_complete(output_dir: Path) -> Path | None:
    """The newest sealed checkpoint under `output_dir`, if any."""
    if not output_dir.is_dir():
        return None
    numbered = []
    for path in output_dir.iterdir():
        match = _CHECKPOINT.match(path.name)
        if match and path.is_dir():
            numbered.append((int(match.group(1)), path))
    for _, path in sorted(numbered, reverse=True):
        if is_complete(path):
            return path
    return None


class CheckpointManifest(TrainerCallback):
    """Seals each checkpoint once the trainer has finished writing it."""

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if state.is_world_process_zero:
            directory = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
            if directory.is_dir():
                write_manifest(directory, step=state.global_step)


class StopOnSignal(TrainerCallback):
    """On SIGTERM (a preempted host, `kill`), finish the current step, checkpoint and stop:
    the run exits cleanly and resumes from there."""

    def __init__(self) -> None:
        self.is_interrupted = False
        self._previous: Any = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            self._previous = signal.signal(signal.SIGTERM, self._received)

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.is_interrupted:
            control.should_save = True
            control.should_training_stop = True

    def _received(self, signum: int, frame: FrameType | None) -> None:
        self.is_interrupted = True
