"""Benchmark: our SFT recipe against a plain TRL `SFTTrainer` script, side by side in one run.

    python -m bench.sft_throughput [--examples 384] [--steps 24] [--hidden 256] [--layers 4]
                                   [--rounds 2]

Same base model (a random Llama built here), same export, same LoRA and training settings.
Variable-length data: each conversation's answer is 8 to 400 words (long-tailed), so padded
batches waste much of their compute. Three arms, each run `--rounds` times in turn (best kept)
after a warm-up round that is not counted (the first training in a process pays one-off
costs):

  (a) plain TRL: `SFTTrainer(model=DIR, args=SFTConfig(...), peft_config=LoraConfig(...))`
      on `load_dataset("json", sft.jsonl)`, no packing;
  (b) our recipe (`finetune.sft`, with checkpoints, MLflow logging), no packing;
  (c) our recipe with `packing=true` (TRL's best-fit-decreasing packing, padding-free), the
      same 8 rows per step (each a full `max_length` row: several times the tokens per step);
  (d) packing with as many rows per step as hold the padded batches' real tokens (the same
      work per optimizer step). On CPU, attention over a packed batch is computed over the
      whole flattened sequence (masked to its documents), so (c)'s bigger steps cost more per
      token; flash-attention's variable-length kernels on a GPU do not pay that.

Tokens/s counts the real (non-padding) input tokens the trainer saw over its own train time.
Prints the ratios (b)/(a) (goal >= 1.0) and (c)/(a), (d)/(a) (goal > 1.3). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import uuid
from pathlib import Path

import torch
from datasets import load_dataset
from peft import LoraConfig
from trl.trainer.sft_config import SFTConfig
from trl.trainer.sft_trainer import SFTTrainer

from finetune import tiny
from finetune.config import load_config
from finetune.job import Job
from finetune.sft import train as train_recipe
from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import ItemStreams, SftRecord

WORDS = [f"{a}{b}{c}" for a in "bdfgklmnprst" for b in "aeiou" for c in ("", "n", "r", "s")]


def answer(rng: random.Random) -> str:
    length = min(400, 8 + int(rng.paretovariate(1.2) * 12))
    return " ".join(rng.choice(WORDS) for _ in range(length))


def records(count: int, seed: int) -> list[SftRecord]:
    rng = random.Random(seed)
    return [
        SftRecord(
            [{"role": "user", "content": f"Summarise ticket {n}: " + answer(rng)[:80]}],
            answer(rng),
            1.0,
            f"g{n}",
            str(uuid.uuid4()),
        )
        for n in range(count)
    ]


def settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "max_steps": args.steps,
        "per_device_train_batch_size": 8,
        "learning_rate": 2e-4,
        "max_length": 512,
        "logging_steps": args.steps,
        # no checkpoint inside the timed steps: the plain script writes none either
        "save_steps": args.steps * 10,
        "seed": 0,
    }


def plain_trl(base: Path, export: Path, out: Path, args: argparse.Namespace) -> tuple[float, int]:
    """(a): the script a TRL user would write."""
    common = settings(args)
    config = SFTConfig(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=common["per_device_train_batch_size"],
        learning_rate=common["learning_rate"],
        max_length=common["max_length"],
        logging_steps=args.steps,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        assistant_only_loss=True,
        include_num_input_tokens_seen="non_padding",
        # the same settings as the recipe's on this machine: TRL's own defaults would turn on
        # bf16 (emulated on CPU, several times slower) and gradient checkpointing
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        data_seed=0,
        lr_scheduler_type="linear",
    )
    dataset = load_dataset(
        "json", data_files=str(export / "train" / "sft.jsonl"), split="train",
        cache_dir=str(out / "cache"),
    )  # fmt: skip
    trainer = SFTTrainer(
        model=str(base),
        args=config,
        train_dataset=dataset.select_columns(["messages"]),
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                               target_modules="all-linear", task_type="CAUSAL_LM"),
    )  # fmt: skip
    result = trainer.train()
    tokens = trainer.state.num_input_tokens_seen
    return tokens / result.metrics["train_runtime"], tokens // args.steps


def ours(
    base: Path,
    export: Path,
    out: Path,
    args: argparse.Namespace,
    packing: bool,
    rows: int | None = None,
) -> float:
    """(b), (c), (d): `python -m finetune sft` minus the process start."""
    overrides = [f"{key}={value}" for key, value in settings(args).items()]
    if rows is not None:
        overrides.append(f"per_device_train_batch_size={rows}")
    config = load_config("sft", None, [*overrides, f"packing={str(packing).lower()}"])
    outcome = train_recipe(Job("sft", config, export, base, out))
    assert outcome.train_runtime_s
    return outcome.tokens_seen / outcome.train_runtime_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=384)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        os.environ["FLYWHEEL_HOME"] = str(root / "home")
        data = records(args.examples, seed=0)
        texts = [r.messages[0]["content"] + " " + r.completion for r in data]
        tokenizer = tiny.build_tokenizer(texts, vocab_size=1024)
        model = tiny.build_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers,
                                 num_heads=4, max_position_embeddings=1024)  # fmt: skip
        tiny.save_base(root / "base", model, tokenizer)
        export_version(root / "export", "trl", {"train": ItemStreams(sft=data)}, {})
        best: dict[str, float] = {}
        for round_ in range(args.rounds + 1):  # round 0 warms up (first-call costs)
            label = f"round {round_}" if round_ else "warm-up"
            base, export = root / "base", root / "export"
            plain, tokens_per_step = plain_trl(base, export, root / f"a{round_}", args)
            # packed rows of max_length tokens holding as many real tokens per step as the
            # padded batches did: the same work per optimizer step, without the padding
            rows = max(1, round(tokens_per_step / 512))
            rates = {
                "plain TRL SFTTrainer": plain,
                "our recipe": ours(base, export, root / f"b{round_}", args, packing=False),
                "our recipe, packing": ours(base, export, root / f"c{round_}", args, True),
                f"packing, {rows} rows/step": ours(
                    base, export, root / f"d{round_}", args, True, rows=rows
                ),
            }
            for name, rate in rates.items():
                print(f"{label}: {name:<28}{rate:>10,.0f} tokens/s", flush=True)
                if round_:
                    best[name] = max(best.get(name, 0.0), rate)
    plain = best["plain TRL SFTTrainer"]
    print(f"\n{args.examples} examples, {args.steps} steps, batch 8, hidden {args.hidden}, "
          f"{args.layers} layers, {os.cpu_count()} CPUs; best of {args.rounds}")  # fmt: skip
    for name, rate in best.items():
        print(f"{name:<28}{rate:>10,.0f} tokens/s   ratio {rate / plain:.2f}")
    print("goals: our recipe / plain >= 1.0; packing / plain > 1.3")


if __name__ == "__main__":
    main()
