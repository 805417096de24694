"""SFT: LoRA on the domain's conversations with TRL's SFTTrainer.

Loss on the assistant's tokens only (the chat template marks them; finetune.templates picks a
training variant of a real family's template, or stops at start), optional
packing of examples into full rows (TRL's best-fit-decreasing packing, padding-free).
"""

from __future__ import annotations

from trl.trainer.sft_config import SFTConfig as TrlSftConfig
from trl.trainer.sft_trainer import SFTTrainer

from finetune.config import SftConfig
from finetune.data import open_export, train_dataset
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.templates import use_training_template


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, SftConfig)
    export = open_export(job.dataset)
    dataset = train_dataset(export, "sft", job.out / "cache").select_columns(["messages"])
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
        lambda callbacks: SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(config.lora),
            callbacks=callbacks,
        ),
    )
