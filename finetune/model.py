"""Loading a base model and its tokenizer from a directory, and the LoRA config for it.

The same `from_pretrained(directory)` path serves the tiny models tests build and a real
model copied to the training host; nothing loads from a hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from finetune.config import LoraSettings, TrainingConfig
from finetune.errors import TrainingInputError


def use_bf16(config: TrainingConfig) -> bool:
    """bf16 on a GPU that supports it ("auto"), or as the config says."""
    if config.bf16 == "auto":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if config.bf16 and not torch.cuda.is_available():
        raise TrainingInputError("bf16=true needs a GPU; set bf16=auto or false on CPU")
    return bool(config.bf16)


def check_base(base: Path) -> None:
    """A base model directory holds a model config and a tokenizer."""
    if not (base / "config.json").is_file():
        raise TrainingInputError(f"{base} is not a model directory (no config.json)")
    if not any((base / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise TrainingInputError(f"{base} has no tokenizer (tokenizer.json)")


def load_base(base: Path, config: TrainingConfig) -> tuple[Any, PreTrainedTokenizerBase]:
    """The model and tokenizer in `base`, with clear errors when it is not a model directory."""
    check_base(base)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.bfloat16 if use_bf16(config) else torch.float32
        )
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TrainingInputError(f"cannot load the base model from {base}: {first}") from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise TrainingInputError(f"the tokenizer in {base} has no chat template")
    return model, tokenizer


def lora_config(settings: LoraSettings) -> LoraConfig:
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )
