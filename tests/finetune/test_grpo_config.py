"""GRPO's typed config: TRL's loss, clipping, reuse and scaling knobs, validated before anything
loads and passed through to TRL's GRPOConfig unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from trl.trainer.grpo_config import GRPOConfig as TrlGrpoConfig

from finetune.config import GrpoConfig, load_config
from finetune.errors import TrainingInputError
from finetune.grpo import trl_loss_arguments
from tests.finetune.conftest import TRAINING

pytestmark = TRAINING  # no database; TRL's config still warns of its own deprecated names

DAPO_STYLE = [
    "loss_type=dapo",
    "epsilon=0.2",
    "epsilon_high=0.28",
    "num_iterations=2",
    "steps_per_generation=4",
    "scale_rewards=none",
    "mask_truncated_completions=true",
    "per_device_train_batch_size=8",
    "num_generations=4",
]


def test_the_defaults_are_trls_and_dynamic_sampling_is_on() -> None:
    config = load_config("grpo", None, [])
    assert isinstance(config, GrpoConfig)
    assert (config.loss_type, config.epsilon, config.epsilon_high) == ("dapo", 0.2, None)
    assert (config.num_iterations, config.steps_per_generation) == (1, None)
    assert (config.scale_rewards, config.mask_truncated_completions) == ("group", False)
    assert (config.vllm_mode, config.dynamic_sampling) == ("colocate", True)


def test_the_knobs_reach_trls_config_unchanged(tmp_path: Path) -> None:
    config = load_config("grpo", None, DAPO_STYLE)
    assert isinstance(config, GrpoConfig)

    trl = TrlGrpoConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=config.per_device_train_batch_size,
        num_generations=config.num_generations,
        **trl_loss_arguments(config),
    )

    assert (trl.loss_type, trl.epsilon, trl.epsilon_high) == ("dapo", 0.2, 0.28)
    assert (trl.num_iterations, trl.steps_per_generation) == (2, 4)
    assert trl.generation_batch_size == 32  # 8 per device x 4 steps per generation
    assert (trl.scale_rewards, trl.mask_truncated_completions) == ("none", True)
    assert trl.vllm_mode == "colocate"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss_type=ppo"], "loss_type"),
        (["scale_rewards=true"], "scale_rewards"),
        (["epsilon_high=0.1"], "must be at least epsilon (0.2)"),
        (["loss_type=cispo"], "needs epsilon_high"),
        (["num_iterations=0"], "num_iterations"),
        (["vllm_mode=server"], "needs use_vllm=true"),
        (["vllm_mode=remote", "use_vllm=true"], "vllm_mode"),
        (["steps_per_generation=1", "per_device_train_batch_size=6"], "steps_per_generation (6)"),
        (["dynamic_sampling=maybe"], "dynamic_sampling"),
    ],
)
def test_impossible_settings_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(TrainingInputError, match="config") as raised:
        load_config("grpo", None, overrides)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_steps_per_generation_sets_the_batch_num_generations_must_divide() -> None:
    config = load_config(
        "grpo",
        None,
        ["per_device_train_batch_size=6", "steps_per_generation=2", "num_generations=4"],
    )
    assert isinstance(config, GrpoConfig)
    assert config.steps_per_generation == 2  # 6 x 2 = 12 completions: three groups of four
