"""What keeps a version's train and eval apart at build time: new eval items whose prompt an
earlier version trained on are withheld from eval, and train items that overlap the eval set
(the same prompt key, n-gram overlap, near-duplicates) are dropped, counted by reason.

Both sides are compared by their stored sketches (flywheel.datasets.sketches). The eval index
of the last eval sets is kept in the process, keyed by the hash of the eval items and the
rules: a build whose eval set is the last one plus new items extends it with those items
only, instead of indexing the whole eval set again (the same index either way)."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from flywheel.bulk import chunked
from flywheel.datasets.decontamination import DecontaminationConfig, EvalIndex
from flywheel.datasets.items import KINDS, Item
from flywheel.datasets.models import SKETCHER, DatasetMember, DatasetVersion, ItemSketch
from flywheel.datasets.sketches import sketches_of
from flywheel.errors import InvalidState

if TYPE_CHECKING:
    from flywheel.datasets.service import DatasetRecipe

PROMPT_KEY: Final = "prompt_key"
"""Exclusion reason: a train item asks an eval item's question (the same prompt key)."""
PROMPT_TRAINED: Final = "prompt_trained"
"""Withheld from eval: a new eval item asks what an earlier version trained on."""
KEPT_INDEXES = 2
"""Eval indexes kept in the process (about 160 MB each for 100k eval items of 80 words)."""


def withhold_trained(
    session: Session,
    domain_id: uuid.UUID,
    evaluation: list[Item],
    evaluated: set[tuple[str, uuid.UUID]],
    ngram_words: int,
) -> tuple[list[Item], dict[str, int]]:
    """The eval items, less the new ones whose prompt an earlier version of the domain trained
    on (a model of that lineage would be scored on what it saw): they stay in their eval group
    and out of train, counted by reason. Only the new items' keys are looked up."""
    new = {(item.kind, item.id) for item in evaluation} - evaluated
    if not new:
        return evaluation, {}
    keys = {item.prompt_key for item in evaluation if (item.kind, item.id) in new}
    trained = _trained_keys(session, domain_id, {key for key in keys if key}, ngram_words)
    kept = [
        item
        for item in evaluation
        if (item.kind, item.id) not in new or item.prompt_key not in trained
    ]
    withheld = len(evaluation) - len(kept)
    return kept, {PROMPT_TRAINED: withheld} if withheld else {}


def _trained_keys(
    session: Session, domain_id: uuid.UUID, keys: set[str], ngram_words: int
) -> set[str]:
    """Which of these prompt-key hashes an item in train of a version of the domain has: the
    items with the keys first (by the key index), then their member rows (by the item
    indexes), so the plan starts from the few keys even while the statistics have not yet
    seen the last version's rows (which made it walk every train row of that version)."""
    sketch = ItemSketch.__table__.c
    versions = set(
        session.scalars(select(DatasetVersion.id).where(DatasetVersion.domain_id == domain_id))
    )
    found: set[str] = set()
    if not versions:
        return found
    for kind in KINDS:
        column = sketch[kind.member_column]
        member = getattr(DatasetMember, kind.member_column)
        for chunk in chunked(sorted(keys)):
            query = select(column, sketch.prompt_key).where(
                sketch.prompt_key.in_(chunk), sketch.ngram_words == ngram_words, column.is_not(None)
            )
            keyed: dict[uuid.UUID, str] = dict(iter(session.execute(query)))
            for ids in chunked(sorted(keyed)):
                rows = session.execute(
                    select(member, DatasetMember.dataset_version_id).where(
                        member.in_(ids), DatasetMember.split == "train"
                    )
                )
                found.update(keyed[item_id] for item_id, version in rows if version in versions)
    return found


def decontaminate(
    session: Session, train: list[Item], evaluation: list[Item], recipe: DatasetRecipe
) -> tuple[list[Item], Counter[str]]:
    """Drop train items that overlap the eval set; the reasons, counted. First the exact
    prompt key (the same question, whatever the answer: catches the short prompts n-grams
    cannot), then n-gram overlap and near-duplicates, both sides by their stored sketches
    (signed from the same one-field text; stored dedup signatures differ per table)."""
    if any(item.prompt_key is None for item in [*train, *evaluation]):
        raise InvalidState("an item has no sketch: ensure_sketches makes them")
    eval_keys = {item.prompt_key for item in evaluation}
    kept_by_key = [item for item in train if item.prompt_key not in eval_keys]
    reasons = Counter({PROMPT_KEY: len(train) - len(kept_by_key)})  # `+` below drops a 0
    train = kept_by_key
    config = DecontaminationConfig(
        ngram_words=recipe.ngram, near_duplicate_threshold=recipe.near_duplicate_threshold
    )
    index = eval_index(session, evaluation, config, recipe.ngram)
    sketches = sketches_of(session, train, recipe.ngram)
    dropped = dict(
        index.contaminated_sketches(
            (position, *sketches[item.id]) for position, item in enumerate(train)
        )
    )
    kept = [item for position, item in enumerate(train) if position not in dropped]
    return kept, reasons + Counter(dropped.values())


@dataclass(frozen=True)
class _Kept:
    items: frozenset[tuple[str, uuid.UUID]]
    index: EvalIndex


_kept: OrderedDict[str, _Kept] = OrderedDict()
_lock = threading.Lock()


def eval_index(
    session: Session, evaluation: list[Item], config: DecontaminationConfig, n: int
) -> EvalIndex:
    """The index of these eval items: a kept one for the same items, a kept one of a subset
    extended by the rest (only their sketches read), or a new one; kept for the next build."""
    items = frozenset((item.kind, item.id) for item in evaluation)
    key = _index_key(items, config)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key].index
        base = next(
            (
                kept
                for kept in reversed(_kept.values())
                if kept.index.config == config and kept.items <= items
            ),
            None,
        )
    if base is not None and config.max_eval_items_per_gram is None:
        added = [item for item in evaluation if (item.kind, item.id) not in base.items]
        index = base.index.extended(list(sketches_of(session, added, n).values()))
    else:
        index = EvalIndex.from_sketches(list(sketches_of(session, evaluation, n).values()), config)
    with _lock:
        _kept[key] = _Kept(items, index)
        while len(_kept) > KEPT_INDEXES:
            _kept.popitem(last=False)
    return index


def forget_indexes() -> None:
    """Drop the kept eval indexes (a from-scratch build, in tests and benchmarks)."""
    with _lock:
        _kept.clear()


def _index_key(items: frozenset[tuple[str, uuid.UUID]], config: DecontaminationConfig) -> str:
    """The hash of the rules and the item set: per kind, its count and its ids' bytes, sorted
    (100k eval items: 0.1 s; formatting each id as text took 1.4 s)."""
    by_kind: dict[str, list[bytes]] = {}
    for kind, item_id in items:
        by_kind.setdefault(kind, []).append(item_id.bytes)
    digest = hashlib.sha256(f"{SKETCHER}\n{config}\n".encode())
    for kind, ids in sorted(by_kind.items()):
        digest.update(f"{kind}:{len(ids)}\n".encode())
        digest.update(b"".join(sorted(ids)))
    return digest.hexdigest()
