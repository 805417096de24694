"""Training configs: YAML parsed into typed models, with `key=value` overrides.

    config = load_config("dpo", Path("dpo.yaml"), ["beta=0.2", "lora.r=8"])

Unknown keys and impossible values (a learning rate <= 0, `num_generations` that does not
divide the generation batch) are errors before anything loads. The resolved config is what a
run logs to MLflow and hashes, so two runs with equal hashes trained alike.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from finetune.errors import TrainingInputError

Method = Literal["sft", "dpo", "kto", "grpo"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraSettings(Strict):
    """peft LoRA: which layers get adapters and how large."""

    r: int = Field(16, ge=1, le=1024, description="Rank of the update matrices.")
    alpha: int = Field(32, ge=1, description="Scale: the update is multiplied by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt, or every linear layer but the head."
    )


class CommonConfig(Strict):
    """What every recipe shares. Names follow transformers' TrainingArguments."""

    seed: int = 0
    learning_rate: float = Field(2e-4, gt=0, le=1)
    max_steps: int = Field(-1, ge=-1, description="-1: train num_train_epochs instead.")
    num_train_epochs: float = Field(1.0, gt=0)
    per_device_train_batch_size: int = Field(8, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    lr_scheduler_type: str = "linear"
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_length: int = Field(1024, ge=8, description="Tokens per example (prompt + completion).")
    lora: LoraSettings = LoraSettings()
    save_steps: int = Field(100, ge=1, description="Checkpoint every N optimizer steps.")
    save_total_limit: int = Field(2, ge=1)
    logging_steps: int = Field(10, ge=1)
    bf16: Literal["auto"] | bool = Field("auto", description="auto: on a GPU that supports it.")
    gradient_checkpointing: bool = False
    use_liger_kernel: bool = Field(False, description="Liger's fused kernels, when installed.")
    mlflow_experiment: str = "flywheel"


class SftConfig(CommonConfig):
    method: Literal["sft"] = "sft"
    packing: bool = Field(False, description="Pack examples into full rows (padding-free).")
    assistant_only_loss: bool = Field(True, description="Loss on the assistant's tokens only.")


class DpoConfig(CommonConfig):
    method: Literal["dpo"] = "dpo"
    learning_rate: float = Field(5e-5, gt=0, le=1)
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference.")
    use_pair_weights: bool = Field(
        True, description="Sample pairs in proportion to their weights (weight 0: never)."
    )


class KtoConfig(CommonConfig):
    """KTO learns from single completions labelled desirable or not (a thumbs up or down),
    no pair needed. The batch's other completions estimate the KL baseline, so a batch holds
    at least two examples."""

    method: Literal["kto"] = "kto"
    learning_rate: float = Field(5e-5, gt=0, le=1)
    per_device_train_batch_size: int = Field(8, ge=2, description="At least 2 (the KL term).")
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference.")
    desirable_weight: float = Field(
        1.0, gt=0, description="Loss weight of desirable completions (to balance the labels)."
    )
    undesirable_weight: float = Field(
        1.0, gt=0, description="Loss weight of undesirable completions (to balance the labels)."
    )
    use_label_weights: bool = Field(
        True, description="Sample labels in proportion to their weights (weight 0: never)."
    )


GrpoLoss = Literal["dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo"]


class GrpoConfig(CommonConfig):
    """GRPO. The loss, clipping, reuse and scaling knobs are TRL's `GRPOConfig` fields of the
    same names, passed through unchanged; `dynamic_sampling` is ours (finetune.dynamic_sampling)."""

    method: Literal["grpo"] = "grpo"
    learning_rate: float = Field(1e-5, gt=0, le=1)
    num_generations: int = Field(4, ge=2, description="Completions per prompt (the group).")
    max_completion_length: int = Field(256, ge=1)
    temperature: float = Field(1.0, gt=0)
    beta: float = Field(0.0, ge=0, description="KL coefficient (0: no reference model).")
    loss_type: GrpoLoss = Field(
        "dapo",
        description="How token losses are aggregated: 'dapo' (tokens of the whole generation "
        "batch, no length bias), 'grpo' (per-sequence mean), 'dr_grpo' (a constant), 'bnpo' "
        "(tokens of the local batch), 'cispo' or 'sapo' (their own clipping).",
    )
    epsilon: float = Field(0.2, gt=0, lt=1, description="Lower clip of the ratio: 1 - epsilon.")
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip of the ratio, 1 + epsilon_high (DAPO's clip-higher, e.g. 0.28); "
        "None: epsilon. Under 'cispo' it is the cap of the ratio itself.",
    )
    num_iterations: int = Field(
        1, ge=1, description="Optimisation passes over each generated batch (mu in the paper)."
    )
    steps_per_generation: int | None = Field(
        None,
        ge=1,
        description="Optimizer micro-steps each generation feeds (a generation batch is this "
        "many per-device batches); None: gradient_accumulation_steps.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="Advantages divided by the group's reward std, the batch's, or not at all "
        "(Dr. GRPO: no question-difficulty bias).",
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave completions cut off at max_completion_length out of the loss."
    )
    max_tool_calling_iterations: int | None = Field(
        20,
        ge=1,
        description="Rounds of tool calls in one user turn of an environment episode (None: "
        "until the episode's token budget, which bounds the whole trajectory: calls, results, "
        "answers, later user turns).",
    )
    max_turns: int = Field(
        1,
        ge=1,
        description="User turns of an environment task played in one episode: after the "
        "model answers turn k, turn k+1 is appended and the episode goes on; the reward checks "
        "the final state against the played turns' ground truth (1: the first turn only).",
    )
    max_episode_tokens: int | None = Field(
        None,
        ge=1,
        description="Token budget of an environment episode after its prompt (the model's "
        "replies, tool results, later user turns; e.g. 4096); an episode it cuts off is masked "
        "out of the loss and rewarded 0. None: max_completion_length. Each reply is still at "
        "most max_completion_length.",
    )
    dynamic_sampling: bool = Field(
        True,
        description="Leave groups whose rewards are all equal (no learning signal) out of the "
        "loss, so they do not dilute it; their share is logged as "
        "dynamic_sampling/filtered_share.",
    )
    code_reward: Literal["fraction", "all_or_nothing"] = "fraction"
    format_reward_weight: float = Field(0.0, ge=0, description="0: no format reward.")
    tool_call_partial_credit: float = Field(
        0.0,
        ge=0,
        le=1,
        description="A tool-call task's reward for the right function names with wrong "
        "arguments (a matching call set earns 1).",
    )
    canary_fraction: float = Field(
        0.02, ge=0, lt=0.5, description="Share of impossible tasks mixed in (reward hacking)."
    )
    use_vllm: bool = Field(False, description="Generate with vLLM, when installed.")
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate",
        description="With use_vllm: 'colocate' (vLLM in the training process, sharing its GPU) "
        "or 'server' (a separate `trl vllm-serve` process).",
    )

    @model_validator(mode="after")
    def _generations_divide_the_batch(self) -> Self:
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        batch = self.per_device_train_batch_size * steps
        if batch % self.num_generations:
            raise ValueError(
                f"num_generations ({self.num_generations}) must divide the generation batch "
                f"per_device_train_batch_size x steps_per_generation ({batch})"
            )
        return self

    @model_validator(mode="after")
    def _clip_range(self) -> Self:
        if self.loss_type == "cispo":
            if self.epsilon_high is None:
                raise ValueError("loss_type 'cispo' needs epsilon_high (its ratio cap, e.g. 5.0)")
        elif self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(
                f"epsilon_high ({self.epsilon_high}) must be at least epsilon ({self.epsilon}): "
                "clip-higher widens the upper bound"
            )
        return self

    @model_validator(mode="after")
    def _episode_budget_holds_a_reply(self) -> Self:
        if self.max_episode_tokens is not None and (
            self.max_episode_tokens < self.max_completion_length
        ):
            raise ValueError(
                f"max_episode_tokens ({self.max_episode_tokens}) must be at least "
                f"max_completion_length ({self.max_completion_length}): an episode holds replies"
            )
        return self

    @property
    def episode_tokens(self) -> int:
        """An environment episode's token budget (max_episode_tokens, or the completion's)."""
        return self.max_episode_tokens or self.max_completion_length

    @model_validator(mode="after")
    def _vllm_mode_needs_vllm(self) -> Self:
        if self.vllm_mode != "colocate" and not self.use_vllm:
            raise ValueError(f"vllm_mode {self.vllm_mode!r} needs use_vllm=true")
        return self


TrainingConfig = SftConfig | DpoConfig | KtoConfig | GrpoConfig
CONFIGS: dict[str, type[TrainingConfig]] = {
    "sft": SftConfig,
    "dpo": DpoConfig,
    "kto": KtoConfig,
    "grpo": GrpoConfig,
}


def load_config(method: str, path: Path | None, overrides: list[str]) -> TrainingConfig:
    """The method's config from a YAML file (optional) and `key=value` overrides (dotted keys
    reach nested settings: `lora.r=8`; values are read as YAML: `8`, `true`, `[q_proj]`)."""
    if method not in CONFIGS:
        raise TrainingInputError(f"unknown method {method!r}: sft, dpo, kto or grpo")
    data: dict[str, Any] = _read_yaml(path) if path is not None else {}
    for override in overrides:
        _apply(data, override)
    data.setdefault("method", method)
    if data["method"] != method:
        raise TrainingInputError(f"the config is for {data['method']!r}, not {method!r}")
    try:
        return CONFIGS[method].model_validate(data)
    except ValidationError as error:
        raise TrainingInputError(_one_line(error)) from error


def config_sha256(config: TrainingConfig) -> str:
    text = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise TrainingInputError(f"cannot read config {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise TrainingInputError(f"config {path} is not valid YAML: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TrainingInputError(f"config {path} must be a mapping of settings")
    return data


def _apply(data: dict[str, Any], override: str) -> None:
    key, sign, raw = override.partition("=")
    if not sign or not key.strip():
        raise TrainingInputError(f"an override is KEY=VALUE, not {override!r}")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrainingInputError(f"{key}: {part} is not a group of settings")
        node = child
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise TrainingInputError(f"{key}: cannot read value {raw!r}") from error


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "config"
    if first["type"] == "extra_forbidden":
        return f"unknown config key {where!r}"
    return f"config {where}: {first['msg']}" + (
        f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    )
