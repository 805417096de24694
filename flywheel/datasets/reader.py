"""A dataset version's items as export records, streamed from the database in their order.

Weights are the version's own snapshot (`dataset_members.weight`): an item retracted after the
build still exports as the version saw it, so an export of a version is always the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from flywheel.datasets.export_records import (
    ItemStreams,
    LabelRecord,
    PairRecord,
    SftRecord,
    TaskRecord,
)
from flywheel.datasets.models import DatasetMember, DatasetVersion
from flywheel.signals.models import LabeledCompletion, PreferencePair, SftExample, VerifiableTask

SPLITS = ("train", "eval")
CHUNK_ROWS = 1_000


def version_streams(session: Session, version: DatasetVersion) -> dict[str, ItemStreams]:
    """Per split, each kind's records in the version's order (lazy: read while exporting)."""
    return {
        split: ItemStreams(
            sft=_sft(session, version.id, split),
            pairs=_pairs(session, version.id, split),
            labels=_labels(session, version.id, split),
            tasks=_tasks(session, version.id, split),
        )
        for split in SPLITS
    }


def version_manifest(version: DatasetVersion, domain: str) -> dict[str, Any]:
    """What an export's manifest.json says of the version: enough to trace and rebuild it."""
    return {
        "dataset_version_id": str(version.id),
        "domain": domain,
        "version": version.version,
        "manifest_sha256": version.manifest_sha256,
        "eval_sha256": version.eval_sha256,
        "recipe": version.recipe,
        "stats": version.stats,
        "parent_id": str(version.parent_id) if version.parent_id else None,
        "created_at": version.created_at.isoformat(),
        "tainted_at": version.tainted_at.isoformat() if version.tainted_at else None,
    }


def _rows(session: Session, query: Select[Any]) -> Iterator[Any]:
    yield from session.execute(query.execution_options(yield_per=CHUNK_ROWS))


def _members(model: Any, column: Any, version_id: uuid.UUID, split: str) -> Select[Any]:
    return (
        select(model, DatasetMember.weight)
        .join(DatasetMember, column == model.id)
        .where(DatasetMember.dataset_version_id == version_id, DatasetMember.split == split)
        .order_by(DatasetMember.position)
    )


def _sft(session: Session, version_id: uuid.UUID, split: str) -> Iterator[SftRecord]:
    query = _members(SftExample, DatasetMember.sft_example_id, version_id, split)
    for item, weight in _rows(session, query):
        yield SftRecord(item.messages, item.completion, weight, item.group_key, str(item.id))


def _pairs(session: Session, version_id: uuid.UUID, split: str) -> Iterator[PairRecord]:
    query = _members(PreferencePair, DatasetMember.preference_pair_id, version_id, split)
    for item, weight in _rows(session, query):
        yield PairRecord(
            item.messages,
            item.chosen,
            item.rejected,
            weight,
            item.why,
            item.group_key,
            str(item.id),
        )


def _labels(session: Session, version_id: uuid.UUID, split: str) -> Iterator[LabelRecord]:
    query = _members(LabeledCompletion, DatasetMember.labeled_completion_id, version_id, split)
    for item, weight in _rows(session, query):
        yield LabelRecord(
            item.messages,
            item.completion,
            item.is_desirable,
            weight,
            item.group_key,
            str(item.id),
            why=item.why,
        )


def _tasks(session: Session, version_id: uuid.UUID, split: str) -> Iterator[TaskRecord]:
    query = _members(VerifiableTask, DatasetMember.verifiable_task_id, version_id, split)
    for item, _weight in _rows(session, query):
        yield TaskRecord(
            prompt=item.prompt,
            entry_point=item.entry_point,
            hidden_tests=item.hidden_tests,
            visible_tests=item.visible_tests,
            reference_solution=item.reference_solution,
            task_kind=item.task_kind,
            answer=item.answer,
            difficulty=item.difficulty,
            group_key=item.group_key,
            item_id=str(item.id),
        )
