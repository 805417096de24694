"""Per-domain loss and reward while a suite trains: how each member fares as the others train
with it.

A suite's export (flywheel.suites) tags every row with its `domain`. At the start and at each
logging step, `DomainLoss` measures the model's loss on a fixed probe of each member's train
rows (the first `PROBE_ROWS` of each, in file order): the mean negative log-likelihood per
token of the reply given its prompt (SFT and KTO: the completion; DPO: the chosen reply; GRPO:
an answer task's answer, when it has one). One member's loss rising while another's falls is
interference, and shows as curves: MLflow metrics `domain.<name>.loss` at the trainer's step,
and `domain_metrics.jsonl` in the job's directory (one line per step and domain), which
flywheel reads back into the suite run's record.

With GRPO, the task reward (the trainer's first reward function) is also logged per domain:
`DomainRewards` wraps it and reports each batch's mean reward per domain through TRL's
`log_metric`, which averages it over the logging step (`domain.<name>.reward`; canaries,
which belong to no domain, are left out).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import mlflow
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from finetune.data import Export

log = logging.getLogger("finetune.suite_logging")

PROBE_ROWS = 8
METRICS_FILE = "domain_metrics.jsonl"
Probe = tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]] | None]
"""A prompt (chat messages), the reply to score (an assistant message) and the tools offered."""


def suite_callbacks(export: Export, method: str, out: Path) -> list[TrainerCallback]:
    """`DomainLoss` for a suite's export (its manifest has a `suite` section), else none."""
    path = export.path(method)
    if not isinstance(export.manifest.get("suite"), dict) or path is None:
        return []
    probes = probe_rows(path)
    return [DomainLoss(probes, out / METRICS_FILE)] if probes else []


def watch_domain_rewards(trainer: Any, export: Export) -> None:
    """Wrap a suite's GRPO trainer's first reward function in `DomainRewards`."""
    funcs = getattr(trainer, "reward_funcs", None)
    if isinstance(export.manifest.get("suite"), dict) and funcs and callable(funcs[0]):
        funcs[0] = DomainRewards(funcs[0])


class DomainRewards:
    """A reward function whose rewards are also logged per domain (see the module).

    >>> logged = []
    >>> reward = DomainRewards(lambda completions, **_: [1.0, 0.0, 1.0, None])
    >>> reward(prompts=[], completions=[], domain=["a", "a", "b", "b"],
    ...        log_metric=lambda name, value: logged.append((name, value)))
    [1.0, 0.0, 1.0, None]
    >>> logged
    [('domain.a.reward', 0.5), ('domain.b.reward', 1.0)]
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.__name__ = getattr(inner, "__name__", type(inner).__name__)

    def __call__(self, **kwargs: Any) -> list[float | None]:
        rewards: list[float | None] = self.inner(**kwargs)
        log_metric, domains = kwargs.get("log_metric"), kwargs.get("domain")
        if log_metric is None or not domains:
            return rewards
        found: dict[str, list[float]] = defaultdict(list)
        for domain, reward in zip(domains, rewards, strict=False):
            if isinstance(domain, str) and reward is not None and math.isfinite(reward):
                found[domain].append(float(reward))
        for domain, values in sorted(found.items()):
            log_metric(f"domain.{domain}.reward", sum(values) / len(values))
        return rewards


def probe_rows(path: Path, per_domain: int = PROBE_ROWS) -> dict[str, list[Probe]]:
    """The first `per_domain` scorable rows of each domain in a train file."""
    probes: dict[str, list[Probe]] = defaultdict(list)
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line) if line.strip() else {}
            domain, probe = row.get("domain"), reply_of(row)
            if isinstance(domain, str) and probe is not None and len(probes[domain]) < per_domain:
                probes[domain].append(probe)
    return dict(sorted(probes.items()))


def reply_of(row: dict[str, Any]) -> Probe | None:
    """A row's prompt and the reply its loss is measured on; None when it has none.

    >>> reply_of({"messages": [{"role": "user", "content": "1+1?"},
    ...                        {"role": "assistant", "content": "2"}]})[1]
    {'role': 'assistant', 'content': '2'}
    >>> reply_of({"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"})[1]
    {'role': 'assistant', 'content': '2'}
    >>> reply_of({"prompt": [{"role": "user", "content": "def f(): ..."}], "answer": None})
    """
    tools = row.get("tools") if isinstance(row.get("tools"), list) else None
    if "messages" in row:
        return row["messages"][:-1], row["messages"][-1], tools
    reply = row.get("chosen") or row.get("completion")
    if isinstance(reply, list) and reply:
        return row["prompt"], reply[-1], tools
    if row.get("answer"):
        return row["prompt"], {"role": "assistant", "content": str(row["answer"])}, None
    return None


def reply_loss(model: Any, tokenizer: Any, probe: Probe) -> float:
    """Mean negative log-likelihood per token of the reply given the prompt."""
    prompt, reply, tools = probe
    before = tokenizer.apply_chat_template(
        prompt, tools=tools, add_generation_prompt=True, tokenize=False
    )
    whole = tokenizer.apply_chat_template([*prompt, reply], tools=tools, tokenize=False)
    prompt_ids = tokenizer(before, add_special_tokens=False)["input_ids"]
    ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
    if len(ids) <= len(prompt_ids):
        return math.nan
    input_ids = torch.tensor([ids], device=model.device)
    labels = input_ids.clone()
    labels[:, : len(prompt_ids)] = -100
    with torch.no_grad():
        return float(model(input_ids=input_ids, labels=labels).loss)


class DomainLoss(TrainerCallback):
    """Each domain's probe loss at the start and every logging step (see the module)."""

    def __init__(self, probes: dict[str, list[Probe]], out: Path) -> None:
        self.probes, self.out = probes, out
        self.measured: set[int] = set()  # the steps measured (the trainer's last log repeats one)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.measure(state, kw.get("model"), kw.get("processing_class"))

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.measure(state, kw.get("model"), kw.get("processing_class"))

    def measure(self, state: TrainerState, model: Any, tokenizer: Any) -> None:
        step = int(state.global_step)
        if not state.is_world_process_zero or model is None or tokenizer is None:
            return
        if step in self.measured:
            return
        self.measured.add(step)
        was_training = model.training
        model.eval()
        try:
            losses = {
                domain: _mean([reply_loss(model, tokenizer, probe) for probe in probes])
                for domain, probes in self.probes.items()
            }
        finally:
            model.train(was_training)
        with self.out.open("a", encoding="utf-8") as file:
            for domain, loss in losses.items():
                value = loss if math.isfinite(loss) else None
                file.write(json.dumps({"step": step, "domain": domain, "loss": value}) + "\n")
        finite = {f"domain.{d}.loss": v for d, v in losses.items() if math.isfinite(v)}
        if finite and mlflow.active_run() is not None:
            mlflow.log_metrics(finite, step=step)


def _mean(values: list[float]) -> float:
    finite = [value for value in values if math.isfinite(value)]
    return sum(finite) / len(finite) if finite else math.nan
