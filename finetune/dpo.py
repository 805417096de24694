"""DPO: LoRA on the domain's preference pairs with TRL's DPOTrainer.

The reference model is the base itself with the adapter disabled (TRL does this when given a
peft config and no reference model): no second copy of the model in memory. Pair weights are
used by sampling: each step draws pairs in proportion to their weights (a pair of weight 2 is
seen twice as often as one of weight 1, weight 0 never), which gives the weighted loss's
gradient in expectation without touching TRL's loss code; under an `easy_first` curriculum
the pairs are read in the export's order (finetune.sampling).
"""

from __future__ import annotations

from trl.trainer.dpo_config import DPOConfig as TrlDpoConfig
from trl.trainer.dpo_trainer import DPOTrainer

from finetune.config import DpoConfig
from finetune.data import open_export, train_dataset
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.sampling import WeightedSampling, is_curriculum, sampling_weights


class WeightedDpoTrainer(WeightedSampling, DPOTrainer):
    """Pairs drawn by weight (finetune.sampling)."""


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, DpoConfig)
    export = open_export(job.dataset)
    dataset = train_dataset(export, "dpo", job.out / "cache")
    weights = (
        sampling_weights(dataset["weight"], "preference pair", job.dataset)
        if config.use_pair_weights
        else None
    )
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
            sample_weights=weights,
            is_ordered=is_curriculum(export),
        ),
    )
