"""DPO: LoRA on the domain's preference pairs with TRL's DPOTrainer.

The reference model is the base itself with the adapter disabled (TRL does this when given a
peft config and no reference model): no second copy of the model in memory. Pair weights are
used by sampling: each step draws pairs in proportion to their weights (a pair of weight 2 is
seen twice as often as one of weight 1, weight 0 never), which gives the weighted loss's
gradient in expectation without touching TRL's loss code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler
from trl.trainer.dpo_config import DPOConfig as TrlDpoConfig
from trl.trainer.dpo_trainer import DPOTrainer

from finetune.config import DpoConfig
from finetune.data import open_export, train_dataset
from finetune.errors import TrainingInputError
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config


class WeightedPairs(Sampler[int]):
    """Indices drawn with replacement in proportion to the weights; the same seed and epoch
    draw the same indices (so a resumed run sees what the uninterrupted one would have)."""

    def __init__(self, weights: list[float], seed: int) -> None:
        self.weights = torch.tensor(weights, dtype=torch.double)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.weights)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        drawn = torch.multinomial(self.weights, len(self.weights), True, generator=generator)
        return iter(drawn.tolist())


class WeightedDpoTrainer(DPOTrainer):
    def __init__(self, *args: Any, pair_weights: list[float] | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pair_weights = pair_weights

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler[int] | None:
        if self.pair_weights is None:
            return super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        assert len(dataset) == len(self.pair_weights), "pairs and weights out of step"
        return WeightedPairs(self.pair_weights, self.args.seed)


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, DpoConfig)
    export = open_export(job.dataset)
    dataset = train_dataset(export, "dpo", job.out / "cache")
    weights = [float(w) for w in dataset["weight"]] if config.use_pair_weights else None
    if weights is not None and not any(weight > 0 for weight in weights):
        raise TrainingInputError(f"{job.dataset}: every preference pair has weight 0")
    dataset = dataset.select_columns(["prompt", "chosen", "rejected"])
    model, tokenizer = load_base(job.base, config)
    args = TrlDpoConfig(
        **training_arguments(config, job),
        beta=config.beta,
        max_length=config.max_length,
        include_num_input_tokens_seen="non_padding",
    )
    return run_training(
        job,
        export,
        lambda callbacks: WeightedDpoTrainer(
            model=model,
            ref_model=None,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(config.lora),
            callbacks=callbacks,
            pair_weights=weights,
        ),
    )
