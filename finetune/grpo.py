"""GRPO: LoRA on the domain's verifiable tasks with TRL's GRPOTrainer.

Rewards come from checking each completion: code tasks run against their hidden tests in the
sandbox, answer tasks are matched in-process (finetune.rewards.TaskReward); an optional format
reward is added with its own weight. A share of deliberately impossible tasks (canaries) is
mixed into every run, only of the kinds the tasks have; their pass rate is logged each step,
and any pass raises an alarm: a warning, the run's `flywheel.canary_alarm` tag and the
`canary_alarms` metric. Only code tasks (and so code canaries) need the sandbox, which is
checked before the model loads: an answer-only domain trains without one.

Tools and environments (issue 20). A row with `tools` (JSON text in the export) is prompted
with them through the chat template's tools section, each row with its own (`_tokenize_prompts`:
TRL renders per-row tools only for environments, and then from the methods' schemas; here every
row's prompt shows its own JSON). Tool-call tasks are scored by the task reward's "tool_call"
route (finetune.rewards.ToolCallReward) from the completion's first assistant turn; their calls
are not executed. Environment tasks go through TRL's `environment_factory` (finetune.environments:
one class per tool set, one sandboxed episode per rollout): the model calls tools until it
answers without one or `max_tool_calling_iterations` rounds are spent, tool results are masked
out of the loss (TRL's tool mask), and the episode's final-state check is its reward, logged
per environment class (`rewards/<class>/mean`) beside the task and format rewards. An episode
cut off by its token budget or by the round limit is masked out of the loss and rewarded 0,
whatever `mask_truncated_completions` says (that knob governs the other rows). Multi-turn
episodes (`max_turns`, `max_episode_tokens`): finetune.multiturn plays a task's later user
turns inside TRL's loop; an episode with turns left at the end is cut off too.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

import mlflow
import torch
from datasets import Dataset
from trl.chat_template_utils import add_response_schema
from trl.trainer.grpo_config import GRPOConfig as TrlGrpoConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from finetune.canaries import preflight_sandbox
from finetune.config import GrpoConfig
from finetune.data import open_export, train_dataset
from finetune.dynamic_sampling import DynamicSamplingGRPOTrainer, mask_rows
from finetune.environments import (
    EnvironmentEpisode,
    preflight_environments,
    route_environments,
    row_tools,
)
from finetune.errors import TrainingInputError
from finetune.job import Job, Outcome, run_training, training_arguments
from finetune.model import load_base, lora_config
from finetune.multiturn import play_episodes
from finetune.rewards import (
    GRPO_CANARY_KINDS,
    CanaryMonitor,
    FormatReward,
    RewardFunc,
    TaskReward,
    ToolCallReward,
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


class ToolGrpoTrainer(GRPOTrainer):
    """GRPO with each row's own tools in its prompt, and environment episodes that a budget
    cut off masked out of the loss and rewarded 0 (see the module docstring)."""

    def __init__(self, *args: Any, episode_tokens: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        budget = episode_tokens or self.max_completion_length
        assert budget is not None, "GRPO generates at most max_completion_length tokens"
        self.episode_tokens: int = budget
        self._row_tools: list[list[dict[str, Any]] | None] = []
        self._cut_off: list[bool] = []

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._row_tools = [row_tools(row.get("tools")) for row in inputs]
        self._cut_off = [False] * len(inputs)
        batch: dict[str, Any] = super()._generate_and_score_completions(inputs)
        if any(self._cut_off):
            keep = torch.tensor([not cut for cut in self._cut_off])
            batch = mask_rows(batch, keep)
        return batch

    def _tokenize_prompts(self, prompts: list[Any]) -> Any:
        if not any(self._row_tools) or len(self._row_tools) != len(prompts):
            return super()._tokenize_prompts(prompts)
        prompt_ids = [
            self.processing_class.apply_chat_template(
                conversation=[prompt],
                tools=tools,
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                **self.chat_template_kwargs,
            )["input_ids"][0]
            for prompt, tools in zip(prompts, self._row_tools, strict=True)
        ]
        return prompt_ids, None, {}

    def _tool_call_loop(self, prompts: Any, prompt_ids: Any, completion_ids: Any, completions: Any,
                        *args: Any) -> Any:  # fmt: skip
        """TRL's loop, for environment rows only: a tool-call task's calls are its answer,
        not calls to run (rows without an environment keep them, unexecuted)."""
        held = {}
        for row, name in enumerate(getattr(self, "_batch_environments", None) or ()):
            if name is None and completions[row][0].get("tool_calls"):
                held[row] = completions[row][0].pop("tool_calls")
        result = play_episodes(self, super()._tool_call_loop, prompts, prompt_ids, completion_ids,
                               completions, *args, episode_tokens=self.episode_tokens)  # fmt: skip
        for row, calls in held.items():
            result[1][row][0]["tool_calls"] = calls
        return result

    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        stops = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        for row, environment in enumerate(self.environments or ()):
            if isinstance(environment, EnvironmentEpisode):
                cut = is_cut_off(completion_ids_list[row], completions[row], stops)
                cut = cut or environment.turns_left > 0
                environment.is_cut_off = self._cut_off[row] = cut
        self._log_episodes()
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _log_episodes(self) -> None:
        """`episodes/turns_played` (user turns begun, per episode) and `episodes/cut_off_ratio`
        (episodes masked and scored 0 for their budget), over the processes' episodes."""
        if not self.environments:
            return
        episodes = [env for env in self.environments if isinstance(env, EnvironmentEpisode)]
        local = [sum(env.turns_played for env in episodes), sum(self._cut_off), len(episodes)]
        device = self.accelerator.device
        gathered = self.accelerator.gather(torch.tensor(local, device=device))
        turns, cut, count = gathered.view(-1, 3).sum(0).tolist()
        if count:
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["episodes/turns_played"].append(turns / count)
            self._metrics[mode]["episodes/cut_off_ratio"].append(cut / count)


def is_cut_off(ids: list[int], completion: Any, stops: set[int]) -> bool:
    """An episode a budget stopped: its last token is no end of turn (max_completion_length),
    or its last turn still calls tools (the round limit, or a result past the budget).

    >>> is_cut_off([5, 2], [{"role": "assistant", "content": "done"}], {2})
    False
    >>> is_cut_off([5, 6], [{"role": "assistant", "content": "do"}], {2})
    True
    >>> is_cut_off([5, 2], [{"role": "assistant", "tool_calls": [{"name": "cd"}]}], {2})
    True
    """
    if not ids or ids[-1] not in stops:
        return True
    last = completion[-1] if isinstance(completion, list) and completion else None
    return bool(isinstance(last, dict) and last.get("tool_calls"))


class WeightedGrpoTrainer(ToolGrpoTrainer):
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
    preflight_environments(regular)
    kinds = canary_kinds(regular, GRPO_CANARY_KINDS)
    mixed = mix_canaries(regular, config.canary_fraction, config.seed, kinds)
    rows, environments = route_environments(mixed, max_turns=config.max_turns)
    dataset = Dataset.from_list(rows)
    alarm = CanaryAlarm()
    monitor = CanaryMonitor(task_reward(config), on_alarm=alarm)
    rewards: list[RewardFunc] = [monitor]
    weights = [1.0]
    if config.format_reward_weight > 0:
        rewards.append(FormatReward())
        weights.append(config.format_reward_weight)
    model, tokenizer = load_base(job.base, config)
    if any(row.get("tools") for row in rows):
        prepare_tool_tokenizer(tokenizer, job.base)
    args = TrlGrpoConfig(
        **training_arguments(config, job),
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        max_tool_calling_iterations=config.max_tool_calling_iterations,
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

    def make_trainer(callbacks: list[Any]) -> GRPOTrainer:
        with warnings.catch_warnings():  # we know environment_factory is experimental in TRL
            warnings.filterwarnings("ignore", "You are using 'environment_factory'", UserWarning)
            return trainer_class(
                model=model,
                reward_funcs=rewards,
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                peft_config=lora_config(config.lora),
                callbacks=callbacks,
                environment_factory=environments,
                episode_tokens=config.episode_tokens,
                task_weights=prompt_weights(rows, job.dataset),
                is_ordered=is_curriculum(export),
            )

    return run_training(
        job,
        export,
        make_trainer,
        extra_metrics=canary_metrics,
        tags={"flywheel.canaries": str(len(rows) - len(tasks))},
    )


def task_reward(config: GrpoConfig) -> TaskReward:
    """The task reward, every kind routed: code (sandboxed), answer and tool_call."""
    return TaskReward(
        code_reward=CodeReward(mode=config.code_reward),
        tool_call_reward=ToolCallReward(partial_credit=config.tool_call_partial_credit),
    )


PROBE_NAME = "flywheel_probe_tool"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "Checks that the chat template renders tools.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def prepare_tool_tokenizer(tokenizer: Any, base: Any) -> None:
    """A run with tools needs a template that shows them; TRL's response parser for it (when
    TRL knows the template) reads the calls off completions, else rewards read the text."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[PROBE_TOOL], tokenize=False
    )
    if PROBE_NAME not in rendered:
        raise TrainingInputError(
            f"the chat template in {base} does not render tools, so tool and environment tasks "
            "would prompt the model without them: use a base whose template has a tools section"
        )
    has_parser = any(
        getattr(tokenizer, name, None) is not None
        for name in ("response_template", "response_schema")
    )
    if not has_parser:
        with contextlib.suppress(ValueError):  # a template TRL has no parser for
            add_response_schema(tokenizer)


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
