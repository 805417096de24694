"""GRPO: LoRA on the domain's verifiable tasks with TRL's GRPOTrainer.

Rewards come from checking each completion: code tasks run against their hidden tests in the
sandbox, answer tasks are matched in-process (finetune.rewards.TaskReward); an optional format
reward is added with its own weight. A share of deliberately impossible tasks (canaries) is
mixed into every run; their pass rate is logged each step, and any pass raises an alarm: a
warning, the run's `flywheel.canary_alarm` tag and the `canary_alarms` metric.
"""

from __future__ import annotations

import logging

import mlflow
from datasets import Dataset
from trl.trainer.grpo_config import GRPOConfig as TrlGrpoConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from finetune.config import GrpoConfig
from finetune.data import open_export, train_dataset
from finetune.dynamic_sampling import DynamicSamplingGRPOTrainer
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.rewards import CanaryMonitor, FormatReward, RewardFunc, TaskReward, mix_canaries
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


def train(job: Job) -> Outcome:
    config = job.config
    assert isinstance(config, GrpoConfig)
    export = open_export(job.dataset)
    tasks = train_dataset(export, "grpo", job.out / "cache")
    rows = mix_canaries(list(tasks), config.canary_fraction, config.seed)
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
    trainer_class = DynamicSamplingGRPOTrainer if config.dynamic_sampling else GRPOTrainer

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
