"""A synthetic verifiable domain: two-digit addition, for learning-signal tests and the demo.

The problems, the carry mistake and the split into *broad* (pretrains the tiny base model),
*train* and *held_out* are `flywheel.demo.arithmetic`'s, the one definition the demo's
feedback is written from too: re-exported here (`Problem`, `Split`, `split_problems`, `LOW`,
`HIGH`, `HELD_OUT_EVERY`). Every problem `a+b=` has one right answer, so SFT conversations,
DPO pairs and GRPO answer tasks come out of one list, and "did it learn?" is exact match on
problems the training never showed. This module adds what the trainer needs on top: records
in the trl export's shapes, the pretraining texts, the reward and the measurements.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The one definition of the domain (stdlib only); the names stay importable from here.
from flywheel.demo.arithmetic import HELD_OUT_EVERY as HELD_OUT_EVERY
from flywheel.demo.arithmetic import HIGH as HIGH
from flywheel.demo.arithmetic import LOW as LOW
from flywheel.demo.arithmetic import Problem as Problem
from flywheel.demo.arithmetic import Split as Split
from flywheel.demo.arithmetic import split_problems as split_problems

Message = dict[str, str]


# --- records in the trl export's shapes ----------------------------------------------------


def user(problem: Problem) -> list[Message]:
    return [{"role": "user", "content": problem.prompt}]


def assistant(content: str) -> list[Message]:
    return [{"role": "assistant", "content": content}]


def sft_example(problem: Problem) -> dict[str, Any]:
    return {"messages": user(problem) + assistant(problem.answer)}


def dpo_pair(problem: Problem) -> dict[str, Any]:
    return {
        "prompt": user(problem),
        "chosen": assistant(problem.answer),
        "rejected": assistant(problem.wrong_answer),
        "weight": 1.0,
    }


def answer_task(problem: Problem) -> dict[str, Any]:
    return {
        "prompt": user(problem),
        "task_kind": "answer",
        "answer": problem.answer,
        "tests": None,
        "entry_point": None,
    }


def tokenizer_texts() -> list[str]:
    """Plain problem strings: every character the domain uses, for `tiny.build_tokenizer`."""
    problems = split_problems()
    every = problems.broad + problems.train + problems.held_out
    return [problem.prompt + problem.answer for problem in every]


def pretraining_texts(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem] | None = None
) -> list[str]:
    """Whole conversations rendered by the chat template (default: the broad slice), so the
    base knows the format the recipes train and generate in."""
    chosen = split_problems().broad if problems is None else problems
    return [
        str(tokenizer.apply_chat_template(sft_example(p)["messages"], tokenize=False))
        for p in chosen
    ]


# --- rewards and measurements --------------------------------------------------------------


def completion_text(completion: str | list[Message]) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def answer_reward(
    completions: Sequence[str | list[Message]], answer: Sequence[str], **_fields: Any
) -> list[float]:
    """1.0 when the completion is exactly the answer (surrounding whitespace aside), else 0.0:
    a TRL reward function, `answer` arriving as the dataset column."""
    return [
        float(completion_text(completion).strip() == expected.strip())
        for completion, expected in zip(completions, answer, strict=True)
    ]


@torch.no_grad()
def generate_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[Message]],
    *,
    max_new_tokens: int = 5,
    batch_size: int = 256,
    temperature: float | None = None,
) -> list[str]:
    """Completions, greedy unless a `temperature` is given, batched with left padding (the
    new tokens line up at the right)."""
    answers = []
    model.eval()
    with _padding_side(tokenizer, "left"):
        for start in range(0, len(prompts), batch_size):
            texts = [
                tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                for p in prompts[start : start + batch_size]
            ]
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            output = model.generate(
                **batch.to(model.device),
                max_new_tokens=max_new_tokens,
                do_sample=temperature is not None,
                temperature=temperature,
                top_k=None,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            answers += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return [answer.strip() for answer in answers]


def exact_match(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[dict[str, Any]],
    max_new_tokens: int = 5,
) -> float:
    """Share of answer tasks (`prompt`, `answer`) the model answers exactly, greedily."""
    prompts = [example["prompt"] for example in examples]
    answers = generate_answers(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    rewards = answer_reward(answers, [example["answer"] for example in examples])
    return sum(rewards) / len(rewards)


def sampled_reward(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[dict[str, Any]],
    *,
    samples: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 5,
) -> float:
    """Mean `answer_reward` of `samples` sampled completions per task: what GRPO maximises,
    and smoother than exact match, which only sees the single most likely answer."""
    torch.manual_seed(seed)
    prompts = [example["prompt"] for example in examples for _ in range(samples)]
    expected = [example["answer"] for example in examples for _ in range(samples)]
    answers = generate_answers(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature
    )
    rewards = answer_reward(answers, expected)
    return sum(rewards) / len(rewards)


@contextlib.contextmanager
def _padding_side(tokenizer: PreTrainedTokenizerBase, side: str) -> Iterator[None]:
    previous = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield
    finally:
        tokenizer.padding_side = previous


@torch.no_grad()
def completion_logprobs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[Message]],
    completions: Sequence[list[Message]],
    batch_size: int = 256,
) -> torch.Tensor:
    """Summed log-probability of each completion's tokens given its prompt, as DPO scores
    them: the completion is what the chat template adds after the generation prompt."""
    model.eval()
    rows = [
        _completion_ids(tokenizer, prompt, completion)
        for prompt, completion in zip(prompts, completions, strict=True)
    ]
    sums = [
        _summed_logprobs(model, rows[start : start + batch_size], tokenizer.pad_token_id)
        for start in range(0, len(rows), batch_size)
    ]
    return torch.cat(sums)


def _completion_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: list[Message], completion: list[Message]
) -> tuple[list[int], int]:
    """The whole conversation's ids and where the completion starts in them."""
    head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
    return ids, len(tokenizer(head, add_special_tokens=False)["input_ids"])


def _summed_logprobs(
    model: PreTrainedModel, rows: list[tuple[list[int], int]], pad_id: int
) -> torch.Tensor:
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    scored = torch.zeros_like(input_ids)  # 1 where a completion token is predicted
    for index, (ids, start) in enumerate(rows):
        input_ids[index, : len(ids)] = torch.tensor(ids)
        attention[index, : len(ids)] = 1
        scored[index, start : len(ids)] = 1
    logits = model(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device))
    logprobs = torch.log_softmax(logits.logits[:, :-1].float(), dim=-1).cpu()
    picked = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return (picked * scored[:, 1:]).sum(dim=-1)


def reward_margins(
    model: PreTrainedModel,
    ref_model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[dict[str, Any]],
    beta: float = 0.1,
) -> torch.Tensor:
    """DPO's implicit reward margin per pair, beta * (chosen log-ratio - rejected log-ratio).

    `ref_model=None` means a peft `model` whose reference is itself with the adapter off
    (how DPOTrainer runs LoRA without a reference copy).
    """
    prompts = [pair["prompt"] for pair in pairs]
    chosen = completion_logprobs(model, tokenizer, prompts, [p["chosen"] for p in pairs])
    rejected = completion_logprobs(model, tokenizer, prompts, [p["rejected"] for p in pairs])
    with _reference(model, ref_model) as ref:
        ref_chosen = completion_logprobs(ref, tokenizer, prompts, [p["chosen"] for p in pairs])
        ref_rejected = completion_logprobs(ref, tokenizer, prompts, [p["rejected"] for p in pairs])
    return beta * ((chosen - ref_chosen) - (rejected - ref_rejected))


@contextlib.contextmanager
def _reference(
    model: PreTrainedModel, ref_model: PreTrainedModel | None
) -> Iterator[PreTrainedModel]:
    if ref_model is not None:
        yield ref_model
        return
    with model.disable_adapter():
        yield model


def preference_accuracy(
    model: PreTrainedModel,
    ref_model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[dict[str, Any]],
    beta: float = 0.1,
) -> float:
    """Share of pairs whose implicit reward margin is strictly positive. A policy equal to its
    reference has margin exactly 0 everywhere and so scores 0.0, not 0.5."""
    margins = reward_margins(model, ref_model, tokenizer, pairs, beta)
    return float((margins > 0).float().mean())
