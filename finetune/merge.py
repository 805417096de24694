"""`python -m finetune.merge --base MODEL_DIR --adapter ADAPTER_DIR --out DIR`

Fold a LoRA adapter into its base and save the result as a plain model directory, so the next
stage of a cycle (DPO or GRPO after SFT) trains a fresh adapter on what the previous stage
learned. (Training on top of the previous stage's adapter instead collapsed GRPO.) Writes to a
temporary directory beside `--out` and renames it into place, so a crash leaves no half model.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune.errors import TrainingInputError
from finetune.model import check_base


def merge(base: Path, adapter: Path, out: Path) -> Path:
    check_base(base)
    if not (adapter / "adapter_config.json").is_file():
        raise TrainingInputError(f"{adapter} is not an adapter directory (no adapter_config.json)")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(
        adapter if (adapter / "tokenizer.json").is_file() else base
    )
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    merged.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune.merge", description=__doc__)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--adapter", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        merge(args.base, args.adapter, args.out)
    except TrainingInputError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
