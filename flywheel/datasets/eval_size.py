"""Whether a dataset version's eval split is big enough to gate on, said at build time with the
fix, instead of by `flywheel eval` after scoring (a small pilot's dead end).

    eval_size_warnings(session, domain, version, min_eval_items=0)   # [] or one-line warnings

A split is short when it has no item the gate can score, or fewer than the gate's minimum
(flywheel.evaluation.readiness). The fix depends on what a later build can still change:
groups already placed keep their split (flywheel.datasets.split), so only new groups can fill
eval: by the domain's `dataset.min_eval_items` (flywheel.datasets.settings), which new groups
fill first, or by a larger eval fraction. A pilot can also lower the gate's minimum
(`gate.min_items`) or promote with `--force`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flywheel.datasets.models import DatasetGroup, DatasetVersion
from flywheel.evaluation.readiness import EvalReadiness, eval_readiness
from flywheel.tenancy.models import Domain


def eval_size_warnings(
    session: Session, domain: Domain, version: DatasetVersion, *, min_eval_items: int
) -> list[str]:
    """One line per problem with the version's splits (none: an empty list)."""
    stats: dict[str, Any] = version.stats or {}
    readiness = eval_readiness(stats.get("eval") or {}, domain.config or {})
    warnings = []
    if readiness.is_short:
        placed = _placed_groups(session, domain)
        warnings.append(
            f"{_shortage(version, readiness, stats)} "
            f"{_fix(domain, readiness, placed, min_eval_items)}"
        )
    if not stats.get("train") and stats.get("eval"):
        warnings.append(
            f"v{version.version} of {domain.name} has no train items: every group is in eval "
            f"(dataset.min_eval_items is {min_eval_items}); add data to train on"
        )
    return warnings


def _shortage(version: DatasetVersion, readiness: EvalReadiness, stats: dict[str, Any]) -> str:
    name = f"v{version.version}"
    if not stats.get("eval"):
        return f"{name}'s eval split is empty: `flywheel eval` has nothing to score."
    if readiness.metric is None or not readiness.scored:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(stats["eval"].items()))
        metric = f" on {readiness.metric}" if readiness.metric else ""
        return f"{name}'s eval split ({kinds}) has no item the gate can score{metric}."
    return (
        f"{name}'s eval split has {readiness.scored} items the gate scores on "
        f"{readiness.metric}, fewer than its minimum of {readiness.min_items} "
        "(gate.min_items): every candidate will be refused."
    )


def _fix(
    domain: Domain, readiness: EvalReadiness, placed: dict[str, int], min_eval_items: int
) -> str:
    groups = sum(placed.values())
    kept = (
        f"The {groups} groups already placed ({placed.get('train', 0)} train, "
        f"{placed.get('eval', 0)} eval) keep their split; only new groups can go to eval"
    )
    wanted = max(readiness.min_items, min_eval_items)
    if min_eval_items < readiness.min_items:
        how = (
            f": declare `dataset: {{min_eval_items: {wanted}}}` in {domain.name}'s config "
            "(flywheel domains configure) so that new groups fill eval first, or build with a "
            "larger --eval-fraction, then add data"
        )
    else:
        how = f": add data (new groups fill eval first up to dataset.min_eval_items {wanted})"
    return (
        f"{kept}{how}. For a pilot, lower the gate's minimum (`gate: {{min_items: N}}`) or "
        "promote with `flywheel models promote --force`."
    )


def _placed_groups(session: Session, domain: Domain) -> dict[str, int]:
    rows = session.execute(
        select(DatasetGroup.split, func.count())
        .where(DatasetGroup.domain_id == domain.id)
        .group_by(DatasetGroup.split)
    )
    return {str(split): int(count) for split, count in rows}
