"""What keeps a version's train and eval apart at build time: new eval items whose prompt an
earlier version trained on are withheld from eval, and train items that overlap the eval set
(the same prompt key, n-gram overlap, near-duplicates) are dropped, counted by reason.

Both sides are compared by their stored sketches (flywheel.datasets.sketches). The eval index
of a domain is kept, in the process (the last two, keyed by the hash of the eval items and the
rules) and in the database (flywheel.datasets.kept_index: in parts, which any process reads):
a build whose eval set is the kept one plus new items extends it with those items only,
instead of indexing the whole eval set again (the same index either way)."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from flywheel.bulk import chunked
from flywheel.datasets.decontamination import DecontaminationConfig, EvalIndex
from flywheel.datasets.items import KINDS, Item
from flywheel.datasets.kept_index import Kept, item_key, rules_of
from flywheel.datasets.models import SKETCHER, DatasetMember, DatasetVersion, ItemSketch
from flywheel.datasets.sketches import sketches_of
from flywheel.errors import InvalidState

if TYPE_CHECKING:
    from flywheel.datasets.service import DatasetRecipe

PROMPT_KEY: Final = "prompt_key"
"""Exclusion reason: a train item asks an eval item's question (the same prompt key)."""
PROMPT_TRAINED: Final = "prompt_trained"
"""Withheld from eval: a new eval item asks what an earlier version trained on."""
Indexer = Callable[[list[Item]], EvalIndex]
"""Makes the index of some eval items from their sketches."""
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
    session: Session,
    domain_id: uuid.UUID,
    train: list[Item],
    evaluation: list[Item],
    recipe: DatasetRecipe,
    *,
    read_kept: bool = True,
    sketches: dict[uuid.UUID, tuple[bytes, bytes]] | None = None,
) -> tuple[list[Item], Counter[str]]:
    """Drop train items that overlap the eval set; the reasons, counted. First the exact
    prompt key (the same question, whatever the answer: catches the short prompts n-grams
    cannot), then n-gram overlap and near-duplicates, both sides by their stored sketches
    (signed from the same one-field text; stored dedup signatures differ per table). The
    eval index is the domain's kept one where it can be (`eval_index`); `sketches` holds
    train items' sketches read already (`DomainRows.sketches`)."""
    if any(item.prompt_key is None for item in [*train, *evaluation]):
        raise InvalidState("an item has no sketch: ensure_sketches makes them")
    eval_keys = {item.prompt_key for item in evaluation}
    kept_by_key = [item for item in train if item.prompt_key not in eval_keys]
    reasons = Counter({PROMPT_KEY: len(train) - len(kept_by_key)})  # `+` below drops a 0
    train = kept_by_key
    config = DecontaminationConfig(
        ngram_words=recipe.ngram, near_duplicate_threshold=recipe.near_duplicate_threshold
    )
    index = eval_index(
        session, domain_id, evaluation, config, recipe.ngram, read_kept=read_kept, known=sketches
    )
    train_sketches = sketches_of(session, train, recipe.ngram, known=sketches)
    dropped = dict(
        index.contaminated_sketches(
            (position, *train_sketches[item.id]) for position, item in enumerate(train)
        )
    )
    kept = [item for position, item in enumerate(train) if position not in dropped]
    return kept, reasons + Counter(dropped.values())


@dataclass(frozen=True)
class _Kept:
    items: frozenset[bytes]  # `item_key`s
    index: EvalIndex


_kept: OrderedDict[str, _Kept] = OrderedDict()
_lock = threading.Lock()


def eval_index(
    session: Session,
    domain_id: uuid.UUID,
    evaluation: list[Item],
    config: DecontaminationConfig,
    n: int,
    *,
    read_kept: bool = True,
    known: dict[uuid.UUID, tuple[bytes, bytes]] | None = None,
) -> EvalIndex:
    """The index of these eval items (the domain's eval set), the same index however it is
    made: the one this process kept for the same items, or for a subset extended by the
    rest; else the domain's kept parts (`flywheel.datasets.kept_index`), extended likewise
    (`read_kept`: False makes it from the sketches instead); else made from every item's
    sketch (those in `known` read already). The parts are then brought up to these items,
    and the process keeps the index for its next build."""
    items = frozenset(item_key(item.kind, item.id) for item in evaluation)
    key = _index_key(items, config)

    def sketched(chosen: list[Item]) -> EvalIndex:
        return _from_sketches(session, chosen, config=config, n=n, known=known)

    index = _in_process(evaluation, items, key, config, sketched)
    if config.max_eval_items_per_gram is not None or not items:
        index = index or sketched(evaluation)
    else:
        index = _with_parts(
            session, domain_id, evaluation, items, key, config, index, read_kept, sketched
        )
    with _lock:
        _kept[key] = _Kept(items, index)
        while len(_kept) > KEPT_INDEXES:
            _kept.popitem(last=False)
    return index


def _in_process(
    evaluation: list[Item],
    items: frozenset[bytes],
    key: str,
    config: DecontaminationConfig,
    sketched: Indexer,
) -> EvalIndex | None:
    """The index this process kept for these items, or for a subset, extended by the rest
    (only their sketches read); None if it kept neither."""
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
    if base is None or config.max_eval_items_per_gram is not None:
        return None
    added = [item for item in evaluation if item_key(item.kind, item.id) not in base.items]
    return base.index.merged([sketched(added)])


def _with_parts(
    session: Session,
    domain_id: uuid.UUID,
    evaluation: list[Item],
    items: frozenset[bytes],
    key: str,
    config: DecontaminationConfig,
    index: EvalIndex | None,
    read_kept: bool,
    sketched: Indexer,
) -> EvalIndex:
    """The index (this process's, else from the domain's kept parts, else from sketches),
    with the parts brought up to these items: a part for the items they do not cover, or,
    when they cover an item no longer in eval, were made by other rules or are many, the
    index as the only part."""
    kept = Kept.read(session, domain_id, rules_of(config))
    if kept.covers(key):
        if index is None:
            index = kept.index(session, config) if read_kept else None
        return index or sketched(evaluation)
    covered = kept.items(session) if kept.is_usable else None
    if covered is None or not covered <= items or kept.is_full or not read_kept:
        index = index or sketched(evaluation)
        kept.replace(session, key, items, index)
        return index
    added = [item for item in evaluation if item_key(item.kind, item.id) not in covered]
    kept.add(session, key, items - covered, sketched(added))
    return index or kept.index(session, config)


def _from_sketches(
    session: Session,
    evaluation: list[Item],
    *,
    config: DecontaminationConfig,
    n: int,
    known: dict[uuid.UUID, tuple[bytes, bytes]] | None,
) -> EvalIndex:
    """The index of these items made from their stored sketches (those in `known` read
    already)."""
    sketches = sketches_of(session, evaluation, n, known=known)
    return EvalIndex.from_sketches(list(sketches.values()), config)


def forget_indexes() -> None:
    """Drop the eval indexes this process kept (a from-scratch build, in tests and
    benchmarks)."""
    with _lock:
        _kept.clear()


def _index_key(items: frozenset[bytes], config: DecontaminationConfig) -> str:
    """The hash of the rules and the item set (`item_key`s, sorted: 100k eval items in about
    0.1 s; formatting each id as text took 1.4 s)."""
    digest = hashlib.sha256(f"{SKETCHER}\n{config}\n".encode())
    digest.update(b"".join(sorted(items)))
    return digest.hexdigest()
