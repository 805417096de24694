"""Every signal as recorded: the recipes' trainers draw rows by the export's weights (a weight-3
row about three times as often as a weight-1 row, weight 0 never) and, under an `easy_first`
curriculum, read them in the export's order. The trainers are the recipes' own, built from a
real export on a tiny model; only `run_training` is replaced, to keep the trainer untrained."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from finetune import dpo, grpo, kto, sft, synthetic
from finetune.config import load_config
from finetune.job import Job, Outcome
from tests.finetune.conftest import (
    TRAINING,
    answer_record,
    label_record,
    pair_record,
    sft_record,
    write_export,
)

pytestmark = TRAINING
PROBLEMS = synthetic.split_problems().train[:12]
WEIGHTS = [3.0, 1.0, 0.0] * 4  # row i weighs WEIGHTS[i]
RECIPES: dict[str, ModuleType] = {"sft": sft, "dpo": dpo, "kto": kto, "grpo": grpo}
SETTINGS = {
    "sft": ["per_device_train_batch_size=2"],
    "dpo": ["per_device_train_batch_size=2"],
    "kto": ["per_device_train_batch_size=2"],
    "grpo": ["per_device_train_batch_size=4", "num_generations=2", "canary_fraction=0"],
}


def weighted_export(root: Path, curriculum: str = "none") -> Path:
    return write_export(
        root,
        sft=[sft_record(p, w) for p, w in zip(PROBLEMS, WEIGHTS, strict=True)],
        pairs=[pair_record(p, w) for p, w in zip(PROBLEMS, WEIGHTS, strict=True)],
        labels=[
            label_record(p, is_desirable=i % 2 == 0, weight=w)
            for i, (p, w) in enumerate(zip(PROBLEMS, WEIGHTS, strict=True))
        ],
        tasks=[answer_record(p, w) for p, w in zip(PROBLEMS, WEIGHTS, strict=True)],
        curriculum=curriculum,
    )


def built_trainer(
    monkeypatch: pytest.MonkeyPatch, method: str, export: Path, base: Path, out: Path
) -> Any:
    """The trainer the method's recipe builds for this export, not trained."""
    built: list[Any] = []

    def keep(job: Job, _export: Any, make_trainer: Any, **_: Any) -> Outcome:
        built.append(make_trainer([]))
        return Outcome("finished", "no-run", 0)

    recipe = RECIPES[method]
    monkeypatch.setattr(recipe, "run_training", keep)
    config = load_config(method, None, SETTINGS[method])
    recipe.train(Job(method, config, export, base, out))
    return built[0]


def drawn_rows(trainer: Any, epochs: int) -> Counter[int]:
    """How often each row was drawn over `epochs` epochs of the trainer's own sampler."""
    sampler = trainer._get_train_sampler()
    counts: Counter[int] = Counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        counts.update(sampler)
    return counts


@pytest.mark.parametrize("method", ["sft", "kto", "grpo", "dpo"])
def test_rows_are_drawn_in_proportion_to_their_weights(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plain_base: Path, method: str
) -> None:
    export = weighted_export(tmp_path / "export")
    trainer = built_trainer(monkeypatch, method, export, plain_base, tmp_path / "job")
    assert len(trainer.train_dataset) == len(WEIGHTS)  # row i of the trainer is row i of the file

    counts = drawn_rows(trainer, epochs=200)

    by_weight = Counter[float]()
    for row, times in counts.items():
        by_weight[WEIGHTS[row]] += times
    assert by_weight[0.0] == 0
    assert 2.6 < by_weight[3.0] / by_weight[1.0] < 3.4
    if method == "grpo":  # TRL's structure: each prompt drawn is repeated num_generations times
        indices = list(trainer._get_train_sampler())
        assert indices[0::2] == indices[1::2]


def test_with_easy_first_the_dataloader_yields_rows_in_file_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plain_base: Path
) -> None:
    export = write_export(
        tmp_path / "export", sft=[sft_record(p) for p in PROBLEMS], curriculum="easy_first"
    )
    trainer = built_trainer(monkeypatch, "sft", export, plain_base, tmp_path / "job")
    in_file_order = [tuple(ids) for ids in trainer.train_dataset["input_ids"]]
    assert len(set(in_file_order)) == len(PROBLEMS)

    for epoch in range(2):  # no reshuffle, epoch after epoch
        seen = [tuple(ids) for ids in rows_of(trainer, epoch)]
        assert seen == in_file_order


def test_with_easy_first_and_weights_each_epoch_is_a_weighted_draw_in_file_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plain_base: Path
) -> None:
    export = weighted_export(tmp_path / "export", curriculum="easy_first")
    for method in ("sft", "kto", "grpo"):
        trainer = built_trainer(monkeypatch, method, export, plain_base, tmp_path / method)
        sampler = trainer._get_train_sampler()
        for epoch in range(3):
            sampler.set_epoch(epoch)
            drawn = list(sampler)
            assert drawn == sorted(drawn), method
            assert not {row for row in drawn if WEIGHTS[row] == 0}, method
            assert len(set(drawn)) < len(drawn), method  # repeats: the heavy rows


def test_without_a_curriculum_or_weights_trl_shuffles_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plain_base: Path
) -> None:
    export = write_export(tmp_path / "export", sft=[sft_record(p) for p in PROBLEMS])
    trainer = built_trainer(monkeypatch, "sft", export, plain_base, tmp_path / "job")

    assert sorted(trainer._get_train_sampler()) == list(range(len(PROBLEMS)))  # a permutation


def rows_of(trainer: Any, epoch: int) -> list[list[int]]:
    """The input ids of every row the trainer's train dataloader yields in one epoch."""
    loader = trainer.get_train_dataloader()
    loader.set_epoch(epoch)
    rows: list[list[int]] = []
    for batch in loader:
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            rows.append([int(i) for i, m in zip(ids, mask, strict=True) if m])
    return rows


def test_the_grpo_export_rows_weigh_what_the_version_says(tmp_path: Path) -> None:
    export = weighted_export(tmp_path / "export")
    rows = [json.loads(line) for line in (export / "train/grpo.jsonl").read_text().splitlines()]

    assert [row["weight"] for row in rows] == WEIGHTS
