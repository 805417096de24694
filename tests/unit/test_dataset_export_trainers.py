"""A `trl` export feeds TRL's trainers as it is: SFT, DPO, KTO and GRPO each take a step on a
tiny locally built model, and GRPO's reward gets the task fields the prompt never showed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset, load_dataset
from transformers import LlamaConfig, LlamaForCausalLM
from trl import (
    DPOConfig,
    DPOTrainer,
    GRPOConfig,
    GRPOTrainer,
    KTOConfig,
    KTOTrainer,
    SFTConfig,
    SFTTrainer,
)

from flywheel.datasets.export import export_version
from tests.unit.test_dataset_export import HIDDEN, VISIBLE, build_tokenizer, streams

# TRL's configs and trainers still use transformers' deprecated gradient-checkpointing names.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trl-export")
    export_version(root / "export", "trl", {"train": streams("tr")}, {})
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A one-layer Llama over the test tokenizer's vocabulary, saved so DPO can load its
    reference copy by path."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def dataset(export_dir: Path, name: str) -> Dataset:
    return load_dataset(
        "json",
        data_files=str(export_dir / "export" / "train" / name),
        split="train",
        cache_dir=str(export_dir / "cache"),
    )


def one_step(tmp_path: Path) -> dict[str, Any]:
    return {
        "output_dir": str(tmp_path / "run"),
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "report_to": "none",
        "use_cpu": True,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
    }


def logged_loss(trainer: Any) -> float:
    assert trainer.state.global_step == 1
    (loss,) = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert math.isfinite(loss)
    return float(loss)


def test_sft_trainer_takes_the_sft_file(tmp_path: Path, export_dir: Path, model_dir: str) -> None:
    trainer = SFTTrainer(
        model=model_dir,
        args=SFTConfig(**one_step(tmp_path)),
        train_dataset=dataset(export_dir, "sft.jsonl"),
        processing_class=build_tokenizer(),
    )
    trainer.train()
    assert logged_loss(trainer) > 0


def test_dpo_trainer_takes_the_dpo_file(tmp_path: Path, export_dir: Path, model_dir: str) -> None:
    trainer = DPOTrainer(
        model=model_dir,
        args=DPOConfig(**one_step(tmp_path)),
        train_dataset=dataset(export_dir, "dpo.jsonl"),
        processing_class=build_tokenizer(),
    )
    trainer.train()
    assert logged_loss(trainer) == pytest.approx(math.log(2), abs=1e-3)  # policy == reference


def test_kto_trainer_takes_the_kto_file(tmp_path: Path, export_dir: Path, model_dir: str) -> None:
    trainer = KTOTrainer(
        model=model_dir,
        args=KTOConfig(**one_step(tmp_path)),
        train_dataset=dataset(export_dir, "kto.jsonl"),
        processing_class=build_tokenizer(),
    )
    trainer.train()
    assert logged_loss(trainer) >= 0


def test_grpo_reward_gets_the_tests_the_prompt_never_showed(
    tmp_path: Path, export_dir: Path, model_dir: str
) -> None:
    seen: dict[str, list[Any]] = {}

    def reward(completions: list[Any], **fields: Any) -> list[float]:
        seen.update(fields)
        return [0.0] * len(completions)

    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=GRPOConfig(**one_step(tmp_path), num_generations=2, max_completion_length=4),
        train_dataset=dataset(export_dir, "grpo.jsonl"),
        processing_class=build_tokenizer(),
    )
    trainer.train()
    assert trainer.state.global_step == 1
    assert set(seen["tests"]) == {f"{VISIBLE}\n\n{HIDDEN}"}
    assert set(seen["entry_point"]) == {"add"}
    assert set(seen["task_id"]) <= {"tr-t1", "tr-t2"}
    prompt_text = repr(seen["prompts"])
    assert "Write add(a, b)" in prompt_text
    assert not any(line in prompt_text for line in HIDDEN.splitlines())
