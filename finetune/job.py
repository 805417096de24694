"""What every recipe does around its trainer: arguments, checkpoints, resume, MLflow, and
saving the adapter. The recipes (`sft.py`, `dpo.py`, `grpo.py`) build the trainer.

A job's directory (`--out`):

    checkpoints/checkpoint-N/   sealed checkpoints (finetune.checkpoint)
    adapter/                    the final LoRA adapter (safetensors), tokenizer, manifest
    run.json                    the MLflow run id, so a resumed job logs to the same run
    cache/                      the datasets library's cache of the export
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import mlflow
import torch
from transformers import Trainer, TrainerCallback

from finetune.checkpoint import CheckpointManifest, StopOnSignal, latest_complete, write_manifest
from finetune.config import TrainingConfig, config_sha256
from finetune.data import Export
from finetune.model import use_bf16
from finetune.suite_logging import suite_callbacks, watch_domain_rewards
from finetune.tracking import MlflowMetrics, git_commit, log_adapter, mlflow_run

log = logging.getLogger("finetune")

INTERRUPTED_EXIT = 75  # EX_TEMPFAIL: stopped cleanly on SIGTERM; run again with --resume


@dataclass(frozen=True)
class Job:
    method: str
    config: TrainingConfig
    dataset: Path
    base: Path
    out: Path
    is_resume: bool = False

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"


@dataclass
class Outcome:
    status: Literal["finished", "interrupted"]
    mlflow_run_id: str
    global_step: int
    adapter_dir: Path | None = None
    adapter_uri: str | None = None
    losses: dict[int, float] = field(default_factory=dict)  # logged loss by step
    train_runtime_s: float | None = None  # the trainer's own measure of `train()`
    tokens_seen: int = 0  # input tokens trained on (non-padding where the recipe counts)

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "mlflow_run_id": self.mlflow_run_id,
            "global_step": self.global_step,
            "adapter_dir": str(self.adapter_dir) if self.adapter_dir else None,
            "adapter_uri": self.adapter_uri,
        }


def training_arguments(config: TrainingConfig, job: Job) -> dict[str, Any]:
    """The TrainingArguments every recipe shares (TRL's configs extend them)."""
    return {
        "output_dir": str(job.checkpoints),
        "seed": config.seed,
        "data_seed": config.seed,
        "learning_rate": config.learning_rate,
        "max_steps": config.max_steps,
        "num_train_epochs": config.num_train_epochs,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "warmup_steps": config.warmup_ratio,  # a float below 1: a share of the steps
        "lr_scheduler_type": config.lr_scheduler_type,
        "weight_decay": config.weight_decay,
        "max_grad_norm": config.max_grad_norm,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": config.save_total_limit,
        "logging_steps": config.logging_steps,
        "bf16": use_bf16(config),
        "gradient_checkpointing": config.gradient_checkpointing,
        "use_liger_kernel": config.use_liger_kernel,
        "use_cpu": not torch.cuda.is_available(),
        "report_to": "none",
        "disable_tqdm": False,  # progress on stderr, wherever it goes
    }


def run_training(
    job: Job,
    export: Export,
    make_trainer: Callable[[list[TrainerCallback]], Trainer],
    *,
    extra_metrics: Callable[[], dict[str, float]] | None = None,
    tags: dict[str, str] | None = None,
) -> Outcome:
    """Train (resuming from the latest sealed checkpoint when asked), logging to MLflow; save
    and log the adapter unless a SIGTERM stopped the run first."""
    stop = StopOnSignal()
    callbacks = [CheckpointManifest(), stop, MlflowMetrics(extra_metrics)]
    trainer = make_trainer([*callbacks, *suite_callbacks(export, job.method, job.out)])
    watch_domain_rewards(trainer, export)
    resume_from = _resume_point(job)
    config = job.config.model_dump(mode="json")
    all_tags = _tags(job, export) | (tags or {})
    with mlflow_run(
        experiment=job.config.mlflow_experiment,
        run_name=f"{job.method}-{export.manifest.get('domain', 'data')}",
        params=config,
        tags=all_tags,
        run_id=_previous_run_id(job),
    ) as run_id:
        (job.out / "run.json").write_text(json.dumps({"mlflow_run_id": run_id}))
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        losses = {
            int(entry["step"]): float(entry["loss"])
            for entry in trainer.state.log_history
            if "loss" in entry
        }
        runtime = [e["train_runtime"] for e in trainer.state.log_history if "train_runtime" in e]
        outcome = Outcome(
            "finished",
            run_id,
            trainer.state.global_step,
            losses=losses,
            train_runtime_s=float(runtime[-1]) if runtime else None,
            tokens_seen=int(trainer.state.num_input_tokens_seen or 0),
        )
        if stop.is_interrupted:
            log.warning("stopped on SIGTERM at step %d: resume with --resume", outcome.global_step)
            outcome.status = "interrupted"
            mlflow.set_tag("flywheel.status", "interrupted")
            return outcome
        outcome.adapter_dir = save_adapter(trainer, job.out / "adapter")
        outcome.adapter_uri = log_adapter(outcome.adapter_dir)
        mlflow.set_tag("flywheel.status", "finished")
    return outcome


def save_adapter(trainer: Trainer, target: Path) -> Path:
    """The adapter (safetensors) and tokenizer, sealed with a manifest, renamed into place."""
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))
    # safetensors and JSON only: the arguments' pickle goes, their JSON stays
    (staging / "training_args.bin").unlink(missing_ok=True)
    (staging / "training_args.json").write_text(trainer.args.to_json_string())
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(str(staging))
    write_manifest(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def _resume_point(job: Job) -> Path | None:
    if not job.is_resume:
        return None
    found = latest_complete(job.checkpoints)
    if found is None:
        log.warning("no complete checkpoint in %s: starting from the beginning", job.checkpoints)
    else:
        log.info("resuming from %s", found)
    return found


def _previous_run_id(job: Job) -> str | None:
    if not job.is_resume:
        return None
    try:
        return str(json.loads((job.out / "run.json").read_text())["mlflow_run_id"])
    except (OSError, ValueError, KeyError):
        return None


def _tags(job: Job, export: Export) -> dict[str, str]:
    return {
        "flywheel.method": job.method,
        "flywheel.dataset_version_id": str(export.dataset_version_id),
        "flywheel.dataset_manifest_sha256": export.manifest_sha256,
        "flywheel.domain": str(export.manifest.get("domain")),
        "flywheel.base_model": str(job.base.resolve()),
        "flywheel.config_sha256": config_sha256(job.config),
        "mlflow.source.git.commit": git_commit(),
    }
