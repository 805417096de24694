"""Which slices an eval item belongs to: its source kind, its tags, its difficulty, and the
domain's own slice rules.

    item_slices(rows, rules)  # item id -> ("source:ticket", "ticket.category:billing", ...)

- `source:<kind>`: where the item came from (`source:ticket`, `source:feedback`, ...);
- every tag the source gave it (stored on the signal row: `ticket.category:billing`,
  task files' own tags);
- `difficulty:<bucket>` for verifiable tasks with a measured difficulty (a model's pass rate
  p): `easy` for p >= 2/3, `medium` for 1/3 <= p < 2/3, `hard` for p < 1/3;
- the domain config's `slice_rules`, `{label: regex}`: the label for every item whose prompt
  the regex matches (`re.search`). For sources that carry no labels of their own, such as
  compiled feedback: the arithmetic demo labels its sums `skill:carry` and `skill:no-carry`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from flywheel.errors import InvalidInput

EASY_FROM, MEDIUM_FROM = 2 / 3, 1 / 3


def difficulty_bucket(pass_rate: float | None) -> str | None:
    """`difficulty:easy|medium|hard` for a task's pass rate; None when it was not measured.

    >>> difficulty_bucket(0.9), difficulty_bucket(0.5), difficulty_bucket(0.0)
    ('difficulty:easy', 'difficulty:medium', 'difficulty:hard')
    """
    if pass_rate is None:
        return None
    if pass_rate >= EASY_FROM:
        return "difficulty:easy"
    return "difficulty:medium" if pass_rate >= MEDIUM_FROM else "difficulty:hard"


def slice_rules(config: Mapping[str, Any]) -> dict[str, re.Pattern[str]]:
    """The domain config's `slice_rules`, compiled; InvalidInput names a bad one."""
    rules = config.get("slice_rules") or {}
    if not isinstance(rules, dict):
        raise InvalidInput("slice_rules in the domain config maps slice labels to regexes")
    compiled = {}
    for label, pattern in rules.items():
        try:
            compiled[str(label)] = re.compile(str(pattern))
        except re.error as error:
            raise InvalidInput(f"slice rule {label!r} is not a regex: {error}") from error
    return compiled


def item_slices(
    rows: Iterable[Mapping[str, Any]], rules: Mapping[str, re.Pattern[str]]
) -> dict[str, tuple[str, ...]]:
    """Item id -> its slice labels, sorted, each once (rows from `version_item_labels`)."""
    slices = {}
    for row in rows:
        labels = {f"source:{row['source_kind']}", *row["tags"]}
        bucket = difficulty_bucket(row["difficulty"])
        labels |= {bucket} if bucket else set()
        labels |= {label for label, rule in rules.items() if rule.search(row["prompt"] or "")}
        slices[row["item_id"]] = tuple(sorted(labels))
    return slices
