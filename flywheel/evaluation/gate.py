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

Binary primary metrics (every score 0 or 1: pass@1, exact match, preference accuracy) also
need an exact test, because the percentile bootstrap is anti-conservative on few discordant
items (4 wins and 0 losses of 30 gave an interval above 0). Only the discordant pairs carry
evidence: of the w items the challenger alone passed and the l the champion alone passed, the
one-sided sign test (exact McNemar) gives p = P(X >= w), X ~ Binomial(w + l, 1/2), and the
challenger needs p <= (1 - confidence) / 2 — 0.025 at the default 95%, the same one-sided
error as the interval's lower bound. 4-0 gives p = 0.0625 and is refused; 6-0 (p = 0.0156)
is the fewest clean wins that can pass. Promotion needs both the interval and the test.

Slices. Every item belongs to several slices (its source kind, `source:ticket`, plus each of
its tags, `skill:carry`, `ticket.category:billing`, `difficulty:hard`, and for tool-use tasks
the tools and environments they exercise, `tool:get_weather`, `environment:TwitterAPI`, as the
BFCL importer tags them); a slice with at least
`min_slice_items` items is judged, smaller ones are reported only. A judged slice regresses
when both hold:

- its drop is significant: one-sided at level (1 - confidence) / (2k) for k judged slices
  (Bonferroni: the chance that noise vetoes a challenger that changed nothing stays at most
  (1 - confidence) / 2 however many slices a domain has). Binary metrics use the exact sign
  test above with losses and wins swapped; others the Bonferroni-adjusted bootstrap interval
  (confidence 1 - (1 - confidence) / k), whose upper bound must lie below 0;
- its observed drop (champion mean - challenger mean) exceeds its tolerance:
  `slice_tolerances[slice]`, else `slice_tolerance`. A significant but small drop is allowed.

"No evidence of regression", not "evidence of no regression": the latter would let every
small slice, whose interval is wide, veto every challenger by noise alone.

Smallest drop a judged slice can show (binary metric, the champion at 1.00 so every discordant
item is a loss): l clean losses reach p = 2^-l, so a veto needs l >= 6 losses with 1 judged
slice, 7 with 2-3, 8 with 4-6, 9 with 7-12 — on n items a drop of at least l/n (and above the
tolerance): 1.00 -> 0.90 shows on 60 items alone, 70 with 3 judged slices, 80 with 4-6.
Simulated (2,000 trials per cell, tolerance 0.05), champion 1.00 -> challenger 0.90 is vetoed
with 1 / 3 / 6 judged slices in 40% / 21% / 13% of evals at n = 50, 94% / 88% / 80% at
n = 100, and 99% / 98% / 98% at n = 150. Noise alone (both at 0.70, half the items drawn
afresh, tolerance 0) vetoed 0.6-2.0% of evals with 1 slice, 0.2-0.6% with 3, at n = 30-300;
a real drop within the tolerance (0.80 -> 0.78, tolerance 0.05) 1-9% at n = 30-1000 (most at
n = 300, where the noise of the observed drop is about the tolerance).

Every bootstrap draws from `numpy.random.default_rng(policy.seed)`: the same inputs and policy
give the same decision and the same evidence, to the last digit. Each slice uses that seed too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flywheel.errors import InvalidInput
from flywheel.evaluation.paired import (
    Interval,
    ItemScores,
    SignTest,
    bootstrap,
    drop_test,
    paired_diffs,
    sign_test,
)

DEFAULT_MIN_ITEMS = 30
"""The fewest items scored on the primary metric the gate judges (`GatePolicy.min_items`)."""
_ROUNDING = 1e-12
"""Slack on the secondary tolerance, so a drop of exactly the tolerance is not refused for a
rounding error in the last bit of a mean."""


@dataclass(frozen=True)
class Evaluation:
    """One model's scores on a domain's frozen eval items."""

    metrics: Mapping[str, ItemScores]
    """Metric name -> its per-item scores, each finite and in [0, 1]."""
    slices: Mapping[str, str | Sequence[str]]
    """Item id -> the item's slice labels (its source kind, "source:ticket", and its tags); one
    string is one label. Every item scored on the primary metric needs at least one; a domain
    without slices labels them all alike."""
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
        metadata={"help": "A judged slice may drop this much, even significantly."},
    )
    slice_tolerances: Mapping[str, float] = field(
        default_factory=dict,
        metadata={"help": "Per-slice tolerances, by slice label; others get slice_tolerance."},
    )
    min_items: int = field(
        default=DEFAULT_MIN_ITEMS,
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
        tolerances = [self.secondary_tolerance, self.slice_tolerance]
        if not all(_is_share(value) for value in [*tolerances, *self.slice_tolerances.values()]):
            raise InvalidInput("tolerances are numbers in [0, 1]")
        if self.min_items < 1 or self.min_slice_items < 1:
            raise InvalidInput("min_items and min_slice_items are at least 1")

    def as_dict(self) -> dict[str, Any]:
        """The policy as JSON-ready values."""
        values = dataclasses.asdict(self)
        values["secondary_metrics"] = list(self.secondary_metrics)
        values["slice_tolerances"] = dict(self.slice_tolerances)
        return values

    def tolerance_of(self, label: str) -> float:
        return float(self.slice_tolerances.get(label, self.slice_tolerance))


def _is_share(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


@dataclass(frozen=True)
class GateDecision:
    is_promoted: bool
    reasons: list[str]
    """Why the challenger was not promoted, one sentence each; empty when it was."""
    evidence: dict[str, Any]
    """JSON-ready: intervals, means, slices, canaries, item count, policy and seed."""


def decide(challenger: Evaluation, champion: Evaluation, policy: GatePolicy) -> GateDecision:
    """Whether `challenger` replaces `champion` (the base model's evaluation for a domain's
    first adapter), with the reasons against and the evidence to store and audit."""
    _require_metrics(challenger, champion, policy)
    primary = policy.primary_metric
    diffs = paired_diffs(challenger.metrics[primary], champion.metrics[primary], primary)
    interval = bootstrap(
        diffs, samples=policy.bootstrap_samples, confidence=policy.confidence, seed=policy.seed
    )
    is_binary = _is_binary(challenger.metrics[primary], champion.metrics[primary])
    exact = sign_test(diffs) if is_binary else None
    primary_reasons = _primary_reasons(interval, exact, policy)
    secondary, secondary_reasons = _judge_secondary(challenger, champion, policy)
    slices, slice_confidence, slice_reasons = _judge_slices(
        challenger, champion, policy, is_binary=is_binary
    )
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
            "exact_test": exact.as_dict(_exact_level(policy)) if exact else None,
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


def _is_binary(*metrics: ItemScores) -> bool:
    return all(score in (0.0, 1.0) for scores in metrics for score in scores.values())


def _exact_level(policy: GatePolicy) -> float:
    """The sign test's one-sided level: the interval's one-sided error, (1 - confidence) / 2."""
    return (1 - policy.confidence) / 2


def _primary_reasons(interval: Interval, exact: SignTest | None, policy: GatePolicy) -> list[str]:
    metric = policy.primary_metric
    if interval.n < policy.min_items:
        return [
            f"only {interval.n} items were scored on {metric}; the gate needs at least "
            f"{policy.min_items} (its min_items): add eval data (new groups fill eval first up "
            "to the domain's dataset.min_eval_items), lower the domain's gate.min_items for a "
            "pilot, or promote anyway with `flywheel models promote --force`"
        ]
    reasons = []
    if interval.low <= 0:
        reasons.append(
            f"{metric} did not improve significantly: mean difference "
            f"{interval.mean_diff:+.4f}, {_percent(interval.confidence)} CI "
            f"[{interval.low:+.4f}, {interval.high:+.4f}] does not lie above 0"
        )
    level = _exact_level(policy)
    if exact is not None and exact.p_value > level:
        reasons.append(
            f"{metric} did not improve significantly by the exact sign test: "
            f"{exact.wins} wins, {exact.losses} losses, one-sided p = {exact.p_value:.4f} "
            f"> {level:g}"
        )
    return reasons


def _judge_secondary(
    challenger: Evaluation, champion: Evaluation, policy: GatePolicy
) -> tuple[list[dict[str, Any]], list[str]]:
    results, reasons = [], []
    for metric in policy.secondary_metrics:
        diffs = paired_diffs(challenger.metrics[metric], champion.metrics[metric], metric)
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


def _labels_of(evaluation: Evaluation, item_id: str) -> tuple[str, ...]:
    labels = evaluation.slices.get(item_id)
    if labels is None:
        return ()
    return (labels,) if isinstance(labels, str) else tuple(sorted(set(labels)))


def _slice_items(challenger: Evaluation, champion: Evaluation, metric: str) -> dict[str, list[str]]:
    """Slice label -> its item ids (sorted), slices in name order; an item is in each of its
    labels' slices."""
    grouped: dict[str, list[str]] = {}
    for item_id in sorted(challenger.metrics[metric]):
        labels = _labels_of(challenger, item_id)
        if not labels or _labels_of(champion, item_id) != labels:
            raise InvalidInput(
                f"item {item_id!r} needs the same slice labels in both evaluations, not "
                f"{list(labels)} and {list(_labels_of(champion, item_id))}"
            )
        for label in labels:
            grouped.setdefault(label, []).append(item_id)
    return {label: grouped[label] for label in sorted(grouped)}


def require_known_slices(names: Iterable[str], labels: Iterable[str]) -> None:
    """InvalidInput, one line, when the gate config names a slice no eval item has."""
    labels = set(labels)
    unknown = sorted(set(names) - labels)
    if unknown:
        raise InvalidInput(
            f"the gate config names slices no eval item has: {unknown} "
            f"(the slices: {', '.join(sorted(labels)) or 'none'})"
        )


def _judge_slices(
    challenger: Evaluation, champion: Evaluation, policy: GatePolicy, *, is_binary: bool
) -> tuple[list[dict[str, Any]], float, list[str]]:
    """Per slice: its means, interval, test, whether it was judged and regressed; the
    Bonferroni-adjusted confidence the judged slices' intervals use; the reasons against."""
    metric = policy.primary_metric
    by_slice = _slice_items(challenger, champion, metric)
    require_known_slices(policy.slice_tolerances, by_slice)
    judged = sum(len(items) >= policy.min_slice_items for items in by_slice.values())
    confidence = 1 - (1 - policy.confidence) / max(1, judged)
    results, reasons = [], []
    for label, items in by_slice.items():
        result = _judge_slice(challenger, champion, policy, label, items, confidence, is_binary)
        results.append(result)
        if result["regressed"]:
            reasons.append(_slice_reason(metric, result))
    return results, confidence, reasons


def _judge_slice(
    challenger: Evaluation,
    champion: Evaluation,
    policy: GatePolicy,
    label: str,
    items: list[str],
    confidence: float,
    is_binary: bool,
) -> dict[str, Any]:
    new = {item: challenger.metrics[policy.primary_metric][item] for item in items}
    old = {item: champion.metrics[policy.primary_metric][item] for item in items}
    diffs = paired_diffs(new, old, f"slice {label!r}")
    interval = bootstrap(
        diffs, samples=policy.bootstrap_samples, confidence=confidence, seed=policy.seed
    )
    level = (1 - confidence) / 2  # one-sided: (1 - policy.confidence) / (2k)
    drop = drop_test(diffs) if is_binary else None
    is_significant = drop.p_value <= level if drop else interval.high < 0
    tolerance = policy.tolerance_of(label)
    is_judged = interval.n >= policy.min_slice_items
    return {
        "slice": label,
        "n": interval.n,
        "champion_mean": _mean(old),
        "challenger_mean": _mean(new),
        "delta": interval.mean_diff,
        "tolerance": tolerance,
        "judged": is_judged,
        "regressed": is_judged and is_significant and -interval.mean_diff > tolerance + _ROUNDING,
        "interval": interval.as_dict(),
        "drop_test": drop.as_dict(level) if drop else None,
    }


def _slice_reason(metric: str, result: dict[str, Any]) -> str:
    interval, test = result["interval"], result["drop_test"]
    evidence = (
        f"{test['losses']} losses, {test['wins']} wins, one-sided p = {test['p_value']:.4f}"
        if test
        else f"{_percent(interval['confidence'])} CI [{interval['low']:+.4f}, "
        f"{interval['high']:+.4f}]"
    )
    return (
        f"slice {result['slice']!r} regressed on {metric}: "
        f"{result['champion_mean']:.4f} -> {result['challenger_mean']:.4f} on "
        f"{result['n']} items ({evidence}), a drop beyond its tolerance of "
        f"{result['tolerance']:.4f}"
    )


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
