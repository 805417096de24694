"""How a recipe's trainer reads its train rows: item weights and the export's curriculum.

Every item of an export carries a weight (its signal's weight times its source's weight in the
version's recipe). The recipes use weights by sampling, not by scaling the loss: each epoch
draws `len(rows)` rows with replacement in proportion to their weights, so a row of weight 3
is seen about three times as often as one of weight 1, and a row of weight 0 never. In
expectation that is the weighted loss's gradient, with no change to TRL's loss code, the same
for every trainer (SFT's token-averaged loss, DPO's and KTO's per-example losses, GRPO's
groups), and a weight-0 row costs no compute.

When the version's recipe says `curriculum: easy_first`, the export's rows are in curriculum
order and the trainer reads them in that order, without TRL's reshuffle. With weights too,
each epoch's weighted draw is sorted back into file order (a stable sort of the drawn row
indices): the curriculum's order and the weights' counts both hold; a heavy row appears
several times in a row where it stands in the curriculum.

A sampler's draws depend on its seed and the epoch only (`set_epoch`, which the Trainer calls),
so a resumed run sees the rows the uninterrupted one would have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler, SequentialSampler

from finetune.data import Export
from finetune.errors import TrainingInputError

log = logging.getLogger("finetune.sampling")

EASY_FIRST = "easy_first"


def is_curriculum(export: Export) -> bool:
    """Whether the export's rows are in a curriculum order the trainer must keep."""
    recipe = export.manifest.get("recipe") or {}
    return isinstance(recipe, dict) and recipe.get("curriculum") == EASY_FIRST


def sampling_weights(weights: Sequence[Any], what: str, where: object) -> list[float] | None:
    """The weights to sample by, or None when they are all equal (a plain permutation then
    sees every row once an epoch, with less noise than draws); a TrainingInputError when none
    is above 0."""
    found = [1.0 if weight is None else float(weight) for weight in weights]
    if not any(weight > 0 for weight in found):
        raise TrainingInputError(f"{where}: every {what} has weight 0")
    return None if len(set(found)) == 1 else found


def draw(
    weights: torch.Tensor, count: int, seed: int, epoch: int, *, is_ordered: bool
) -> list[int]:
    """`count` row indices drawn with replacement in proportion to `weights`; in row order
    when `is_ordered` (the curriculum), else in the order drawn."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    drawn = torch.multinomial(weights, count, True, generator=generator)
    if is_ordered:
        drawn = torch.sort(drawn, stable=True).values
    return [int(index) for index in drawn.tolist()]


def draw_once(weights: Sequence[float], seed: int) -> list[int]:
    """One epoch's draw, in row order: for a trainer that cannot take a sampler (packing)."""
    tensor = torch.tensor(list(weights), dtype=torch.double)
    return draw(tensor, len(tensor), seed, 0, is_ordered=True)


class WeightedSampler(Sampler[int]):
    """One epoch: `len(weights)` rows drawn in proportion to their weights (see the module)."""

    def __init__(self, weights: Sequence[float], seed: int, *, is_ordered: bool = False) -> None:
        self.weights = torch.tensor(list(weights), dtype=torch.double)
        self.seed, self.is_ordered = seed, is_ordered
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.weights)

    def __iter__(self) -> Iterator[int]:
        indices = draw(self.weights, len(self), self.seed, self.epoch, is_ordered=self.is_ordered)
        return iter(indices)


class WeightedSampling:
    """A mixin for a TRL trainer: its train sampler draws by the rows' weights and keeps the
    curriculum's order (see the module). Weights come from the trainer's own train dataset's
    `weight` column when it kept one (so rows TRL dropped while preparing take their weights
    with them), else from `sample_weights`, one per row."""

    args: Any  # the trainer's TrainingArguments
    sample_weights: list[float] | None = None
    is_ordered: bool = False

    def __init__(
        self, *args: Any, sample_weights: list[float] | None, is_ordered: bool, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sample_weights, self.is_ordered = sample_weights, is_ordered

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler[int] | None:
        dataset: Any = getattr(self, "train_dataset", None)
        if dataset is None:
            dataset = train_dataset
        weights = row_weights(dataset, self.sample_weights)
        seed = int(self.args.seed)
        if weights is not None:
            return WeightedSampler(weights, seed, is_ordered=self.is_ordered)
        if self.is_ordered:
            return SequentialSampler(dataset)
        return super()._get_train_sampler(train_dataset)  # type: ignore[misc]


def row_weights(dataset: Any, fallback: list[float] | None) -> list[float] | None:
    """One weight per row of `dataset`: its `weight` column when weights are used at all."""
    if fallback is None:
        return None
    if "weight" in (getattr(dataset, "column_names", None) or ()):
        return [1.0 if weight is None else float(weight) for weight in dataset["weight"]]
    if len(dataset) != len(fallback):
        raise AssertionError(f"{len(dataset)} rows but {len(fallback)} weights")
    return fallback


class WeightedRepeatSampler(Sampler[int]):
    """TRL's `RepeatSampler` (GRPO's) with the weighted draw in place of its permutation: each
    epoch draws `len(weights)` prompts by weight (in file order under a curriculum), cuts them
    into chunks of `batch_size` distinct draws (dropping a short last one, as TRL does), and
    yields each chunk `repeat_count` times, each index `mini_repeat_count` times in a row (the
    group of generations for one prompt)."""

    def __init__(
        self,
        weights: Sequence[float],
        *,
        mini_repeat_count: int,
        batch_size: int,
        repeat_count: int,
        seed: int,
        is_ordered: bool = False,
    ) -> None:
        self.weights = torch.tensor(list(weights), dtype=torch.double)
        self.mini_repeat_count, self.batch_size = mini_repeat_count, batch_size
        self.repeat_count, self.seed, self.is_ordered = repeat_count, seed, is_ordered
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        rows = len(self.weights) // self.batch_size * self.batch_size
        return rows * self.mini_repeat_count * self.repeat_count

    def __iter__(self) -> Iterator[int]:
        drawn = draw(
            self.weights, len(self.weights), self.seed, self.epoch, is_ordered=self.is_ordered
        )
        whole = len(drawn) // self.batch_size * self.batch_size
        for start in range(0, whole, self.batch_size):
            chunk = drawn[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count
