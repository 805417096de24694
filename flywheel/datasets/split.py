"""Group-aware train/eval split: a group's split is decided once and never changes.

A group (ticket thread, repository, prompt, task family) is the unit of assignment, so no group
ever straddles train and eval. A new group's place comes from a hash of (domain, group key):
its position in [0, 1), the same on every machine and in every build. Each build places only
the groups no earlier build placed, with that build's eval fraction: a group whose position is
below the fraction goes to eval. Groups already placed keep their split whatever the fraction
is now: a group that was ever in eval never enters train (the frozen, append-only eval set),
and a group a model was trained on never becomes evaluation data — so a larger fraction later
moves more of the *new* groups into eval, never an old one.

A domain may declare a minimum eval size (`min_eval_items`, flywheel.datasets.settings): while
its eval set is short of it, new groups fill eval first, in the order of their positions (the
groups a larger fraction would have taken first), each counting its items, until the minimum
is met; the fraction then places the rest. The same new groups, sizes and shortfall give the
same answer, so a build stays deterministic.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from typing import Literal

from flywheel.errors import InvalidInput

Split = Literal["train", "eval"]


def position_of(domain_id: uuid.UUID, group_key: str) -> float:
    """The group's place in [0, 1): a hash of (domain, group key)."""
    digest = hashlib.sha256(f"{domain_id}\n{group_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hashed_split(domain_id: uuid.UUID, group_key: str, eval_fraction: float) -> Split:
    """Where a new group goes by the fraction alone: eval for that share of the hash space."""
    _check_fraction(eval_fraction)
    return "eval" if position_of(domain_id, group_key) < eval_fraction else "train"


def assign_groups(
    domain_id: uuid.UUID,
    assigned: Mapping[str, Split],
    group_keys: Iterable[str],
    eval_fraction: float,
    *,
    eval_shortfall: int = 0,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, Split]:
    """The splits of the groups in `group_keys` that `assigned` does not hold yet.

    `assigned` is every group the domain has ever placed; its entries are never revisited.
    `eval_shortfall`: how many items the eval set lacks of the domain's minimum; new groups
    fill it first, in position order, each counting `sizes[group]` items (1 when absent).
    """
    _check_fraction(eval_fraction)
    new = {key for key in group_keys if key not in assigned}
    ordered = sorted(new, key=lambda key: (position_of(domain_id, key), key))
    placed: dict[str, Split] = {}
    shortfall = eval_shortfall
    for key in ordered:
        is_eval = position_of(domain_id, key) < eval_fraction or shortfall > 0
        if is_eval:
            shortfall -= (sizes or {}).get(key, 1)
        placed[key] = "eval" if is_eval else "train"
    return placed


def _check_fraction(eval_fraction: float) -> None:
    if not 0 <= eval_fraction < 1:
        raise InvalidInput(f"the eval fraction is in [0, 1), not {eval_fraction}")
