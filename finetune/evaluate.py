"""Per-item evaluation scores of one model (a base, or a base with a LoRA adapter).

    python -m finetune.evaluate --dataset DIR --base MODEL_DIR [--adapter ADAPTER_DIR]
        --out FILE.json [--split eval] [--k 4] [--max-new-tokens 128] [--seed 0]
        [--batch-size 16] [--max-episode-replies 16] [--max-episode-tokens 4096]

DIR is a `jsonl` (full records) dataset export; its `<split>/sft.jsonl`, `pairs.jsonl` and
`tasks.jsonl` are scored, a missing file meaning no items of that kind. Every metric is a
mapping item_id -> score in [0, 1], so a paired gate can compare two models item by item:

- `exact_match` (SFT items): the greedy reply equals the completion, whitespace normalised;
- `preference_accuracy` (pairs): 1 when the summed log-prob of `chosen` exceeds that of
  `rejected` given the prompt (a margin that needs no reference model, unlike DPO's reward);
- `pass@1` (tasks): the greedy reply passes (code in the sandbox, all tests or nothing;
  answer tasks by `AnswerReward`); `pass@k`: the unbiased estimator over k samples at
  temperature 0.8, which with n == k samples is "any sample passed". A task its reward
  cannot score (None: no tests, an unsafe answer pattern) gets no score, with a warning.

Tool-call tasks (`task_kind == "tool_call"`) are prompted with their `messages` and `tools`
(through the chat template) and scored by `finetune.tool_eval`: `call_accuracy`,
`name_accuracy` and `argument_accuracy` of the greedy reply, and pass@1 (= call accuracy) and
pass@k among the other tasks'. Environment tasks play episodes in their sandboxed environment
(`finetune.episodes`, at most `--max-episode-replies` replies and `--max-episode-tokens`
tokens each): `environment_success` of the greedy episode (= its pass@1) and pass@k of k
sampled ones; their `turns_used`, `tool_calls` and `tool_errors` are losses, never gated.

`losses.sft_loss` is each SFT item's mean token NLL of its completion (not in [0, 1]).
`canaries` is the score of impossible tasks of the eval set's own kinds, drawn from the seed
and scored like tasks but never among the metrics (see `finetune.canaries`); an eval set
without tasks has none (count 0, pass_rate null). Code or environment tasks or canaries need
the sandbox: without one the run stops before any model loads. The output JSON is written
atomically:

    {"metrics": {name: {item_id: score}}, "losses": {"sft_loss": {item_id: nll}},
     "summary": {name: mean}, "counts": {"sft": n, "pairs": n, "tasks": n,
                                         "tool_call": n, "environment": n},  # those present
     "canaries": {"count": n, "passed": n, "pass_rate": rate | null, "passed_ids": [id],
                  "kinds": {kind: {"count": n, "passed": n, "pass_rate": rate}}},
     "model": {"base": path, "adapter": path | null}, "dataset": {...}, "settings": {...},
     "seconds": s}

Bad input (export, model, adapter) is one line on stderr and exit status 2; progress goes to
stderr, and the last stdout line is the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
)

from finetune.canaries import canary_report, eval_canaries, preflight_sandbox
from finetune.data import open_export
from finetune.episodes import EpisodeLimits, score_environment_tasks
from finetune.errors import TrainingInputError
from finetune.generation import completion_logprobs, generate
from finetune.model import check_base
from finetune.rewards import TaskReward
from finetune.tool_eval import ChatPolicy, prompt_of, score_tool_tasks
from flywheel.sandbox.rewards import CodeReward

KIND_FILES = {"sft": "sft.jsonl", "pairs": "pairs.jsonl", "tasks": "tasks.jsonl"}
TOOL_KINDS = ("tool_call", "environment")
SAMPLE_TEMPERATURE = 0.8

Message = dict[str, str]
Row = dict[str, Any]
Scores = dict[str, float]


@dataclass(frozen=True)
class EvalItems:
    """One split of a jsonl export, as rows per kind."""

    sft: list[Row]
    pairs: list[Row]
    tasks: list[Row]
    manifest: dict[str, Any]


@dataclass(frozen=True)
class SamplingSettings:
    """How one evaluation samples: k completions per task, their length, seed and batch size,
    and how long an environment task's episode may run."""

    k: int
    max_new_tokens: int
    seed: int
    batch_size: int
    episode: EpisodeLimits = field(default_factory=EpisodeLimits)


# --- the export ---------------------------------------------------------------------------


def open_items(root: Path, split: str) -> EvalItems:
    """The split's items, every file of the export checked against the manifest's sha256."""
    manifest = open_export(root, "jsonl").manifest
    files = manifest["export"]["files"]
    rows = {
        kind: _read_rows(root / f"{split}/{name}") if f"{split}/{name}" in files else []
        for kind, name in KIND_FILES.items()
    }
    if not any(rows.values()):
        raise TrainingInputError(f"{root} has no sft, pairs or tasks items in split {split!r}")
    return EvalItems(rows["sft"], rows["pairs"], rows["tasks"], manifest)


def _read_rows(path: Path) -> list[Row]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    ids = [row.get("item_id") for row in rows]
    if not all(isinstance(item_id, str) for item_id in ids) or len(set(ids)) != len(ids):
        raise TrainingInputError(f"{path}: every row needs its own item_id")
    return rows


# --- the model ----------------------------------------------------------------------------


def check_adapter(adapter: Path) -> None:
    if not (adapter / "adapter_config.json").is_file():
        raise TrainingInputError(f"{adapter} is not a LoRA adapter (no adapter_config.json)")


def load_model(base: Path, adapter: Path | None) -> tuple[Any, PreTrainedTokenizerBase]:
    """The base (and adapter), in eval mode on the GPU when there is one, with a generation
    config of our own: a model's shipped sampling defaults must not change what is measured."""
    check_base(base)
    if adapter is not None:
        check_adapter(adapter)
    is_cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if is_cuda and torch.cuda.is_bf16_supported() else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    except (OSError, ValueError) as error:
        raise TrainingInputError(
            f"cannot load the base model from {base}: {_first(error)}"
        ) from error
    if adapter is not None:
        model = _with_adapter(model, adapter)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise TrainingInputError(f"the tokenizer in {base} has no chat template")
    tokenizer.padding_side = "left"  # new tokens line up at the right, for both uses
    eos = model.generation_config.eos_token_id
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id if eos is None else eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.to("cuda" if is_cuda else "cpu").eval(), tokenizer


def _with_adapter(model: Any, adapter: Path) -> Any:
    try:
        return PeftModel.from_pretrained(model, adapter, is_trainable=False)
    except (OSError, ValueError, RuntimeError) as error:  # RuntimeError: another base's shapes
        raise TrainingInputError(
            f"cannot load the adapter from {adapter}: {_first(error)}"
        ) from error


def _first(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# --- scores -------------------------------------------------------------------------------


def normalise_whitespace(text: str) -> str:
    return " ".join(text.split())


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c passed (Chen et al., 2021)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_scores(
    greedy: Sequence[float | None], sampled: Sequence[float | None], k: int
) -> list[tuple[float, float] | None]:
    """(pass@1, pass@k) per task from the rewards of its greedy reply and of its k samples
    (`sampled` holds k rewards per task, task by task). A reward of 1.0 is a pass; a task
    whose greedy reward is None is one its reward cannot score, and gets None."""
    if len(sampled) != k * len(greedy):
        raise ValueError(f"expected {k} sampled rewards per task")
    scores: list[tuple[float, float] | None] = []
    for index, reward in enumerate(greedy):
        if reward is None:
            scores.append(None)
            continue
        passed = sum(1 for r in sampled[index * k : (index + 1) * k] if r is not None and r >= 1)
        scores.append((1.0 if reward >= 1 else 0.0, pass_at_k(k, passed, k)))
    return scores


def score_sft(
    model: Any, tokenizer: PreTrainedTokenizerBase, rows: list[Row], settings: SamplingSettings
) -> tuple[Scores, Scores]:
    """(exact_match, sft_loss) per SFT item."""
    prompts = [row["messages"] for row in rows]
    replies = generate(model, tokenizer, prompts, settings, label="sft generate")
    completions = [row["completion"] for row in rows]
    logprobs = completion_logprobs(
        model, tokenizer, prompts, completions, batch_size=settings.batch_size, label="sft loss"
    )
    exact, losses = {}, {}
    for row, reply, (total, count) in zip(rows, replies, logprobs, strict=True):
        is_match = normalise_whitespace(reply) == normalise_whitespace(row["completion"])
        exact[row["item_id"]] = 1.0 if is_match else 0.0
        losses[row["item_id"]] = -total / count
    return exact, losses


def score_pairs(
    model: Any, tokenizer: PreTrainedTokenizerBase, rows: list[Row], settings: SamplingSettings
) -> Scores:
    """preference_accuracy per pair: 1.0 when chosen is the likelier reply, strictly."""
    prompts = [row["messages"] for row in rows]
    completions = [row["chosen"] for row in rows] + [row["rejected"] for row in rows]
    logprobs = completion_logprobs(
        model, tokenizer, prompts + prompts, completions, batch_size=settings.batch_size,
        label="pairs",
    )  # fmt: skip
    chosen, rejected = logprobs[: len(rows)], logprobs[len(rows) :]
    return {
        row["item_id"]: 1.0 if good[0] > bad[0] else 0.0
        for row, good, bad in zip(rows, chosen, rejected, strict=True)
    }


def task_fields(rows: Sequence[Row]) -> dict[str, list[Any]]:
    """The reward's columns: hidden tests go to the verifier (visible then hidden, joined as
    the verifier joins them), never into a prompt."""
    return {
        "task_kind": [row.get("task_kind") for row in rows],
        "tests": [_tests(row) for row in rows],
        "entry_point": [row.get("entry_point") for row in rows],
        "answer": [row.get("answer") for row in rows],
    }


def _tests(row: Row) -> str | None:
    parts = [row.get("visible_tests"), row.get("hidden_tests")]
    return "\n\n".join(part for part in parts if part and part.strip()) or None


def score_tasks(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[Row],
    settings: SamplingSettings,
    reward: Callable[..., list[float | None]],
) -> tuple[Scores, Scores]:
    """(pass@1, pass@k) per task the reward can score."""
    prompts = [prompt_of(row).messages for row in rows]
    greedy = generate(model, tokenizer, prompts, settings, label="tasks greedy")
    torch.manual_seed(settings.seed)
    repeated = [prompt for prompt in prompts for _ in range(settings.k)]
    samples = generate(
        model, tokenizer, repeated, settings, temperature=SAMPLE_TEMPERATURE, label="tasks sample"
    )
    fields = task_fields(rows)
    greedy_rewards = reward(greedy, **fields)
    sampled_rewards = reward(
        samples,
        **{name: [v for v in column for _ in range(settings.k)] for name, column in fields.items()},
    )
    first, any_of_k = {}, {}
    for row, scores in zip(
        rows, pass_scores(greedy_rewards, sampled_rewards, settings.k), strict=True
    ):
        if scores is None:
            print(f"warning: task {row['item_id']} cannot be scored; left out", file=sys.stderr)
            continue
        first[row["item_id"]], any_of_k[row["item_id"]] = scores
    return first, any_of_k


# --- the run ------------------------------------------------------------------------------


def evaluate(
    model: Any, tokenizer: PreTrainedTokenizerBase, items: EvalItems, settings: SamplingSettings
) -> tuple[dict[str, Scores], dict[str, Scores]]:
    """(metrics, losses): only metrics with at least one scored item appear."""
    metrics: dict[str, Scores] = {}
    losses: dict[str, Scores] = {}
    if items.sft:
        metrics["exact_match"], losses["sft_loss"] = score_sft(
            model, tokenizer, items.sft, settings
        )
    if items.pairs:
        metrics["preference_accuracy"] = score_pairs(model, tokenizer, items.pairs, settings)
    if items.tasks:
        task_metrics, task_losses = score_all_tasks(model, tokenizer, items.tasks, settings)
        metrics |= task_metrics
        losses |= task_losses
    return {name: scores for name, scores in metrics.items() if scores}, losses


def score_all_tasks(
    model: Any, tokenizer: PreTrainedTokenizerBase, rows: list[Row], settings: SamplingSettings
) -> tuple[dict[str, Scores], dict[str, Scores]]:
    """(metrics, losses) of task rows of every kind: code and answer tasks by their reward,
    tool-call tasks by their calls, environment tasks by their episodes; pass@1 and pass@k
    hold every kind's items."""
    by_kind = {kind: [row for row in rows if row.get("task_kind") == kind] for kind in TOOL_KINDS}
    others = [row for row in rows if row.get("task_kind") not in TOOL_KINDS]
    metrics: dict[str, Scores] = {"pass@1": {}, "pass@k": {}}
    losses: dict[str, Scores] = {}
    if others:
        metrics["pass@1"], metrics["pass@k"] = score_tasks(
            model, tokenizer, others, settings, _task_reward()
        )
    policies = _policies(model, tokenizer, settings) if any(by_kind.values()) else None
    if by_kind["tool_call"] and policies:
        torch.manual_seed(settings.seed)
        _merge(metrics, score_tool_tasks(*policies, by_kind["tool_call"], settings.k))
    if by_kind["environment"] and policies:
        torch.manual_seed(settings.seed)
        found, losses = score_environment_tasks(
            *policies, by_kind["environment"], settings.k, settings.episode,
            wave=settings.batch_size,
        )  # fmt: skip
        _merge(metrics, found)
    return metrics, losses


def _policies(
    model: Any, tokenizer: PreTrainedTokenizerBase, settings: SamplingSettings
) -> tuple[ChatPolicy, ChatPolicy]:
    """The greedy policy and the sampling one, for tool-call and environment tasks."""
    common = {"max_new_tokens": settings.max_new_tokens, "batch_size": settings.batch_size}
    return (
        ChatPolicy(model, tokenizer, **common),
        ChatPolicy(model, tokenizer, temperature=SAMPLE_TEMPERATURE, **common),
    )


def _merge(metrics: dict[str, Scores], found: dict[str, Scores]) -> None:
    for name, scores in found.items():
        metrics.setdefault(name, {}).update(scores)


def score_canaries(
    model: Any, tokenizer: PreTrainedTokenizerBase, rows: list[Row], settings: SamplingSettings
) -> dict[str, Any]:
    """The `canaries` section: the canary rows scored as tasks are, after them (the tasks'
    samples do not depend on whether canaries follow)."""
    metrics = score_all_tasks(model, tokenizer, rows, settings)[0] if rows else {}
    return canary_report(rows, metrics.get("pass@1", {}), metrics.get("pass@k", {}))


def _tool_counts(rows: list[Row]) -> dict[str, int]:
    """Tool-call and environment tasks among the tasks, for the kinds there are."""
    counts = {kind: sum(1 for row in rows if row.get("task_kind") == kind) for kind in TOOL_KINDS}
    return {kind: count for kind, count in counts.items() if count}


def _task_reward() -> TaskReward:
    return TaskReward(code_reward=CodeReward(mode="all_or_nothing"))


def _mean(scores: Scores) -> float:
    return sum(scores.values()) / len(scores)


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    """`path` holds the whole document or is left as it was: a temp file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=2, sort_keys=True, allow_nan=False)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    episode = EpisodeLimits(args.max_episode_replies, args.max_episode_tokens)
    settings = SamplingSettings(args.k, args.max_new_tokens, args.seed, args.batch_size, episode)
    items = open_items(args.dataset, args.split)
    check_base(args.base)
    if args.adapter is not None:
        check_adapter(args.adapter)
    canaries = eval_canaries(items.tasks, args.seed)
    preflight_sandbox([*items.tasks, *canaries])
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.base, args.adapter)
    metrics, losses = evaluate(model, tokenizer, items, settings)
    canary_section = score_canaries(model, tokenizer, canaries, settings)
    return {
        "metrics": metrics,
        "losses": losses,
        "summary": {name: _mean(scores) for name, scores in {**metrics, **losses}.items()},
        "counts": {
            "sft": len(items.sft),
            "pairs": len(items.pairs),
            "tasks": len(items.tasks),
            **_tool_counts(items.tasks),
        },
        "canaries": canary_section,
        "model": {
            "base": str(args.base.resolve()),
            "adapter": str(args.adapter.resolve()) if args.adapter else None,
        },
        "dataset": {
            "path": str(args.dataset.resolve()),
            "split": args.split,
            "dataset_version_id": items.manifest.get("dataset_version_id"),
            "manifest_sha256": items.manifest.get("manifest_sha256"),
        },
        "settings": {
            "k": settings.k,
            "max_new_tokens": settings.max_new_tokens,
            "seed": settings.seed,
            "temperature": SAMPLE_TEMPERATURE,
            "max_episode_replies": episode.max_generations,
            "max_episode_tokens": episode.max_tokens,
        },
        "seconds": round(time.monotonic() - started, 3),
    }


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune.evaluate", description=__doc__)
    parser.add_argument("--dataset", type=Path, required=True, help="A jsonl dataset export.")
    parser.add_argument("--base", type=Path, required=True, help="A base model directory.")
    parser.add_argument("--adapter", type=Path, help="A LoRA adapter directory for the base.")
    parser.add_argument("--out", type=Path, required=True, help="The JSON file to write.")
    parser.add_argument("--split", default="eval", help="The export's split to score.")
    parser.add_argument("--k", type=_positive, default=4, help="Samples per task for pass@k.")
    parser.add_argument("--max-new-tokens", type=_positive, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=_positive, default=16, help="Sequences per batch.")
    parser.add_argument(
        "--max-episode-replies",
        type=_positive,
        default=EpisodeLimits.max_generations,
        help="Model replies per environment episode, all turns together.",
    )
    parser.add_argument(
        "--max-episode-tokens", type=_positive, default=EpisodeLimits.max_tokens,
        help="An environment episode stops once its conversation is this many tokens long.",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        result = run(args)
    except TrainingInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_json_atomic(args.out, result)
    print(json.dumps({"out": str(args.out), "summary": result["summary"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
