"""Tags flow from an ingested source to the evaluation's slices: a ticket export's category
and a task file's tags are stored on the signal rows, and every eval item of a dataset version
belongs to its source kind's slice and to each of its tags'."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.reader import version_item_labels
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work
from flywheel.demo.data import write_support
from flywheel.demo.support import CATEGORIES
from flywheel.errors import InvalidInput
from flywheel.evaluation.gate import require_known_slices
from flywheel.evaluation.slices import item_slices, slice_rules
from flywheel.models import DatasetVersion, Domain, SftExample, VerifiableTask
from ingest.runner import run_ingest
from ingest.task_files import TaskFileIngestor
from ingest.tickets.csv_mapping import CsvIngestor
from tests.conftest import Caller


def _domain_id(sessions: sessionmaker[Session]) -> uuid.UUID:
    with sessions() as session:
        return session.scalars(select(Domain.id)).one()


def _tasks(path: Path) -> Path:
    lines = [
        {"task_id": f"t{n}", "kind": "answer", "prompt": f"What is {n}*2?", "answer": str(2 * n),
         "tags": ["topic:multiplication"]}
        for n in range(12)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_ingested_tags_become_eval_slices(
    on_test_database: sessionmaker[Session], acme: Caller, tmp_path: Path
) -> None:
    tickets, _ = write_support(tmp_path)
    domain_id = _domain_id(on_test_database)
    for ingestor in (CsvIngestor(tickets), TaskFileIngestor(_tasks(tmp_path / "tasks.jsonl"))):
        run_ingest(on_test_database, ingestor, tenant_id=acme.tenant_id, domain_id=domain_id)
    with unit_of_work(on_test_database) as session:
        session.execute(VerifiableTask.__table__.update().values(difficulty=0.1))  # type: ignore[attr-defined]
        built = build_dataset_version(
            session=session, tenant_id=acme.tenant_id, domain_id=domain_id,
            recipe=DatasetRecipe(eval_fraction=0.5, replay_fraction=0.0),
        )  # fmt: skip
        built_id = built.version.id

    with on_test_database() as session:
        billing = session.scalars(
            select(SftExample.tags).where(
                SftExample.source_ref == f"csv:{CATEGORIES['billing'][0]}"
            )
        ).one()
        version = session.get_one(DatasetVersion, built_id)
        slices = item_slices(version_item_labels(session, version), slice_rules({}))

    assert billing == ["ticket.category:billing"]
    labels = {label for item in slices.values() for label in item}
    assert {"source:ticket", "source:task_file"} <= labels
    for item in slices.values():
        if "source:task_file" in item:
            assert item == ("difficulty:hard", "source:task_file", "topic:multiplication")
        else:
            assert item[0] == "source:ticket" or item[1] == "source:ticket"
            assert any(label.startswith("ticket.category:") for label in item), item
    require_known_slices({"topic:multiplication": 0.05}, labels)
    with pytest.raises(InvalidInput, match=r"no eval item has: \['topic:division'\]"):
        require_known_slices({"topic:division": 0.05}, labels)
