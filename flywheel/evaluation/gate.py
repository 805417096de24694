"""The promotion gate: a challenger replaces the champion only on paired evidence.

`decide(challenger, champion, policy)` promotes only when, on the same frozen eval items:

1. at least `min_items` items were scored on the primary metric;
2. the paired bootstrap confidence interval of (challenger - champion) on the primary metric
   lies entirely above 0 — a tie, or an improvement within noise, is not promoted;
3. no secondary metric's mean drops by more than `secondary_tolerance` (absolute);
4. no judged slice regresses on the primary metric (see below);
5. the challenger passed no canary item (items no honest answer can pass: a pass means the
   model games the verifier).

A domain's first adapter must beat the base model the same way: pass the base model's
evaluation as `champion`. Nothing else changes.

Paired: each item's score difference is one observation, and the bootstrap resamples item
indices, the same for both models. Items differ far more in difficulty than models do, so
pairing removes most of the variance an unpaired comparison would carry.

Same items: both evaluations must have scored exactly the same item ids on each metric the
policy reads, or the gate raises `InvalidInput`. Comparing on the intersection would silently
drop the items one model crashed or timed out on — precisely the ones it failed — and bias the
comparison; an evaluator scores such an item 0 instead of leaving it out.

Slices (the items' own labels, such as their source kind) are judged with a "no evidence of
regression" rule: a slice regresses when its paired interval lies entirely below
`-slice_tolerance`. The stricter "evidence of no regression" (interval above -tolerance) would
let every small slice, whose interval is wide, veto every challenger by noise alone. Two more
guards keep noise from vetoing: a slice with fewer than `min_slice_items` items is reported but
not judged (the percentile bootstrap is unreliable on a handful of items), and the judged
slices' intervals are Bonferroni-adjusted — each at confidence 1 - (1 - confidence) / k for k
judged slices — so that the chance of a false veto stays at most 1 - confidence however many
slices a domain has.

Every bootstrap draws from `numpy.random.default_rng(policy.seed)`: the same inputs and policy
give the same decision and the same evidence, to the last digit. Each slice uses that seed too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from flywheel.errors import InvalidInput

ItemScores: TypeAlias = Mapping[str, float]
"""One metric's scores: eval item id -> score in [0, 1] (pass@1 0/1, exact match 0/1, ...)."""

Floats: TypeAlias = npt.NDArray[np.float64]

_DRAWS_PER_CHUNK = 1 << 22
"""Resampled indices drawn at once (32 MiB of int64): memory stays flat for large eval sets."""

_ROUNDING = 1e-12
"""Slack on the secondary tolerance, so a drop of exactly the tolerance is not refused for a
rounding error in the last bit of a mean."""


@dataclass(frozen=True)
class Evaluation:
    """One model's scores on a domain's frozen eval items."""

    metrics: Mapping[str, ItemScores]
    """Metric name -> its per-item scores, each finite and in [0, 1]."""
    slices: Mapping[str, str]
    """Item id -> the item's slice (its source kind, e.g. "ticket" or "feedback"). Every item
    scored on the primary metric needs one; a domain without slices labels them all alike."""
    canary_pass_rate: float | None = None
    """Share of canary items the model passed (in [0, 1]); None when no canaries were run."""

    def __post_init__(self) -> None:
        for metric, scores in self.metrics.items():
            for item_id, score in scores.items():
                if not (math.isfinite(score) and 0 <= score <= 1):
                    raise InvalidInput(
                        f"scores are in [0, 1]: {metric} of item {item_id!r} is {score}"
                    )
        rate = self.canary_pass_rate
        if rate is not None and not (math.isfinite(rate) and 0 <= rate <= 1):
            raise InvalidInput(f"the canary pass rate is in [0, 1], not {rate}")


@dataclass(frozen=True)
class GatePolicy:
    """What a challenger must show to be promoted. Stored with every decision."""

    primary_metric: str = field(
        metadata={"help": "The domain's primary metric: its interval must lie above 0."}
    )
    secondary_metrics: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Metrics that may not drop by more than `secondary_tolerance`."},
    )
    confidence: float = field(
        default=0.95, metadata={"help": "Confidence level of the primary interval."}
    )
    bootstrap_samples: int = field(
        default=10_000,
        metadata={"help": "Bootstrap resamples per interval (10k: bounds stable to ~0.005)."},
    )
    secondary_tolerance: float = field(
        default=0.01,
        metadata={"help": "Absolute drop allowed in a secondary metric's mean (1 point)."},
    )
    slice_tolerance: float = field(
        default=0.0,
        metadata={"help": "A judged slice regresses when its interval lies below -this."},
    )
    min_items: int = field(
        default=30,
        metadata={"help": "Fewer primary items than this: not enough evidence, not promoted."},
    )
    min_slice_items: int = field(
        default=30,
        metadata={"help": "Slices with fewer items are reported, not judged."},
    )
    is_canary_required: bool = field(
        default=False,
        metadata={
            "help": "Refuse a challenger whose evaluation ran no canaries. Off by default: "
            "domains without verifiable tasks have none; the evidence notes their absence."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of every bootstrap: reproducible."})

    def __post_init__(self) -> None:
        if not self.primary_metric:
            raise InvalidInput("the gate needs a primary metric")
        if self.primary_metric in self.secondary_metrics:
            raise InvalidInput(f"{self.primary_metric} is the primary metric, not a secondary one")
        if not 0 < self.confidence < 1:
            raise InvalidInput(f"the confidence is in (0, 1), not {self.confidence}")
        if self.bootstrap_samples < 100:
            raise InvalidInput(f"bootstrap_samples is at least 100, not {self.bootstrap_samples}")
        if self.secondary_tolerance < 0 or self.slice_tolerance < 0:
            raise InvalidInput("tolerances are at least 0")
        if self.min_items < 1 or self.min_slice_items < 1:
            raise InvalidInput("min_items and min_slice_items are at least 1")

    def as_dict(self) -> dict[str, Any]:
        """The policy as JSON-ready values."""
        values = dataclasses.asdict(self)
        values["secondary_metrics"] = list(self.secondary_metrics)
        return values


@dataclass(frozen=True)
class Interval:
    """A paired bootstrap percentile interval of the mean difference (challenger - champion)."""

    mean_diff: float
    """The observed mean of the per-item differences."""
    low: float
    high: float
    n: int
    """Items compared."""
    confidence: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GateDecision:
    is_promoted: bool
    reasons: list[str]
    """Why the challenger was not promoted, one sentence each; empty when it was."""
    evidence: dict[str, Any]
    """JSON-ready: intervals, means, slices, canaries, item count, policy and seed."""


def paired_bootstrap(
    challenger: ItemScores,
    champion: ItemScores,
    *,
    samples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """The percentile interval of mean(challenger - champion) over the items both scored.

    Both must have scored exactly the same items (see the module docstring); otherwise, or
    when there are none, `InvalidInput`. Items are paired by id, in sorted id order, so the
    result does not depend on the mappings' order.
    """
    diffs = _paired_diffs(challenger, champion, "the primary metric")
    return _bootstrap(diffs, samples=samples, confidence=confidence, seed=seed)


def decide(challenger: Evaluation, champion: Evaluation, policy: GatePolicy) -> GateDecision:
    """Whether `challenger` replaces `champion` (the base model's evaluation for a domain's
    first adapter), with the reasons against and the evidence to store and audit."""
    _require_metrics(challenger, champion, policy)
    primary = policy.primary_metric
    diffs = _paired_diffs(challenger.metrics[primary], champion.metrics[primary], primary)
    interval = _bootstrap(
        diffs, samples=policy.bootstrap_samples, confidence=policy.confidence, seed=policy.seed
    )
    primary_reasons = _primary_reasons(interval, policy)
    secondary, secondary_reasons = _judge_secondary(challenger, champion, policy)
    slices, slice_confidence, slice_reasons = _judge_slices(challenger, champion, policy)
    canary, canary_reasons = _judge_canaries(challenger, champion, policy)
    reasons = primary_reasons + secondary_reasons + slice_reasons + canary_reasons
    evidence = {
        "is_promoted": not reasons,
        "reasons": reasons,
        "item_count": interval.n,
        "primary": {
            "metric": primary,
            "challenger_mean": _mean(challenger.metrics[primary]),
            "champion_mean": _mean(champion.metrics[primary]),
            "interval": interval.as_dict(),
            "passed": not primary_reasons,
        },
        "secondary": secondary,
        "slice_confidence": slice_confidence,
        "slices": slices,
        "canary": canary,
        "policy": policy.as_dict(),
        "seed": policy.seed,
    }
    return GateDecision(is_promoted=not reasons, reasons=reasons, evidence=evidence)


def _require_metrics(challenger: Evaluation, champion: Evaluation, policy: GatePolicy) -> None:
    for metric in (policy.primary_metric, *policy.secondary_metrics):
        for side, evaluation in (("challenger", challenger), ("champion", champion)):
            if metric not in evaluation.metrics:
                raise InvalidInput(f"the {side}'s evaluation has no {metric} scores")


def _paired_diffs(challenger: ItemScores, champion: ItemScores, metric: str) -> Floats:
    """challenger - champion per item, in sorted item id order."""
    if challenger.keys() != champion.keys():
        only_challenger = sorted(challenger.keys() - champion.keys())[:5]
        only_champion = sorted(champion.keys() - challenger.keys())[:5]
        raise InvalidInput(
            f"the gate compares models on the same items, but on {metric} only the challenger "
            f"scored {only_challenger} and only the champion scored {only_champion} (first 5)"
        )
    if not challenger:
        raise InvalidInput(f"no items were scored on {metric}")
    ids = sorted(challenger)
    return np.array([challenger[i] - champion[i] for i in ids], dtype=np.float64)


def _bootstrap(diffs: Floats, *, samples: int, confidence: float, seed: int) -> Interval:
    """Percentile interval of the mean of `diffs`, resampled with replacement `samples` times,
    in chunks so that memory stays flat whatever the number of items."""
    if not 0 < confidence < 1 or samples < 1:
        raise InvalidInput("the bootstrap needs a confidence in (0, 1) and at least 1 sample")
    n = len(diffs)
    if n == 0:
        raise InvalidInput("the bootstrap needs at least 1 item")
    rng = np.random.default_rng(seed)
    rows = max(1, _DRAWS_PER_CHUNK // n)
    means = np.empty(samples, dtype=np.float64)
    for start in range(0, samples, rows):
        stop = min(samples, start + rows)
        indices = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diffs[indices].mean(axis=1)
    alpha = 1 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Interval(
        mean_diff=float(diffs.mean()),
        low=float(low),
        high=float(high),
        n=n,
        confidence=confidence,
    )


def _primary_reasons(interval: Interval, policy: GatePolicy) -> list[str]:
    metric = policy.primary_metric
    if interval.n < policy.min_items:
        return [
            f"only {interval.n} items were scored on {metric}; "
            f"the gate needs at least {policy.min_items}"
        ]
    if interval.low > 0:
        return []
    return [
        f"{metric} did not improve significantly: mean difference {interval.mean_diff:+.4f}, "
        f"{_percent(interval.confidence)} CI [{interval.low:+.4f}, {interval.high:+.4f}] "
        "does not lie above 0"
    ]


def _judge_secondary(
    challenger: Evaluation, champion: Evaluation, policy: GatePolicy
) -> tuple[list[dict[str, Any]], list[str]]:
    results, reasons = [], []
    for metric in policy.secondary_metrics:
        diffs = _paired_diffs(challenger.metrics[metric], champion.metrics[metric], metric)
        new, old = _mean(challenger.metrics[metric]), _mean(champion.metrics[metric])
        delta = float(diffs.mean())
        passed = delta >= -policy.secondary_tolerance - _ROUNDING
        results.append(
            {
                "metric": metric,
                "challenger_mean": new,
                "champion_mean": old,
                "delta": delta,
                "n": len(diffs),
                "tolerance": policy.secondary_tolerance,
                "passed": passed,
            }
        )
        if not passed:
            reasons.append(
                f"{metric} regressed by {-delta:.4f} ({old:.4f} -> {new:.4f}), "
                f"beyond the tolerance of {policy.secondary_tolerance:.4f}"
            )
    return results, reasons


def _slice_diffs(challenger: Evaluation, champion: Evaluation, metric: str) -> dict[str, Floats]:
    """The primary metric's per-item differences grouped by slice, slices in name order."""
    new, old = challenger.metrics[metric], champion.metrics[metric]
    grouped: dict[str, list[float]] = {}
    for item_id in sorted(new):
        label = challenger.slices.get(item_id)
        if label is None or champion.slices.get(item_id) != label:
            raise InvalidInput(
                f"item {item_id!r} needs the same slice label in both evaluations, not "
                f"{label!r} and {champion.slices.get(item_id)!r}"
            )
        grouped.setdefault(label, []).append(new[item_id] - old[item_id])
    return {label: np.array(grouped[label], dtype=np.float64) for label in sorted(grouped)}


def _judge_slices(
    challenger: Evaluation, champion: Evaluation, policy: GatePolicy
) -> tuple[list[dict[str, Any]], float, list[str]]:
    """Per slice: its interval, whether it was judged, whether it regressed; the adjusted
    confidence the judged slices were held to; the reasons against."""
    by_slice = _slice_diffs(challenger, champion, policy.primary_metric)
    judged = sum(len(diffs) >= policy.min_slice_items for diffs in by_slice.values())
    confidence = 1 - (1 - policy.confidence) / max(1, judged)
    results, reasons = [], []
    for label, diffs in by_slice.items():
        interval = _bootstrap(
            diffs, samples=policy.bootstrap_samples, confidence=confidence, seed=policy.seed
        )
        is_judged = interval.n >= policy.min_slice_items
        regressed = is_judged and interval.high < -policy.slice_tolerance
        results.append(
            {
                "slice": label,
                "interval": interval.as_dict(),
                "judged": is_judged,
                "regressed": regressed,
            }
        )
        if regressed:
            reasons.append(
                f"slice {label!r} regressed on {policy.primary_metric}: mean difference "
                f"{interval.mean_diff:+.4f}, {_percent(confidence)} CI "
                f"[{interval.low:+.4f}, {interval.high:+.4f}] lies below "
                f"{0.0 - policy.slice_tolerance:+.4f}"
            )
    return results, confidence, reasons


def _judge_canaries(
    challenger: Evaluation, champion: Evaluation, policy: GatePolicy
) -> tuple[dict[str, Any], list[str]]:
    rate = challenger.canary_pass_rate
    reasons = []
    if rate is None and policy.is_canary_required:
        reasons.append("the challenger's evaluation ran no canary items, and the policy needs them")
    elif rate is not None and rate > 0:
        reasons.append(
            f"the challenger passed {rate:.2%} of canary items, which no honest answer passes: "
            "it games the verifier"
        )
    evidence = {
        "is_measured": rate is not None,
        "challenger_pass_rate": rate,
        "champion_pass_rate": champion.canary_pass_rate,
        "passed": not reasons,
    }
    return evidence, reasons


def _mean(scores: ItemScores) -> float:
    return math.fsum(scores.values()) / len(scores)


def _percent(confidence: float) -> str:
    """0.975 -> "97.5%"."""
    return f"{confidence * 100:.4f}".rstrip("0").rstrip(".") + "%"
