"""KTO: LoRA on the domain's labelled completions (desirable or not) with TRL's KTOTrainer.

The reference model is the base itself with the adapter disabled (TRL does this when given a
peft config and no reference model), as in DPO. Label weights are used by sampling
(finetune.sampling): each epoch draws labels in proportion to their weights, weight 0 never;
under an `easy_first` curriculum they are read in the export's order. TRL reads KTO's rows in
order anyway: its KL baseline comes from each row's neighbours' completions, precomputed over
the file's consecutive batches. A weighted draw mixes those batches, so the KL term is then
estimated from other rows' completions than the batch's own: still mismatched prompt and
completion pairs, and the term is detached (a baseline, not a gradient path).
"""

from __future__ import annotations

from trl.trainer.kto_config import KTOConfig as TrlKtoConfig
from trl.trainer.kto_trainer import KTOTrainer

from finetune.config import KtoConfig
from finetune.data import open_export, train_dataset
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.sampling import WeightedSampling, is_curriculum, sampling_weights


class WeightedKtoTrainer(WeightedSampling, KTOTrainer):
    """Labels drawn by weight (finetune.sampling)."""


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, KtoConfig)
    export = open_export(job.dataset)
    dataset = train_dataset(export, "kto", job.out / "cache")
    dataset = dataset.select_columns(["prompt", "completion", "label", "weight"])
    weights = (
        sampling_weights(dataset["weight"], "label", job.dataset)
        if config.use_label_weights
        else None
    )
    model, tokenizer = load_base(job.base, config)
    args = TrlKtoConfig(
        **training_arguments(config, job),
        beta=config.beta,
        desirable_weight=config.desirable_weight,
        undesirable_weight=config.undesirable_weight,
        max_length=config.max_length,
        include_num_input_tokens_seen="non_padding",
    )
    return run_training(
        job,
        export,
        lambda callbacks: WeightedKtoTrainer(
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
