"""A tiny base of a real chat family pretrained on conversations: for tool-using domains.

    python -m finetune.tiny_chat --out DIR --conversations FILE [--family qwen2_5]
                                 [--steps N] [--seed S]

`FILE` is JSONL, one conversation a line: `{"messages": [...], "tools": [...]}` (OpenAI chat
messages, assistant `tool_calls` included, and the tools offered). Each is rendered through
the family's own chat template (its tools in the family's format), the tokenizer's merges are
trained on those texts, and a tiny model of the family is pretrained on them (`tiny.pretrain`).
The demo's tool domain (`flywheel.demo.orders`) writes its base's conversations this way: the
domain is defined on the flywheel side, and this trainer only renders what it is given.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as transformers_logging

from finetune import tiny

HIDDEN_SIZE = 256
NUM_HEADS = 4
VOCAB_SIZE = 1200
LEARNING_RATE = 3e-3
BATCH_SIZE = 16
SHORT_FRACTION = 2 / 3  # of the steps, on the conversations without their tools' system text
SHORT_BATCH_SIZE = 16


def read_conversations(path: Path) -> list[dict[str, Any]]:
    """The file's conversations; ValueError naming the first bad line."""
    conversations = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise ValueError(f"{path} line {number}: not an object with a messages list")
        conversations.append(row)
    if not conversations:
        raise ValueError(f"{path}: no conversations")
    return conversations


def build_chat_base(
    directory: Path,
    conversations: Sequence[dict[str, Any]],
    *,
    family: str = "qwen2_5",
    steps: int,
    seed: int = 0,
) -> list[float]:
    """Render, build, pretrain and save; the pretraining losses."""
    chosen = tiny.FAMILIES[family]
    probe = tiny.build_family_tokenizer(chosen, ["x"], vocab_size=300)
    texts = [_render(probe, row) for row in conversations]
    texts += [_render(probe, {"messages": row["messages"]}) for row in conversations]
    tokenizer = tiny.build_family_tokenizer(chosen, texts, vocab_size=VOCAB_SIZE)
    model = tiny.build_family_model(
        chosen, tokenizer, hidden_size=HIDDEN_SIZE, num_heads=NUM_HEADS,
        max_position_embeddings=1024, seed=seed,
    )  # fmt: skip
    short = [_encoded(tokenizer, {"messages": row["messages"]}) for row in conversations]
    import os
    whole = [_encoded(tokenizer, row) for row in conversations]
    examples = whole * int(os.environ.get("CONV_X", "3")) + [(ids[:masked], 0) for ids, masked in whole]
    losses = _pretrain(model, short, examples, tokenizer.pad_token_id, steps=steps, seed=seed)
    tiny.save_base(directory, model, tokenizer)
    return losses


def _encoded(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], int]:
    """The conversation's ids and how many of them are its first user turn's prompt (the
    tools' system text included), which the loss leaves out: on these tiny models the long,
    constant tools text otherwise takes the whole loss (400 plain steps learnt it and not one
    item of the answers)."""
    tools = _tools(row)
    ids = tokenizer.apply_chat_template(row["messages"], tools=tools, tokenize=True)
    prompt = tokenizer.apply_chat_template(
        row["messages"][:1], tools=tools, tokenize=True, add_generation_prompt=True
    )
    return list(_ids(ids)), len(_ids(prompt))


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)


def _pretrain(
    model: Any,
    short: Sequence[tuple[list[int], int]],
    examples: Sequence[tuple[list[int], int]],
    pad_id: int,
    *,
    steps: int,
    seed: int,
) -> list[float]:
    """tiny.pretrain's loop, with each example's prompt masked out of the loss: first on the
    `short` conversations (without their tools), then on the whole ones."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, tiny._warmup_cosine(steps))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    losses = []
    for step in range(steps):
        pool, size = (short, SHORT_BATCH_SIZE) if step < steps * SHORT_FRACTION else (examples, BATCH_SIZE)
        batch = [pool[rng.randrange(len(pool))] for _ in range(size)]
        input_ids, attention_mask, labels = tiny._pad_batch([ids for ids, _ in batch], pad_id)
        for row, (_, masked) in enumerate(batch):
            labels[row, :masked] = -100
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def _tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's tools as the export writes them (keys sorted)."""
    tools = row.get("tools")
    return json.loads(json.dumps(tools, sort_keys=True)) if tools else None


def _render(tokenizer: Any, row: dict[str, Any]) -> str:
    text: str = tokenizer.apply_chat_template(row["messages"], tools=_tools(row), tokenize=False)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m finetune.tiny_chat", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="Directory to write.")
    parser.add_argument("--conversations", type=Path, required=True, help="JSONL conversations.")
    parser.add_argument("--family", choices=sorted(tiny.FAMILIES), default="qwen2_5")
    parser.add_argument("--steps", type=int, default=300, help="Pretraining steps.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    transformers_logging.disable_progress_bar()
    try:
        conversations = read_conversations(args.conversations)
    except (OSError, ValueError) as error:
        parser.exit(2, f"error: {error}\n")
    losses = build_chat_base(
        args.out, conversations, family=args.family, steps=args.steps, seed=args.seed
    )
    print(f"pretrained {args.steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
