"""A tiny base of a real chat family pretrained on conversations: for tool-using domains.

    python -m finetune.tiny_chat --out DIR --conversations FILE [--family qwen2_5]
                                 [--steps N] [--seed S]

`FILE` is JSONL, one conversation a line: `{"messages": [...], "tools": [...]}` (OpenAI chat
messages, assistant `tool_calls` included, and the tools offered). Each is rendered through
the family's own chat template (its tools in the family's format), the tokenizer's merges are
trained on those texts, and a tiny model of the family is pretrained on them (`tiny.pretrain`'s
loop, the prompt masked out of the loss). The demo's tool domain (`flywheel.demo.orders`)
writes its base's conversations this way: the domain is defined on the flywheel side, and this
trainer only renders what it is given.

Pretraining, as measured on the orders domain (2026-12-06, 2 CPU cores; item accuracy = the
base names the asked-about item in its call, teacher-forced over every lookup):

1. The conversations *without* their tools first, at a constant learning rate, until the
   model knows them (every trained token its first choice, teacher-forced; checked every
   CHECK_EVERY steps, at most MAX_SHORT_STEPS). With the tools' system text in front (~270
   tokens), the one token that needs the prompt (the item) was not learnt at all: chance
   accuracy after 2,000 steps at width 64, and on 1 seed of 3 at width 128. Without it (~45
   tokens) the binding forms and carries over to the whole conversations (36/36 items, tools
   in front, before any step on them). When it forms is a matter of luck: from 100 to over
   600 steps by seed, and a fixed budget of 300 left 2 seeds of 5 at chance; hence the check.
2. Width 256: at 128 the short conversations still bound the item on 2 seeds of 4 within 600
   steps; at 256 on 5 of 5 within 300 (12 items; 3 of 5 with 18 items and a fixed budget).
3. Then the whole conversations (at least `steps` steps, until they are known too, at most
   MAX_WHOLE_STEPS: after 150 steps half the lookups of one seed in five still opened their
   call wrong), plus the tools' system text itself as a document (a quarter of the draws,
   `DOCUMENT_SHARE`), in the loss: with the prompt always masked, the tool names
   of the system text (`cancel` in `cancel_order`) are never a target, their embeddings stay
   at initialisation, and LoRA (which leaves embeddings alone) could not raise the new tool's
   name above 1% after SFT; with the documents, 30%+. The whole conversations alone in the
   loss (no mask) broke the call format within 150 steps.
4. No gradient clipping: clipped at 1.0 the short phase took twice the steps to bind.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress, TaskID, TextColumn, TimeElapsedColumn
from transformers.utils import logging as transformers_logging

from finetune import tiny

HIDDEN_SIZE = 256
NUM_HEADS = 4
VOCAB_SIZE = 1200
LEARNING_RATE = 3e-3
BATCH_SIZE = 16
DOCUMENT_SHARE = 0.25  # of the later draws: the tools' system text alone, all of it in the loss
WARMUP_STEPS = 20
CHECK_EVERY = 50  # steps of the short phase between two checks of what the model knows
MAX_SHORT_STEPS = 1500
MAX_WHOLE_STEPS = 600


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
    report: Report | None = None,
) -> list[float]:
    """Render, build, pretrain and save; the pretraining losses. `report(phase, steps done
    in it, latest loss)` is called every CHECK_EVERY steps (a progress display)."""
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
    whole = [_encoded(tokenizer, row) for row in conversations]
    documents = [(ids[:masked], 0) for ids, masked in whole]  # the prompt, all trained
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model.train()
    report = report or (lambda phase, done, loss: None)
    losses = _learn_short(model, short, rng, tokenizer.pad_token_id, report)
    pools = [(whole, 1 - DOCUMENT_SHARE), (documents, DOCUMENT_SHARE)]
    losses += _learn_whole(model, pools, rng, tokenizer.pad_token_id, report, steps=steps)
    model.eval()
    tiny.save_base(directory, model, tokenizer)
    return losses


Example = tuple[list[int], int]
"""Token ids, and how many of the first ones the loss leaves out."""
Report = Callable[[str, int, float], None]


def _encoded(tokenizer: Any, row: dict[str, Any]) -> Example:
    """The conversation's ids and how many of them are its first user turn's prompt (the
    tools' system text included), which the loss leaves out."""
    tools = _tools(row)
    ids = tokenizer.apply_chat_template(row["messages"], tools=tools, tokenize=True)
    prompt = tokenizer.apply_chat_template(
        row["messages"][:1], tools=tools, tokenize=True, add_generation_prompt=True
    )
    return list(_ids(ids)), len(_ids(prompt))


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if isinstance(encoded, Mapping) else encoded)


def _learn_short(
    model: Any, short: Sequence[Example], rng: random.Random, pad_id: int, report: Report
) -> list[float]:
    """Phase 1: the short conversations until they are known (see `_until_known`)."""
    return _until_known(model, short, lambda: short[rng.randrange(len(short))], pad_id,
                        lambda done, loss: report("short", done, loss),
                        least=0, most=MAX_SHORT_STEPS)  # fmt: skip


def _learn_whole(
    model: Any,
    pools: Sequence[tuple[Sequence[Example], float]],
    rng: random.Random,
    pad_id: int,
    report: Report,
    *,
    steps: int,
) -> list[float]:
    """Phase 2: at least `steps` steps on the pools at their shares, until the whole
    conversations (the first pool) are known too."""
    sources, shares = zip(*pools, strict=True)

    def draw() -> Example:
        pool: Sequence[Example] = rng.choices(sources, weights=shares)[0]
        return pool[rng.randrange(len(pool))]

    return _until_known(model, sources[0], draw, pad_id,
                        lambda done, loss: report("whole", done, loss),
                        least=steps, most=MAX_WHOLE_STEPS)  # fmt: skip


def _until_known(
    model: Any,
    known: Sequence[Example],
    draw: Callable[[], Example],
    pad_id: int,
    report: Callable[[int, float], None],
    *,
    least: int,
    most: int,
) -> list[float]:
    """Steps on drawn examples, with an optimizer of the phase's own at a constant learning
    rate (after a warmup), until every trained token of every `known` example is the model's
    first choice (teacher-forced; checked every CHECK_EVERY steps once `least` are done), at
    most `most`: a model that has not got there by then is kept as it is. Each phase starts a
    fresh optimizer: the short phase's, its moments small once the short conversations were
    known, took steps on the long texts that undid the call format (every lookup malformed
    after 150 steps, measured)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS)
    )
    losses: list[float] = []
    while len(losses) < most:
        losses += _train(model, draw, CHECK_EVERY, optimizer, schedule, pad_id)
        report(len(losses), losses[-1])
        if len(losses) >= least and _is_known(model, known, pad_id):
            break
    return losses


def _train(
    model: Any, draw: Callable[[], Example], steps: int, optimizer: Any, schedule: Any, pad_id: int
) -> list[float]:
    """`steps` steps of BATCH_SIZE drawn examples, each example's first ids masked out."""
    losses = []
    for _ in range(steps):
        batch = [draw() for _ in range(BATCH_SIZE)]
        input_ids, attention_mask, labels = _batch(batch, pad_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _batch(batch: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, ...]:
    input_ids, attention_mask, labels = tiny._pad_batch([ids for ids, _ in batch], pad_id)
    for row, (_, masked) in enumerate(batch):
        labels[row, :masked] = -100
    return input_ids, attention_mask, labels


@torch.no_grad()
def _is_known(model: Any, examples: Sequence[Example], pad_id: int) -> bool:
    """Every trained token of every example is the model's first choice, teacher-forced."""
    model.eval()
    try:
        input_ids, attention_mask, labels = _batch(examples, pad_id)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        predicted, wanted = logits[:, :-1].argmax(-1), labels[:, 1:]
        return bool(((predicted == wanted) | (wanted == -100)).all())
    finally:
        model.train()


def _tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's tools as the export writes them (keys sorted)."""
    tools = row.get("tools")
    return json.loads(json.dumps(tools, sort_keys=True)) if tools else None


def _render(tokenizer: Any, row: dict[str, Any]) -> str:
    text: str = tokenizer.apply_chat_template(row["messages"], tools=_tools(row), tokenize=False)
    return text


@contextmanager
def _progress() -> Iterator[Report]:
    """Each phase's steps and latest loss on stderr (drawn on a terminal only): how many steps
    a phase takes is known only when it ends."""
    columns = [TextColumn("pretraining on the {task.description} conversations: step"),
               TextColumn("{task.completed}"), TextColumn("loss {task.fields[loss]}"),
               TimeElapsedColumn()]  # fmt: skip
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        tasks: dict[str, TaskID] = {}

        def report(phase: str, done: int, loss: float) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=None, loss="-")
            bar.update(tasks[phase], completed=done, loss=f"{loss:.3f}")

        yield report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m finetune.tiny_chat", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="Directory to write.")
    parser.add_argument("--conversations", type=Path, required=True, help="JSONL conversations.")
    parser.add_argument("--family", choices=sorted(tiny.FAMILIES), default="qwen2_5")
    parser.add_argument(
        "--steps", type=int, default=150,
        help="Steps on the whole conversations, after those that teach the short ones.",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    transformers_logging.disable_progress_bar()
    try:
        conversations = read_conversations(args.conversations)
    except (OSError, ValueError) as error:
        parser.exit(2, f"error: {error}\n")
    with _progress() as report:
        losses = build_chat_base(
            args.out, conversations, family=args.family, steps=args.steps, seed=args.seed,
            report=report,
        )  # fmt: skip
    print(f"pretrained {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
