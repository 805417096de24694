"""GPU smoke check: LoRA SFT steps in bf16 through our recipe on a small model built here.

    python -m bench.gpu_smoke [--hidden 1024] [--layers 8] [--steps 20] [--batch 16]

Builds a Llama (about 110M parameters at the defaults) and a byte-level BPE tokenizer locally
(nothing from a hub), exports variable-length conversations, and runs `finetune.sft` four
ways: bf16 padded, bf16 packed, bf16 packed with gradient checkpointing, and (if installed)
with Liger kernels. Prints tokens/s, peak GPU memory and the last loss of each. On a machine
without a GPU it says so and exits 1. Asserts nothing else.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import torch

from bench.sft_throughput import records
from finetune import tiny
from finetune.config import load_config
from finetune.job import Job
from finetune.sft import train
from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import ItemStreams


def arm(root: Path, name: str, overrides: list[str]) -> None:
    torch.cuda.reset_peak_memory_stats()
    config = load_config("sft", None, overrides)
    outcome = train(Job("sft", config, root / "export", root / "base", root / name))
    assert outcome.train_runtime_s
    rate = outcome.tokens_seen / outcome.train_runtime_s
    peak = torch.cuda.max_memory_allocated() / 2**30
    last = outcome.losses[max(outcome.losses)]
    print(f"{name:<28}{rate:>12,.0f} tokens/s  peak {peak:6.2f} GiB  last loss {last:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU here: nothing to check", file=sys.stderr)
        return 1
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"bf16 {torch.cuda.is_bf16_supported()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        os.environ["FLYWHEEL_HOME"] = str(root / "home")
        data = records(2048, seed=0)
        texts = [r.messages[0]["content"] + " " + r.completion for r in data]
        tokenizer = tiny.build_tokenizer(texts, vocab_size=4096)
        model = tiny.build_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers,
                                 num_heads=16, max_position_embeddings=2048)  # fmt: skip
        print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
        tiny.save_base(root / "base", model, tokenizer)
        export_version(root / "export", "trl", {"train": ItemStreams(sft=data)}, {})
        common = [f"max_steps={args.steps}", f"per_device_train_batch_size={args.batch}",
                  "max_length=1024", "bf16=true", f"logging_steps={args.steps}",
                  f"save_steps={args.steps}"]  # fmt: skip
        arm(root, "bf16, padded", [*common, "packing=false"])
        arm(root, "bf16, packed", [*common, "packing=true"])
        arm(root, "bf16, packed, checkpointing", [*common, "packing=true",
                                                   "gradient_checkpointing=true"])  # fmt: skip
        if importlib.util.find_spec("liger_kernel"):
            arm(root, "bf16, packed, liger", [*common, "packing=true", "use_liger_kernel=true"])
        else:
            print("liger_kernel not installed: skipped that arm")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
