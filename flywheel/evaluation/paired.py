"""Paired statistics of two models on the same items: the bootstrap interval of the mean
difference and the exact sign test on discordant items (`flywheel.evaluation.gate` decides
with them).

Paired: each item's score difference is one observation, and the bootstrap resamples item
indices, the same for both models. Both models must have scored exactly the same items
(`paired_diffs` raises `InvalidInput` otherwise): comparing on the intersection would drop the
items one model crashed on, precisely the ones it failed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from flywheel.errors import InvalidInput

ItemScores: TypeAlias = Mapping[str, float]
"""One metric's scores: eval item id -> score in [0, 1] (pass@1 0/1, exact match 0/1, ...)."""

Floats: TypeAlias = npt.NDArray[np.float64]

_DRAWS_PER_CHUNK = 1 << 22
"""Resampled indices drawn at once (32 MiB of int64): memory stays flat for large eval sets."""


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
    diffs = paired_diffs(challenger, champion, "the primary metric")
    return bootstrap(diffs, samples=samples, confidence=confidence, seed=seed)


def paired_diffs(challenger: ItemScores, champion: ItemScores, metric: str) -> Floats:
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


def bootstrap(diffs: Floats, *, samples: int, confidence: float, seed: int) -> Interval:
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


@dataclass(frozen=True)
class SignTest:
    """The exact one-sided paired test of a binary metric on its discordant items."""

    wins: int
    """Items only the challenger passed."""
    losses: int
    """Items only the champion passed."""
    p_value: float
    """P(X >= wins), X ~ Binomial(wins + losses, 1/2) — for a slice's drop test P(X >= losses):
    1 when there are no discordant items."""

    def as_dict(self, level: float) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"level": level, "passed": self.p_value <= level}


def sign_test(diffs: Floats) -> SignTest:
    """Exact McNemar (the sign test on discordant pairs) for per-item differences in
    {-1, 0, 1}: how likely this many wins, or more, would be if the two models were equal.

    >>> sign_test(np.array([1.0, 1.0, 1.0, 1.0] + [0.0] * 26)).p_value
    0.0625
    """
    wins, losses = int((diffs > 0).sum()), int((diffs < 0).sum())
    return SignTest(wins, losses, _binomial_tail(wins, wins + losses))


def drop_test(diffs: Floats) -> SignTest:
    """The sign test the other way round: how likely this many losses, or more."""
    reverse = sign_test(-diffs)
    return SignTest(wins=reverse.losses, losses=reverse.wins, p_value=reverse.p_value)


def _binomial_tail(k: int, m: int) -> float:
    """P(X >= k) for X ~ Binomial(m, 1/2), summed in log space (no huge integers)."""
    if k <= 0:
        return 1.0
    logs = [
        math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) - m * math.log(2)
        for i in range(k, m + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(value - top) for value in logs))
