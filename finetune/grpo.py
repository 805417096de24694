"""GRPO: LoRA on the domain's verifiable tasks with TRL's GRPOTrainer.

Rewards come from checking each completion: code tasks run against their hidden tests in the
sandbox, answer tasks are matched in-process (finetune.rewards.TaskReward); an optional format
reward is added with its own weight. A share of deliberately impossible tasks (canaries) is
mixed into every run, only of the kinds the tasks have; their pass rate is logged each step,
and any pass raises an alarm: a warning, the run's `flywheel.canary_alarm` tag and the
`canary_alarms` metric. Only code tasks (and so code canaries) need the sandbox, which is
checked before the model loads: an answer-only domain trains without one.
"""

from __future__ import annotations

import logging
from typing import Any

import mlflow
from datasets import Dataset
from trl.trainer.grpo_config import GRPOConfig as TrlGrpoConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from finetune.canaries import preflight_sandbox
from finetune.config import GrpoConfig
from finetune.data import open_export, train_dataset
from finetune.dynamic_sampling import DynamicSamplingGRPOTrainer
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.rewards import (
    CanaryMonitor,
    FormatReward,
    RewardFunc,
    TaskReward,
    canary_kinds,
    mix_canaries,
)
from finetune.sampling import WeightedRepeatSampler, is_curriculum, sampling_weights
from flywheel.sandbox.rewards import CodeReward

log = logging.getLogger("finetune.grpo")


class CanaryAlarm:
    """Counts alarms and records the first in the MLflow run."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, message: str) -> None:
        self.count += 1
        log.warning("canary alarm: %s", message)
        if mlflow.active_run() is not None and self.count == 1:
            mlflow.set_tag("flywheel.canary_alarm", message[:5000])


class WeightedGrpoTrainer(GRPOTrainer):
    """Prompts drawn in proportion to their tasks' weights (finetune.sampling), in the
    export's order under a curriculum, with TRL's repeat-per-generation structure kept."""

    def __init__(
        self, *args: Any, task_weights: list[float] | None, is_ordered: bool, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.task_weights, self.is_ordered = task_weights, is_ordered

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        dataset = self.train_dataset if dataset is None else dataset
        shape = {
            "mini_repeat_count": self.num_generations,
            "batch_size": self.args.generation_batch_size // self.num_generations,
            "repeat_count": self.num_iterations * self.args.steps_per_generation,
            "seed": self.args.seed,
        }
        if self.task_weights is None:
            shuffle = self.shuffle_dataset and not self.is_ordered
            return RepeatSampler(data_source=dataset, shuffle=shuffle, **shape)
        assert len(dataset) == len(self.task_weights), "tasks and weights out of step"
        return WeightedRepeatSampler(self.task_weights, is_ordered=self.is_ordered, **shape)


class WeightedDynamicSamplingTrainer(WeightedGrpoTrainer, DynamicSamplingGRPOTrainer):
    """Weighted prompts (the sampler) and zero-signal groups masked (generate-and-score)."""


def prompt_weights(rows: list[dict[str, Any]], where: object) -> list[float] | None:
    """Each row's weight (1 when the export has none); a canary weighs the tasks' mean, so
    the canaries keep the share of draws `canary_fraction` gives them."""
    own = [row.get("weight") for row in rows if not row.get("is_canary")]
    tasks = [1.0 if weight is None else float(weight) for weight in own]
    mean = sum(tasks) / len(tasks) if tasks else 1.0
    weights = [mean if row.get("is_canary") else row.get("weight") for row in rows]
    return sampling_weights(weights, "task", where)


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, GrpoConfig)
    export = open_export(job.dataset)
    tasks = train_dataset(export, "grpo", job.out / "cache")
    regular = list(tasks)
    preflight_sandbox(regular)
    rows = mix_canaries(regular, config.canary_fraction, config.seed, canary_kinds(regular))
    dataset = Dataset.from_list(rows)
    alarm = CanaryAlarm()
    task_reward = TaskReward(code_reward=CodeReward(mode=config.code_reward))
    monitor = CanaryMonitor(task_reward, on_alarm=alarm)
    rewards: list[RewardFunc] = [monitor]
    weights = [1.0]
    if config.format_reward_weight > 0:
        rewards.append(FormatReward())
        weights.append(config.format_reward_weight)
    model, tokenizer = load_base(job.base, config)
    args = TrlGrpoConfig(
        **training_arguments(config, job),
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        temperature=config.temperature,
        beta=config.beta,
        use_vllm=config.use_vllm,
        reward_weights=weights,
        **trl_loss_arguments(config),
    )
    trainer_class = (
        WeightedDynamicSamplingTrainer if config.dynamic_sampling else WeightedGrpoTrainer
    )

    def canary_metrics() -> dict[str, float]:
        return {"canary_pass_rate": monitor.pass_rate, "canary_alarms": float(alarm.count)}

    return run_training(
        job,
        export,
        lambda callbacks: trainer_class(
            model=model,
            reward_funcs=rewards,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(config.lora),
            callbacks=callbacks,
            task_weights=prompt_weights(rows, job.dataset),
            is_ordered=is_curriculum(export),
        ),
        extra_metrics=canary_metrics,
        tags={"flywheel.canaries": str(len(rows) - len(tasks))},
    )


def trl_loss_arguments(config: GrpoConfig) -> dict[str, object]:
    """Our GRPO knobs that are TRL `GRPOConfig` fields of the same name, passed unchanged."""
    return {
        "loss_type": config.loss_type,
        "epsilon": config.epsilon,
        "epsilon_high": config.epsilon_high,
        "num_iterations": config.num_iterations,
        "steps_per_generation": config.steps_per_generation,
        "scale_rewards": config.scale_rewards,
        "mask_truncated_completions": config.mask_truncated_completions,
        "vllm_mode": config.vllm_mode,
    }
