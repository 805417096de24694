"""Group-aware train/eval split: a group's split is decided once and never changes.

A group (ticket thread, repository, prompt, task family) is the unit of assignment, so no group
ever straddles train and eval. A new group's split comes from a hash of (domain, group key):
the same group gets the same answer on every machine and in every build, with no state needed
to reproduce it. Groups already assigned keep their split whatever the eval fraction is now:
a group that was ever in eval never enters train (the frozen, append-only eval set), and a
group a model was trained on never becomes evaluation data.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from typing import Literal

from flywheel.errors import InvalidInput

Split = Literal["train", "eval"]


def hashed_split(domain_id: uuid.UUID, group_key: str, eval_fraction: float) -> Split:
    """Where a new group goes: eval for the share `eval_fraction` of the hash space."""
    if not 0 <= eval_fraction < 1:
        raise InvalidInput(f"the eval fraction is in [0, 1), not {eval_fraction}")
    digest = hashlib.sha256(f"{domain_id}\n{group_key}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return "eval" if position < eval_fraction else "train"


def assign_groups(
    domain_id: uuid.UUID,
    assigned: Mapping[str, Split],
    group_keys: Iterable[str],
    eval_fraction: float,
) -> dict[str, Split]:
    """The splits of the groups in `group_keys` that `assigned` does not hold yet.

    `assigned` is every group the domain has ever placed; its entries are never revisited.
    """
    return {
        group_key: hashed_split(domain_id, group_key, eval_fraction)
        for group_key in set(group_keys)
        if group_key not in assigned
    }
