"""Whether an eval split can be gated, known before anything is scored: the primary metric the
gate will use, how many eval items it can score, and the gate's minimum.

    eval_readiness(version.stats["eval"], domain.config)   # {"sft": 12, "pair": 3}

The gate's primary metric is the domain config's `primary_metric`, else the first of
PRIMARY_ORDER the eval split can measure (pass@1 on tasks, preference accuracy on pairs,
exact match on SFT examples; labels are not scored). Its minimum is the domain config's
`gate.min_items`, else the gate's default (30). `flywheel dataset build` warns with this, and
`flywheel eval` stops before scoring an eval split that has nothing to score.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PRIMARY_ORDER = ("pass@1", "preference_accuracy", "exact_match")
METRIC_KINDS = {"pass@1": "task", "pass@k": "task", "preference_accuracy": "pair",
                "exact_match": "sft", "call_accuracy": "task", "name_accuracy": "task",
                "argument_accuracy": "task", "environment_success": "task"}  # fmt: skip
"""Metric -> the dataset item kind `finetune.evaluate` scores it on. The tool metrics are
scored on tasks of one task kind only (call, name and argument accuracy on tool-call tasks,
environment success on environment tasks), so for them the count is every task's: an upper
bound, and the gate still refuses fewer than its min_items scored."""
LOSS_NAMES = ("sft_loss", "turns_used", "tool_calls", "tool_errors")
"""What `finetune.evaluate` reports as losses: stored and summarised, never gated (the gate's
scores are in [0, 1], and more turns or calls is not worse as such)."""


@dataclass(frozen=True)
class EvalReadiness:
    metric: str | None
    """The primary metric the gate will use; None when the split has nothing to score."""
    scored: int
    """Eval items of that metric's kind."""
    min_items: int
    """The gate's minimum (the domain's `gate.min_items`, else the default)."""

    @property
    def is_short(self) -> bool:
        return self.scored < self.min_items


def gate_min_items(config: Mapping[str, Any]) -> int:
    """The gate's minimum for the domain: its `gate.min_items`, else the default."""
    from flywheel.evaluation.gate import DEFAULT_MIN_ITEMS  # here: the gate loads numpy

    configured = (config.get("gate") or {}).get("min_items")
    if isinstance(configured, int) and not isinstance(configured, bool) and configured >= 1:
        return configured
    return DEFAULT_MIN_ITEMS  # a bad value is refused when the gate's policy is built


def eval_readiness(eval_counts: Mapping[str, int], config: Mapping[str, Any]) -> EvalReadiness:
    """What the gate will count on an eval split of these item counts (kind -> n)."""
    minimum = gate_min_items(config)
    configured = config.get("primary_metric")
    if isinstance(configured, str) and configured:
        kind = METRIC_KINDS.get(configured)
        return EvalReadiness(configured, eval_counts.get(kind, 0) if kind else 0, minimum)
    for metric in PRIMARY_ORDER:
        if eval_counts.get(METRIC_KINDS[metric], 0) > 0:
            return EvalReadiness(metric, eval_counts[METRIC_KINDS[metric]], minimum)
    return EvalReadiness(None, 0, minimum)
