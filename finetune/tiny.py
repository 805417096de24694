"""Tiny local base models for tests and the demo: no hub, no download.

    tokenizer = build_tokenizer(texts)
    model = build_model(tokenizer)
    losses = pretrain(model, tokenizer, texts, steps=800)
    save_base(Path("base"), model, tokenizer)

The saved directory is an ordinary Hugging Face checkpoint, so the recipes load it with the
same `from_pretrained(directory)` call that loads a real model: tests exercise the real path.
A randomly initialised model is no base for LoRA (a low-rank update of noise learns
nothing), so `pretrain` gives it the knowledge a real base model would bring.

`save_family_base(directory, "qwen3")` writes an untrained tiny model of a real family instead
(Llama 3 / 3.1 / 3.2, Qwen 2.5 / 3, Mistral, Phi-3, Gemma: `FAMILIES`), with that family's
special tokens and the chat template it ships, for tests of the recipes on real templates.

CLI: `python -m finetune.tiny --out DIR [--text-file F] [--steps N] [--family NAME]`.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)
from transformers.utils import logging as transformers_logging
from trl import chat_template_utils as trl_templates

from finetune import synthetic
from finetune.templates import MISTRAL_CHAT_TEMPLATE

PAD = "<|pad|>"
EOS = "<|eos|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, EOS, *ROLE_TOKENS)

# Calibrated on 2 CPU cores (bench/calibrate_learning.py): 800 steps of these teach
# the default 2x64 model the synthetic broad slice (exact match 1.0) in 30-40 s. Fewer steps
# leave a base LoRA adapts far worse (600: SFT exact match 0.28 where 800 gives 0.77).
PRETRAIN_LEARNING_RATE = 4e-3
PRETRAIN_BATCH_SIZE = 64

# The assistant's content *and* its closing <|eos|> sit inside {% generation %}, so TRL's
# `assistant_only_loss` trains the model to stop, not only to answer.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<|assistant|>{% generation %}{{ message['content'] }}<|eos|>{% endgeneration %}"
    "{%- else -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|eos|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def build_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, with chat special tokens and template.

    Digits are split one per token (as Llama does): merged digit strings would give every
    number its own token and hide the place-value structure arithmetic tasks need. All 256
    byte symbols are always in the vocabulary (any text encodes, nothing is unknown), so
    `vocab_size` bounds the merges only: below 261 it adds none.
    """
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(texts, vocab_size, SPECIAL_TOKENS),
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str]) -> Tokenizer:
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return core


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A small Llama over the tokenizer's vocabulary, its weights fixed by `seed`.

    Embeddings are tied: at this size the vocabulary matrices would otherwise be most of
    the parameters.
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def pretrain(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    texts: Sequence[str],
    *,
    steps: int,
    learning_rate: float = PRETRAIN_LEARNING_RATE,
    batch_size: int = PRETRAIN_BATCH_SIZE,
    seed: int = 0,
    on_step: Callable[[float], None] | None = None,
) -> list[float]:
    """Full-parameter causal-LM training on `texts`; the loss of every step (each also
    handed to `on_step`, for a progress bar).

    A plain loop rather than a TRL trainer: this only manufactures a base model for tests,
    and a dozen lines of torch are faster on CPU than a trainer's setup. Warmup then cosine
    decay, so a short run ends on a settled model rather than mid-stride.
    """
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(steps))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    losses = []
    for _ in range(steps):
        batch = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
        input_ids, attention_mask, labels = _pad_batch(batch, tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if on_step is not None:
            on_step(losses[-1])
    model.eval()
    return losses


def _warmup_cosine(steps: int, warmup_fraction: float = 0.05) -> Callable[[int], float]:
    warmup = max(1, int(steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _pad_batch(
    batch: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, the mask, and labels with padding ignored (-100)."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return input_ids, attention_mask, labels


def save_base(directory: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    """Model and tokenizer side by side, as `from_pretrained(directory)` expects them."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


# --- real families at toy size --------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A real model family at toy size: its architecture, its control tokens (the special
    tokens its tokenizer_config.json names) and the chat template it ships.

    `end_of_turn` is the token that closes an assistant turn when it is not `eos` (the
    model's generation config stops on both, as the real checkpoints' do); `added` are added
    tokens the template writes that are not special (Qwen 3's think tags).
    """

    name: str
    config_class: type[PretrainedConfig]
    chat_template: str
    eos: str
    controls: tuple[str, ...]
    bos: str | None = None
    pad: str | None = None
    end_of_turn: str | None = None
    added: tuple[str, ...] = ()


_LLAMA3 = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>")  # fmt: skip
_LLAMA3_1 = (*_LLAMA3, "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>")
_QWEN = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
_QWEN3_THINK = ("<think>", "</think>")

FAMILIES = {
    family.name: family
    for family in (
        # Llama 3 Instruct: eos <|eot_id|>, no pad token (load_base pads with eos).
        Family("llama3", LlamaConfig, trl_templates.llama3_chat_template, "<|eot_id|>",
               _LLAMA3, bos="<|begin_of_text|>"),
        Family("llama3_1", LlamaConfig, trl_templates.llama3_1_chat_template, "<|eot_id|>",
               _LLAMA3_1, bos="<|begin_of_text|>"),
        Family("llama3_2", LlamaConfig, trl_templates.llama3_2_chat_template, "<|eot_id|>",
               _LLAMA3_1, bos="<|begin_of_text|>"),
        Family("qwen2_5", Qwen2Config, trl_templates.qwen2_5_chat_template, "<|im_end|>",
               _QWEN, pad="<|endoftext|>"),
        Family("qwen3", Qwen3Config, trl_templates.qwen3_chat_template, "<|im_end|>",
               _QWEN, pad="<|endoftext|>", added=_QWEN3_THINK),
        # Mistral Instruct v0.2: sentencepiece controls only; [INST] is plain text.
        Family("mistral", MistralConfig, MISTRAL_CHAT_TEMPLATE, "</s>", ("<unk>", "<s>", "</s>"),
               bos="<s>"),
        Family("phi3", Phi3Config, trl_templates.phi3_chat_template, "<|endoftext|>",
               ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
               pad="<|endoftext|>", end_of_turn="<|end|>"),
        Family("gemma", GemmaConfig, trl_templates.gemma_chat_template, "<eos>",
               ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
               bos="<bos>", pad="<pad>", end_of_turn="<end_of_turn>"),
    )
}  # fmt: skip


def build_family_tokenizer(
    family: Family, texts: Iterable[str], vocab_size: int = 512
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (as `build_tokenizer`) with the family's control tokens,
    special-token roles and chat template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(texts, vocab_size, family.controls),
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        additional_special_tokens=[
            token for token in family.controls if token not in (family.bos, family.eos, family.pad)
        ],
    )
    if family.added:
        tokenizer.add_tokens(list(family.added))
    tokenizer.chat_template = family.chat_template
    return tokenizer


def build_family_model(
    family: Family,
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> PreTrainedModel:
    """A random model of the family's architecture over the tokenizer's vocabulary."""
    ids = {
        name: tokenizer.convert_tokens_to_ids(token) if token else None
        for name, token in (("bos", family.bos), ("eos", family.eos), ("pad", family.pad))
    }
    config = family.config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    stops = [ids["eos"]]
    if family.end_of_turn is not None:
        stops.append(tokenizer.convert_tokens_to_ids(family.end_of_turn))
    model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    model.generation_config.pad_token_id = ids["pad"]
    model.generation_config.bos_token_id = ids["bos"]
    return model


def save_family_base(directory: Path, name: str, texts: Iterable[str] | None = None) -> Family:
    """A tiny random base of family `name` (a key of `FAMILIES`) saved in `directory`;
    `texts` train the tokenizer's merges (default: the synthetic domain's problems)."""
    family = FAMILIES[name]
    tokenizer = build_family_tokenizer(
        family, synthetic.tokenizer_texts() if texts is None else texts, vocab_size=300
    )
    save_base(directory, build_family_model(family, tokenizer), tokenizer)
    return family


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m finetune.tiny", description="Build (and pretrain) a tiny base model."
    )
    parser.add_argument("--out", type=Path, required=True, help="Directory to write.")
    parser.add_argument(
        "--text-file",
        type=Path,
        help="One training text per line; default: the synthetic domain's broad slice.",
    )
    parser.add_argument("--steps", type=int, default=0, help="Pretraining steps (0: none).")
    parser.add_argument("--learning-rate", type=float, default=PRETRAIN_LEARNING_RATE)
    parser.add_argument("--batch-size", type=int, default=PRETRAIN_BATCH_SIZE)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        help="Instead: an untrained tiny model of a real family (architecture, special tokens, "
        "chat template).",
    )
    return parser.parse_args(argv)


def _corpus(text_file: Path | None) -> tuple[PreTrainedTokenizerFast, list[str]]:
    """The tokenizer and the texts to pretrain on: a file's lines, or the synthetic broad
    slice rendered through the chat template (so the base knows the chat format)."""
    if text_file is None:
        tokenizer = build_tokenizer(synthetic.tokenizer_texts())
        return tokenizer, synthetic.pretraining_texts(tokenizer)
    lines = text_file.read_text(encoding="utf-8").splitlines()
    texts = [line for line in lines if line.strip()]
    return build_tokenizer(texts), texts


@contextmanager
def _status(message: str) -> Iterator[None]:
    """A spinner on stderr while a step without steps runs (on a terminal only)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with console.status(message):
        yield


@contextmanager
def _pretraining_bar(steps: int) -> Iterator[Callable[[float], None]]:
    """Steps done, the latest loss and the time left, on stderr (drawn on a terminal only)."""
    columns = [TextColumn("pretraining"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn()]
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("pretraining", total=steps, loss="-")
        yield lambda loss: bar.update(task, advance=1, loss=f"{loss:.3f}")


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()  # "Writing model shards": our own bar says it
    if args.family is not None:
        save_family_base(args.out, args.family)
        print(f"saved {args.out} ({args.family})")
        return
    with _status("building the tokenizer and the model"):
        tokenizer, texts = _corpus(args.text_file)
        model = build_model(
            tokenizer,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            seed=args.seed,
        )
    if args.steps > 0:
        with _pretraining_bar(args.steps) as on_step:
            losses = pretrain(
                model,
                tokenizer,
                texts,
                steps=args.steps,
                learning_rate=args.learning_rate,
                batch_size=args.batch_size,
                seed=args.seed,
                on_step=on_step,
            )
        print(f"pretrained {args.steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    save_base(args.out, model, tokenizer)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
