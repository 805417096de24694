"""Generation and completion log-probs for evaluation: greedy or sampled replies to chat
prompts in left-padded batches, and the summed log-prob of given completions (what
`finetune.evaluate` scores SFT items and pairs with)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from finetune.evaluate import SamplingSettings

Message = dict[str, str]


def _progress(label: str, done: int, total: int) -> None:
    print(f"evaluate: {label} {done}/{total}", file=sys.stderr, flush=True)


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[Message]],
    settings: SamplingSettings,
    *,
    temperature: float | None = None,
    label: str = "generate",
) -> list[str]:
    """One reply per prompt, greedy unless a `temperature` is given, in left-padded batches."""
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=temperature is not None,
        **(
            {"temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature is not None
            else {}
        ),
    )
    replies: list[str] = []
    for start in range(0, len(prompts), settings.batch_size):
        texts = [
            tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            for prompt in prompts[start : start + settings.batch_size]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        output = model.generate(**batch.to(model.device), generation_config=config)
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        replies += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        _progress(label, len(replies), len(prompts))
    return replies


def _encode(
    tokenizer: PreTrainedTokenizerBase, prompt: list[Message], completion: str
) -> tuple[list[int], int]:
    """The templated conversation's ids and how many of its last tokens are the reply's (what
    the template adds after the generation prompt, end-of-turn token included)."""
    head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(
        [*prompt, {"role": "assistant", "content": completion}], tokenize=False
    )
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
    shared = 0  # a template may render the prompt differently once a reply follows
    while shared < min(len(head_ids), len(ids) - 1) and head_ids[shared] == ids[shared]:
        shared += 1
    return ids, len(ids) - max(shared, 1)


@torch.no_grad()
def completion_logprobs(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[Message]],
    completions: Sequence[str],
    *,
    batch_size: int,
    label: str = "log-probs",
) -> list[tuple[float, int]]:
    """(summed log-prob, token count) of each completion given its prompt.

    Rows are left padded, so every reply ends at the last position and only the last
    `longest reply + 1` positions' logits are computed (`logits_to_keep`): the vocabulary-wide
    logits of the prompts are never materialised.
    """
    encoded = [_encode(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
    results: list[tuple[float, int]] = []
    for start in range(0, len(encoded), batch_size):
        results += _batch_logprobs(model, encoded[start : start + batch_size], tokenizer)
        _progress(label, len(results), len(encoded))
    return results


def _batch_logprobs(
    model: Any, rows: list[tuple[list[int], int]], tokenizer: PreTrainedTokenizerBase
) -> list[tuple[float, int]]:
    width = max(len(ids) for ids, _ in rows)
    keep = max(count for _, count in rows) + 1
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for index, (ids, _) in enumerate(rows):
        input_ids[index, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[index, width - len(ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # padding must not shift positions
    logits = model(
        input_ids=input_ids.to(model.device),
        attention_mask=mask.to(model.device),
        position_ids=positions.to(model.device),
        logits_to_keep=keep,
    ).logits
    results = []
    for index, (_, count) in enumerate(rows):
        predicting = logits[index, keep - count - 1 : keep - 1].float().log_softmax(-1)
        targets = input_ids[index, width - count :].to(predicting.device)
        picked = predicting.gather(-1, targets[:, None]).squeeze(-1)
        results.append((float(picked.sum()), count))
    return results
