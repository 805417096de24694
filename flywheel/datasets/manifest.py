"""A version's order and hashes: the curriculum order of each split, the manifest hash (the
recipe and every item, in order: the same inputs give the same hash) and the eval split's own
hash, and the per-split counts kept in its stats."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from flywheel.datasets.items import Item

if TYPE_CHECKING:
    from flywheel.datasets.service import DatasetRecipe


def order_items(items: list[Item], curriculum: str) -> list[Item]:
    """Tasks easy first (highest pass rate; unknown difficulty last) when asked, then
    everything else; ties broken by content hash, so the order is reproducible. Within a
    kind, the order of (`ease_of`, content hash): how a version's rows are read back."""
    return sorted(
        items, key=lambda item: (ease_of(item, curriculum), item.kind, item.content_sha256)
    )


def ease_of(item: Item, curriculum: str) -> float:
    """The curriculum's order key of an item (lowest first; 0 for every item without one)."""
    if curriculum != "easy_first":
        return 0.0
    if item.kind != "task":
        return 2.0
    return -item.difficulty if item.difficulty is not None else 1.0


def manifest_hashes(ordered: dict[str, list[Item]], recipe: DatasetRecipe) -> tuple[str, str]:
    """The version's hash (recipe and every item, in order) and its eval split's hash."""
    eval_hash = hash_lines(_lines("eval", ordered["eval"]))
    everything = [json.dumps(asdict(recipe), sort_keys=True)]
    everything += [*_lines("eval", ordered["eval"]), *_lines("train", ordered["train"])]
    return hash_lines(everything), eval_hash


def _lines(split: str, items: Iterable[Item]) -> list[str]:
    return [manifest_line(split, item.kind, item.content_sha256, item.weight) for item in items]


def manifest_line(split: str, kind: str, content_sha256: str, weight: float) -> str:
    """One item's line of the manifest."""
    return f"{split}\t{kind}\t{content_sha256}\t{weight:.9g}"


def hash_lines(lines: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def split_counts(ordered: dict[str, list[Item]]) -> dict[str, Any]:
    return {
        split: dict(Counter(item.kind for item in items)) for split, items in ordered.items()
    } | {
        "groups": {
            split: len({item.group_key for item in items}) for split, items in ordered.items()
        }
    }
