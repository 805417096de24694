"""What keeps a version's train and eval apart at build time: new eval items whose prompt an
earlier version trained on are withheld from eval, and train items that overlap the eval set
(the same prompt key, n-gram overlap, near-duplicates) are dropped, counted by reason."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from flywheel.datasets.decontamination import DecontaminationConfig, EvalIndex
from flywheel.datasets.items import Item, prompt_keys
from flywheel.datasets.models import DatasetVersion

if TYPE_CHECKING:
    from flywheel.datasets.service import DatasetRecipe

PROMPT_KEY: Final = "prompt_key"
"""Exclusion reason: a train item asks an eval item's question (the same prompt key)."""
PROMPT_TRAINED: Final = "prompt_trained"
"""Withheld from eval: a new eval item asks what an earlier version trained on."""


def withhold_trained(
    session: Session,
    domain_id: uuid.UUID,
    evaluation: list[Item],
    evaluated: set[tuple[str, uuid.UUID]],
) -> tuple[list[Item], dict[str, int]]:
    """The eval items, less the new ones whose prompt an earlier version of the domain trained
    on (a model of that lineage would be scored on what it saw): they stay in their eval group
    and out of train, counted by reason."""
    new = {(item.kind, item.id) for item in evaluation} - evaluated
    if not new:
        return evaluation, {}
    versions = session.scalars(
        select(DatasetVersion.id).where(DatasetVersion.domain_id == domain_id)
    )
    trained = prompt_keys(session, list(versions), "train")
    kept = [
        item
        for item in evaluation
        if (item.kind, item.id) not in new or item.prompt_key not in trained
    ]
    withheld = len(evaluation) - len(kept)
    return kept, {PROMPT_TRAINED: withheld} if withheld else {}


def decontaminate(
    train: list[Item], evaluation: list[Item], recipe: DatasetRecipe
) -> tuple[list[Item], Counter[str]]:
    """Drop train items that overlap the eval set; the reasons, counted. First the exact
    prompt key (the same question, whatever the answer: catches the short prompts n-grams
    cannot), then n-gram overlap and near-duplicates, both sides signed from the same
    one-field text (stored signatures differ per table)."""
    eval_keys = {item.prompt_key for item in evaluation}
    kept_by_key = [item for item in train if item.prompt_key not in eval_keys]
    reasons = Counter({PROMPT_KEY: len(train) - len(kept_by_key)})  # `+` below drops a 0
    train = kept_by_key
    config = DecontaminationConfig(
        ngram_words=recipe.ngram, near_duplicate_threshold=recipe.near_duplicate_threshold
    )
    index = EvalIndex.build(((item.text, None) for item in evaluation), config)
    dropped = dict(
        index.contaminated((position, item.text, None) for position, item in enumerate(train))
    )
    kept = [item for position, item in enumerate(train) if position not in dropped]
    return kept, reasons + Counter(dropped.values())
