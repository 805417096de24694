"""SFT: LoRA on the domain's conversations with TRL's SFTTrainer.

Loss on the assistant's tokens only (the chat template marks them; finetune.templates picks a
training variant of a real family's template, or stops at start), optional
packing of examples into full rows (TRL's best-fit-decreasing packing, padding-free).

Item weights are used by sampling (finetune.sampling), not by a weighted loss: TRL's SFT loss
averages over tokens across the batch, so a per-example loss weight would need its own loss
and collator, and would still spend compute on weight-0 rows. Each epoch draws examples in
proportion to their weights; under an `easy_first` curriculum they are read in the export's
order. A packed row holds several examples, so with packing the weighted draw is made once,
before packing (the packed rows hold the drawn examples, repeats included), and the packer's
order replaces the curriculum's.

Tool-calling conversations keep their `tools` (TRL renders them per example). The loss covers
the assistant's turns, tool calls included, and not the tool results (`tool` turns sit outside
the template's `{% generation %}` markers): TRL's training variants of Qwen 2.5 / 3 and
Flywheel's of Llama 3.1 / 3.2 mark an assistant's tool calls as generated text.
"""

from __future__ import annotations

import logging

from datasets import Dataset
from trl.trainer.sft_config import SFTConfig as TrlSftConfig
from trl.trainer.sft_trainer import SFTTrainer

from finetune.config import SftConfig
from finetune.data import open_export, train_dataset
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.sampling import WeightedSampling, draw_once, is_curriculum, sampling_weights
from finetune.templates import use_training_template

log = logging.getLogger("finetune.sft")

SFT_COLUMNS = ("messages", "tools", "weight")
"""`tools`: the tools a tool-calling conversation offered, rendered by the chat template."""


class WeightedSftTrainer(WeightedSampling, SFTTrainer):
    """Examples drawn by weight (finetune.sampling)."""


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, SftConfig)
    export = open_export(job.dataset)
    dataset = train_dataset(export, "sft", job.out / "cache")
    dataset = dataset.select_columns([c for c in SFT_COLUMNS if c in dataset.column_names])
    weights = sampling_weights(dataset["weight"], "example", job.dataset)
    is_ordered = is_curriculum(export)
    if config.packing:
        dataset, weights = _drawn_for_packing(dataset, weights, config.seed, is_ordered), None
        is_ordered = False
    model, tokenizer = load_base(job.base, config)
    if config.assistant_only_loss:
        use_training_template(tokenizer, job.base)
    args = TrlSftConfig(
        **training_arguments(config, job),
        max_length=config.max_length,
        packing=config.packing,
        assistant_only_loss=config.assistant_only_loss,
        include_num_input_tokens_seen="non_padding",
    )
    return run_training(
        job,
        export,
        lambda callbacks: WeightedSftTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(config.lora),
            callbacks=callbacks,
            sample_weights=weights,
            is_ordered=is_ordered,
        ),
    )


def _drawn_for_packing(
    dataset: Dataset, weights: list[float] | None, seed: int, is_ordered: bool
) -> Dataset:
    if is_ordered:
        log.warning("packing reorders the examples: the export's curriculum order is not kept")
    if weights is None:
        return dataset
    return dataset.select(draw_once(weights, seed))
