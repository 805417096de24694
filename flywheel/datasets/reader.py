"""A dataset version's items as export records, streamed from the database in their order.

Weights are the version's own snapshot (`dataset_members.weight`; what a version holds:
flywheel.datasets.membership): an item retracted after the
build still exports as the version saw it, so an export of a version is always the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import literal
from sqlalchemy.orm import Session

from flywheel.datasets.export import ExportSummary, export_version
from flywheel.datasets.export_formats import Format
from flywheel.datasets.export_records import (
    ItemStreams,
    LabelRecord,
    PairRecord,
    SftRecord,
    TaskRecord,
)
from flywheel.datasets.items import KIND_OF_COLUMN, KINDS
from flywheel.datasets.membership import held_rows
from flywheel.datasets.models import DatasetVersion
from flywheel.datasets.versions import version_manifest
from flywheel.errors import InvalidState
from flywheel.signals.models import LabeledCompletion, PreferencePair, SftExample, VerifiableTask

SPLITS = ("train", "eval")


def export_dataset_version(
    session: Session,
    version: DatasetVersion,
    domain: str,
    out_dir: Path,
    fmt: Format,
    *,
    splits: tuple[str, ...] = SPLITS,
) -> ExportSummary:
    """Write the version's splits as `fmt` files with its manifest: what training, evaluation
    and `flywheel dataset export` each write. A tainted version (data it used was forgotten)
    is refused."""
    refuse_tainted(version, domain)
    streams = version_streams(session, version)
    chosen = {split: streams[split] for split in splits}
    return export_version(out_dir, fmt, chosen, version_manifest(version, domain))


def refuse_tainted(version: DatasetVersion, domain: str) -> None:
    """InvalidState for a version that data it used was forgotten from."""
    if version.tainted_at is not None:
        raise InvalidState(
            f"v{version.version} of {domain} is tainted: data it used was forgotten at "
            f"{version.tainted_at.isoformat()}; build a new version and use that"
        )


def version_streams(session: Session, version: DatasetVersion) -> dict[str, ItemStreams]:
    """Per split, each kind's records in the version's order (lazy: read while exporting)."""
    return {
        split: ItemStreams(
            sft=_sft(session, version, split),
            pairs=_pairs(session, version, split),
            labels=_labels(session, version, split),
            tasks=_tasks(session, version, split),
        )
        for split in SPLITS
    }


def version_lineage(session: Session, version: DatasetVersion) -> Iterator[dict[str, Any]]:
    """Where each item of the version came from: its source (a ticket, a repository function,
    a task file's task, or "feedback:" and the interactions and events it was compiled from)
    and its group (for compiled feedback, the conversation: every event about it was judged
    together). Split by split, kind by kind, in the version's order."""
    for split in SPLITS:
        for kind in KINDS:
            model = kind.model
            columns = (model.id, model.source_kind, model.source_ref, model.group_key)
            for row in held_rows(session, version, kind, split, columns):
                yield {
                    "split": split,
                    "kind": kind.name,
                    "item_id": str(row.id),
                    "source_kind": row.source_kind,
                    "source_ref": row.source_ref,
                    "group_key": row.group_key,
                }


def version_item_labels(
    session: Session, version: DatasetVersion, split: str = "eval"
) -> Iterator[dict[str, Any]]:
    """What the evaluation slices a split's items by: each item's id, source kind, tags,
    prompt (a task's prompt; the last user message of a conversation) and difficulty (tasks
    only, else None). Kind by kind, in the version's order."""
    for kind in KINDS:
        model: Any = kind.model
        is_task = model is VerifiableTask
        prompt = model.prompt if is_task else model.messages
        difficulty = model.difficulty if is_task else literal(None)
        columns = (model.id, model.source_kind, model.tags, prompt, difficulty)
        for row in held_rows(session, version, kind, split, columns):
            item_id, source_kind, tags, text, level = tuple(row)[:5]
            yield {
                "item_id": str(item_id),
                "source_kind": source_kind,
                "tags": list(tags or []),
                "prompt": text if is_task else _last_user_text(text),
                "difficulty": level,
            }


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    users = [str(m.get("content", "")) for m in messages or [] if m.get("role") == "user"]
    return users[-1] if users else ""


def _sft(session: Session, version: DatasetVersion, split: str) -> Iterator[SftRecord]:
    model = SftExample
    columns = (
        model.messages,
        model.completion,
        model.group_key,
        model.id,
        model.tools,
        model.completion_tool_calls,
    )
    for row in held_rows(session, version, KIND_OF_COLUMN["sft_example_id"], split, columns):
        messages, completion, group_key, item_id, tools, calls = tuple(row)[:6]
        yield SftRecord(messages, completion, row.weight, group_key, str(item_id), tools, calls)


def _pairs(session: Session, version: DatasetVersion, split: str) -> Iterator[PairRecord]:
    model = PreferencePair
    columns = (
        *(model.messages, model.chosen, model.rejected, model.why, model.group_key, model.id),
        *(model.tools, model.chosen_tool_calls, model.rejected_tool_calls),
    )
    for row in held_rows(session, version, KIND_OF_COLUMN["preference_pair_id"], split, columns):
        yield PairRecord(
            *(row.messages, row.chosen, row.rejected, row.weight, row.why, row.group_key),
            item_id=str(row.id),
            tools=row.tools,
            chosen_tool_calls=row.chosen_tool_calls,
            rejected_tool_calls=row.rejected_tool_calls,
        )


def _labels(session: Session, version: DatasetVersion, split: str) -> Iterator[LabelRecord]:
    model = LabeledCompletion
    columns = (
        model.messages,
        model.completion,
        model.is_desirable,
        model.why,
        model.group_key,
        model.id,
        model.tools,
        model.completion_tool_calls,
    )
    for row in held_rows(session, version, KIND_OF_COLUMN["labeled_completion_id"], split, columns):
        yield LabelRecord(
            *(row.messages, row.completion, row.is_desirable, row.weight, row.group_key),
            item_id=str(row.id),
            why=row.why,
            tools=row.tools,
            completion_tool_calls=row.completion_tool_calls,
        )


def _tasks(session: Session, version: DatasetVersion, split: str) -> Iterator[TaskRecord]:
    model = VerifiableTask
    columns = (
        model.prompt,
        model.entry_point,
        model.hidden_tests,
        model.visible_tests,
        model.reference_solution,
        model.task_kind,
        model.answer,
        model.difficulty,
        model.group_key,
        model.id,
        model.messages,
        model.tools,
        model.expected_calls,
        model.environment,
    )
    for row in held_rows(session, version, KIND_OF_COLUMN["verifiable_task_id"], split, columns):
        yield TaskRecord(
            prompt=row.prompt,
            entry_point=row.entry_point,
            hidden_tests=row.hidden_tests,
            visible_tests=row.visible_tests,
            reference_solution=row.reference_solution,
            task_kind=row.task_kind,
            answer=row.answer,
            difficulty=row.difficulty,
            group_key=row.group_key,
            item_id=str(row.id),
            weight=row.weight,
            messages=row.messages,
            tools=row.tools,
            expected_calls=row.expected_calls,
            environment=row.environment,
        )
