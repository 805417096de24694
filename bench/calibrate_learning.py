"""Calibrate the learning-signal tests: run the whole chain on CPU and print every number.

    python -m bench.calibrate_learning [--seed 0] [--threads 1] [--grpo-mode merge]

A script, not a test (it lives in bench/, outside the test suite): the learning-signal tests
(tests/finetune/test_learning.py) assert thresholds taken from what this prints, with room
for seeds and machines. The chain:

1. pretrain a tiny Llama on the synthetic broad slice (no-carry sums), full parameters;
2. LoRA SFT on the train split (carries and broad): held-out (carry) exact match up, back to
   the base's with the adapter disabled, broad exact match kept;
3. LoRA DPO from the base (no reference model: the reference is the adapter switched off):
   held-out preference accuracy up;
4. GRPO on the SFT model (adapter merged then a fresh one, or the same adapter continued):
   held-out sampled reward up beyond SFT's.

Measured with the defaults, seeds 0/1/2, one thread: base held-out EM 0.000/0.000/0.001;
SFT 0.813/0.561/0.514 (adapter off 0.000/0.000/0.001); DPO preference accuracy
0.925/0.977/0.937 (adapter off 0.0: margins exactly 0); GRPO sampled reward
0.630->0.726, 0.313->0.427, 0.278->0.370. About 2 minutes of CPU for the whole chain.

`--threads` defaults to 1: these matrices are too small to share, and with anything else
running on a 2-core box, two OpenMP threads made a training step 15-20x slower here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # also runs as a plain script: python bench/calibrate_learning.py
    sys.path.insert(0, str(ROOT))

from finetune import synthetic, tiny  # noqa: E402 - needs the repository root on sys.path


@dataclass(frozen=True)
class Settings:
    """Every knob of the chain; the defaults are the calibrated values."""

    seed: int = 0
    threads: int = 1
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    pretrain_steps: int = 800
    pretrain_learning_rate: float = 4e-3
    pretrain_batch_size: int = 64
    lora_r: int = 16
    lora_alpha: int = 32
    sft_steps: int = 100
    sft_learning_rate: float = 5e-3
    sft_batch_size: int = 32
    dpo_steps: int = 100
    dpo_learning_rate: float = 5e-3
    dpo_batch_size: int = 32
    dpo_beta: float = 0.5
    dpo_from: str = "base"  # "base" | "sft" (SFT adapter merged into the base)
    grpo_steps: int = 150
    grpo_learning_rate: float = 3e-3
    grpo_batch_size: int = 128
    grpo_generations: int = 8
    grpo_mode: str = "merge"  # "merge" (SFT merged, fresh adapter) | "continue" (same adapter)
    # Which train problems each method sees: "train" (all) | "carries" (the new skill only) |
    # "balanced" (the carries and as many broad problems)
    sft_tasks: str = "train"
    dpo_tasks: str = "train"
    grpo_tasks: str = "train"
    reward_samples: int = 4
    phases: str = "sft,dpo,grpo"  # grpo needs sft
    base_dir: str = ""  # reuse this pretrained base if it exists, else save it there
    output_dir: str = ""  # where the trainers' (empty) output directories go; default: temp


def parse_settings() -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in fields(Settings):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=field.default)
    return Settings(**vars(parser.parse_args()))


@contextmanager
def timed(label: str, timings: dict[str, tuple[float, float]]) -> Iterator[None]:
    """Wall and process CPU seconds of a phase: CPU time is what a 2-core CI box pays."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    timings[label] = (time.perf_counter() - wall, time.process_time() - cpu)
    print(f"  [{label}: {timings[label][0]:.1f} s wall, {timings[label][1]:.1f} s CPU]")


def common_args(settings: Settings) -> dict[str, Any]:
    """What every TRL config here shares. TRL 1.16 defaults `bf16=True` even on CPU (4x
    slower on this AVX2 box) and `gradient_checkpointing=True` (recomputation for nothing
    at this size), so both are switched off explicitly."""
    return {
        "output_dir": tempfile.mkdtemp(prefix="trainer-", dir=settings.output_dir or None),
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": settings.seed,
        "lr_scheduler_type": "linear",
        "logging_steps": 10,
    }


def lora(settings: Settings) -> LoraConfig:
    return LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def answer_tasks(problems: list[synthetic.Problem]) -> list[dict[str, Any]]:
    return [synthetic.answer_task(problem) for problem in problems]


def check_determinism(settings: Settings, texts: list[str], tokenizer: Any) -> None:
    runs = []
    for _ in range(2):
        model = tiny.build_model(tokenizer, seed=settings.seed)
        runs.append(tiny.pretrain(model, tokenizer, texts, steps=10, seed=settings.seed))
    print(f"pretrain deterministic for a fixed seed: {runs[0] == runs[1]}")


def pretrain_base(settings: Settings, directory: Path, timings: dict[str, Any]) -> None:
    split = synthetic.split_problems()
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts())
    texts = synthetic.pretraining_texts(tokenizer)
    print(f"problems: broad {len(split.broad)}, train {len(split.train)}, "
          f"held-out {len(split.held_out)}; vocabulary {len(tokenizer)}")  # fmt: skip
    check_determinism(settings, texts, tokenizer)
    model = tiny.build_model(
        tokenizer,
        hidden_size=settings.hidden_size,
        num_layers=settings.num_layers,
        num_heads=settings.num_heads,
        seed=settings.seed,
    )
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters")
    with timed("pretrain", timings):
        losses = tiny.pretrain(
            model,
            tokenizer,
            texts,
            steps=settings.pretrain_steps,
            learning_rate=settings.pretrain_learning_rate,
            batch_size=settings.pretrain_batch_size,
            seed=settings.seed,
        )
    print(f"pretrain loss {losses[0]:.3f} -> {sum(losses[-20:]) / 20:.3f} (mean of last 20)")
    tiny.save_base(directory, model, tokenizer)


def load(directory: Path) -> tuple[PreTrainedModel, Any]:
    return (
        AutoModelForCausalLM.from_pretrained(directory),
        AutoTokenizer.from_pretrained(directory),
    )


def report_base(directory: Path) -> dict[str, float]:
    model, tokenizer = load(directory)
    split = synthetic.split_problems()
    held_out = answer_tasks(split.held_out)
    numbers = {
        "em_broad": synthetic.exact_match(model, tokenizer, answer_tasks(split.broad[::5])),
        "em_held_out": synthetic.exact_match(model, tokenizer, held_out),
        "reward_held_out": synthetic.sampled_reward(model, tokenizer, held_out),
    }
    print("base: " + ", ".join(f"{key} {value:.3f}" for key, value in numbers.items()))
    return numbers


def run_sft(settings: Settings, directory: Path, timings: dict[str, Any]) -> PeftModel:
    model, tokenizer = load(directory)
    split = synthetic.split_problems()
    examples = [synthetic.sft_example(p) for p in problems(settings.sft_tasks)]
    dataset = datasets.Dataset.from_list(examples)
    config = SFTConfig(
        **common_args(settings),
        max_steps=settings.sft_steps,
        per_device_train_batch_size=settings.sft_batch_size,
        learning_rate=settings.sft_learning_rate,
        warmup_steps=max(1, settings.sft_steps // 20),
        assistant_only_loss=True,
        max_length=64,
    )
    transformers.set_seed(settings.seed)
    with timed("sft", timings):
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora(settings),
        )
        trainer.train()
    print_losses(trainer, "loss")
    peft_model = trainer.model
    held_out = answer_tasks(split.held_out)
    em = synthetic.exact_match(peft_model, tokenizer, held_out)
    broad = synthetic.exact_match(peft_model, tokenizer, answer_tasks(split.broad[::5]))
    with peft_model.disable_adapter():
        em_off = synthetic.exact_match(peft_model, tokenizer, held_out)
    print(f"SFT: em_held_out {em:.3f}, adapter disabled {em_off:.3f}, em_broad {broad:.3f}")
    return peft_model


def print_losses(trainer: Any, key: str) -> None:
    values = [round(entry[key], 3) for entry in trainer.state.log_history if key in entry]
    print(f"  {key} every 10 steps: {values}")


def run_dpo(
    settings: Settings, model: PreTrainedModel, tokenizer: Any, timings: dict[str, Any]
) -> None:
    pairs = [synthetic.dpo_pair(p) for p in problems(settings.dpo_tasks)]
    dataset = datasets.Dataset.from_list(pairs)
    config = DPOConfig(
        **common_args(settings),
        max_steps=settings.dpo_steps,
        per_device_train_batch_size=settings.dpo_batch_size,
        learning_rate=settings.dpo_learning_rate,
        warmup_steps=max(1, settings.dpo_steps // 20),
        beta=settings.dpo_beta,
        max_length=64,
    )
    transformers.set_seed(settings.seed)
    with timed("dpo", timings):
        trainer = DPOTrainer(
            model=model,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora(settings),
        )
        trainer.train()
    print_losses(trainer, "rewards/accuracies")
    report_dpo(settings, trainer.model, tokenizer)


def report_dpo(settings: Settings, model: PeftModel, tokenizer: Any) -> None:
    pairs = [synthetic.dpo_pair(p) for p in synthetic.split_problems().held_out]
    margins = synthetic.reward_margins(model, None, tokenizer, pairs, settings.dpo_beta)
    accuracy = synthetic.preference_accuracy(model, None, tokenizer, pairs, settings.dpo_beta)
    with model.disable_adapter():
        off = synthetic.preference_accuracy(model, None, tokenizer, pairs, settings.dpo_beta)
        off_margin = synthetic.reward_margins(model, None, tokenizer, pairs, settings.dpo_beta)
    held_out = answer_tasks(synthetic.split_problems().held_out)
    em = synthetic.exact_match(model, tokenizer, held_out)
    print(
        f"DPO: preference accuracy {accuracy:.3f} (mean margin {margins.mean():.3f}, "
        f"min {margins.min():.3f}), adapter disabled {off:.3f} "
        f"(max |margin| {off_margin.abs().max():.2e}); em_held_out {em:.3f}"
    )


def run_grpo(
    settings: Settings, sft_model: PeftModel, tokenizer: Any, timings: dict[str, Any]
) -> None:
    split = synthetic.split_problems()
    held_out = answer_tasks(split.held_out)
    before = grpo_numbers(settings, sft_model, tokenizer, held_out)
    if settings.grpo_mode == "merge":
        model, peft_config = sft_model.merge_and_unload(), lora(settings)
    else:
        model, peft_config = sft_model, None
    config = GRPOConfig(
        **common_args(settings),
        max_steps=settings.grpo_steps,
        per_device_train_batch_size=settings.grpo_batch_size,
        num_generations=settings.grpo_generations,
        learning_rate=settings.grpo_learning_rate,
        max_completion_length=5,
        temperature=1.0,
    )
    transformers.set_seed(settings.seed)
    with timed("grpo", timings):
        trainer = GRPOTrainer(
            model=model,
            args=config,
            train_dataset=datasets.Dataset.from_list(answer_tasks(problems(settings.grpo_tasks))),
            processing_class=tokenizer,
            reward_funcs=synthetic.answer_reward,
            peft_config=peft_config,
        )
        trainer.train()
    print_losses(trainer, "reward")
    after = grpo_numbers(settings, trainer.model, tokenizer, held_out)
    print(f"GRPO ({settings.grpo_mode}): em_held_out {before[0]:.3f} -> {after[0]:.3f}, "
          f"sampled reward {before[1]:.3f} -> {after[1]:.3f}, "
          f"em_broad {before[2]:.3f} -> {after[2]:.3f}")  # fmt: skip
    if settings.grpo_mode == "merge":
        with trainer.model.disable_adapter():
            em_off = synthetic.exact_match(trainer.model, tokenizer, held_out)
        print(f"GRPO adapter disabled (= SFT merged): em_held_out {em_off:.3f}")


def problems(mix: str) -> list[synthetic.Problem]:
    train = synthetic.split_problems().train
    carries = [p for p in train if p.carries]
    if mix == "carries":
        return carries
    if mix == "balanced":
        broad = [p for p in train if not p.carries]
        return carries + broad[:: max(1, len(broad) // len(carries))][: len(carries)]
    return train


def grpo_numbers(
    settings: Settings, model: PreTrainedModel, tokenizer: Any, tasks: list[dict[str, Any]]
) -> tuple[float, float, float]:
    """Held-out exact match, held-out sampled reward, and broad exact match (forgetting)."""
    em = synthetic.exact_match(model, tokenizer, tasks)
    reward = synthetic.sampled_reward(
        model, tokenizer, tasks, samples=settings.reward_samples, seed=settings.seed
    )
    broad = answer_tasks(synthetic.split_problems().broad[::5])
    return em, reward, synthetic.exact_match(model, tokenizer, broad)


def quiet() -> None:
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def main() -> None:
    settings = parse_settings()
    torch.set_num_threads(settings.threads)
    quiet()
    print(settings)
    timings: dict[str, tuple[float, float]] = {}
    start = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as scratch:
        settings = replace(settings, output_dir=settings.output_dir or scratch)
        base = Path(settings.base_dir or Path(scratch) / "base")
        if not (base / "config.json").exists():
            pretrain_base(settings, base, timings)
        report_base(base)
        run_phases(settings, base, timings)
    total = time.perf_counter() - start[0], time.process_time() - start[1]
    phases = ", ".join(f"{k} {w:.1f}/{c:.1f}" for k, (w, c) in timings.items())
    print(f"seconds (wall/CPU): {phases}; whole script {total[0]:.1f}/{total[1]:.1f}")


def run_phases(settings: Settings, base: Path, timings: dict[str, Any]) -> None:
    phases = settings.phases.split(",")
    tokenizer = AutoTokenizer.from_pretrained(base)
    sft_model = run_sft(settings, base, timings) if "sft" in phases else None
    if "dpo" in phases:
        run_dpo(settings, dpo_start(settings, base, sft_model), tokenizer, timings)
    if "grpo" in phases and sft_model is not None:
        run_grpo(settings, sft_model, tokenizer, timings)


def dpo_start(settings: Settings, base: Path, sft_model: PeftModel | None) -> PreTrainedModel:
    """DPO's starting weights: the base, or the base with the SFT adapter merged, reloaded
    from disk as a recipe would. Not `copy.deepcopy(sft_model)`: TRL 1.16 patches a trained
    model's `forward` with a closure over the original object, so a deep copy still runs the
    original's forward (a fresh adapter on the copy then changes nothing)."""
    if settings.dpo_from == "base" or sft_model is None:
        return AutoModelForCausalLM.from_pretrained(base)
    with tempfile.TemporaryDirectory() as adapter:
        sft_model.save_pretrained(adapter)
        fresh = AutoModelForCausalLM.from_pretrained(base)
        return PeftModel.from_pretrained(fresh, adapter).merge_and_unload()


if __name__ == "__main__":
    main()
