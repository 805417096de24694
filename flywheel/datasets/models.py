"""Dataset versions and the items they hold, split by split."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin, JsonType, set_index

# The item a member holds: exactly one of these columns is set.
ITEM_COLUMNS = (
    "sft_example_id",
    "preference_pair_id",
    "verifiable_task_id",
    "labeled_completion_id",
)


class ItemRefs:
    """The signal item a row is about: exactly one of these is set (`exactly_one_item`);
    deleting the item deletes the row."""

    sft_example_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("sft_examples.id", ondelete="CASCADE")
    )
    preference_pair_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("preference_pairs.id", ondelete="CASCADE")
    )
    verifiable_task_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("verifiable_tasks.id", ondelete="CASCADE")
    )
    labeled_completion_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("labeled_completions.id", ondelete="CASCADE")
    )


def exactly_one_item() -> CheckConstraint:
    return CheckConstraint(
        " + ".join(f"(CASE WHEN {column} IS NULL THEN 0 ELSE 1 END)" for column in ITEM_COLUMNS)
        + " = 1",
        name="exactly_one_item",
    )


class DatasetVersion(IdMixin, Base):
    """An immutable, content-addressed snapshot of a domain's signal."""

    __tablename__ = "dataset_versions"
    __table_args__ = (
        UniqueConstraint("domain_id", "version"),
        UniqueConstraint("domain_id", "manifest_sha256"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    version: Mapped[int]
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    recipe: Mapped[dict[str, Any]] = mapped_column(
        JsonType, default=dict, doc="Mixing weights, replay share, curriculum: enough to rebuild."
    )
    stats: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    parent_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="RESTRICT")
    )
    eval_sha256: Mapped[str | None] = mapped_column(
        String(64), doc="The eval split's own content hash: eval sets are versioned too."
    )
    tainted_at: Mapped[datetime | None] = mapped_column(
        default=None, doc="Set when data it used was deleted (forget): retrain from a new one."
    )
    tainted_by_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("forget_requests.id", ondelete="SET NULL"), doc="The forget that tainted it."
    )


class DatasetMember(ItemRefs, Base):
    """An item a domain's versions hold in one split, from the version that added the row
    (`dataset_version_id`) until `until_version` (flywheel.datasets.membership): a version
    stores what changed, not every item again. Exactly one of the item columns is set.

    Which versions of that span hold it: an eval row, each; a train row, its first version
    when it was new there (`is_new`), and each version whose replay draw picks the item.
    """

    __tablename__ = "dataset_members"
    __table_args__ = (
        CheckConstraint("split IN ('train', 'eval')", name="split"),
        exactly_one_item(),
        Index(None, "dataset_version_id", "split"),
        # Deleting an item (forget, a retraction) finds its rows through these, not by
        # scanning every version's rows per item; so do lineage and a build's history.
        *(set_index(column) for column in ITEM_COLUMNS),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    dataset_version_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="CASCADE")
    )
    split: Mapped[str] = mapped_column(String(8))
    group_key: Mapped[str] = mapped_column(String(255))
    weight: Mapped[float | None] = mapped_column(
        Float, doc="The item's weight when the version was built (items may be retracted later)."
    )
    position: Mapped[int | None] = mapped_column(
        doc="Order within the split of rows written for one version only (before versions "
        "shared rows, migration ddc2b6e1f3a8); None since: `ease`, then the content hash."
    )
    until_version: Mapped[int | None] = mapped_column(
        doc="The domain's first version number that no longer holds the row (None: still)."
    )
    is_new: Mapped[bool] = mapped_column(
        default=True,
        doc="Held by its first version whatever the replay draw (the item was new there, or "
        "an eval item); later versions of its span hold a train row when they draw it.",
    )
    content_sha256: Mapped[str | None] = mapped_column(
        String(64),
        doc="The item's content hash, kept here so a read draws the replay and orders the "
        "split from member rows alone, before reading any item (None: a row written for its "
        "version only, read in `position` order).",
    )
    ease: Mapped[float] = mapped_column(
        Float,
        default=0.0,
        doc="The curriculum's order key within a kind (flywheel.datasets.manifest), then the "
        "item's content hash: how training reads the split.",
    )


class DatasetGroup(IdMixin, Base):
    """Which split a group of a domain belongs to: decided once, at its first build, forever.

    A group that was ever in eval never enters train, and a trained-on group never becomes
    evaluation data (see flywheel.datasets.split).
    """

    __tablename__ = "dataset_groups"
    __table_args__ = (
        UniqueConstraint("domain_id", "group_key"),
        CheckConstraint("split IN ('train', 'eval')", name="split"),
    )

    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    group_key: Mapped[str] = mapped_column(String(255))
    split: Mapped[str] = mapped_column(String(8))
    first_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="SET NULL")
    )


SKETCHER = 1
"""The sketch rules' version (`flywheel.datasets.sketches`): bump it when normalisation, word
or gram hashing, or signing change, so stored sketches are rebuilt."""


class ItemSketch(ItemRefs, IdMixin, Base):
    """An item's decontamination sketch, computed once (flywheel.datasets.sketches): its
    prompt key's hash, its distinct hashed n-grams and its MinHash signature over the text
    decontamination compares. Exactly one item column is set; a sketch made by other rules
    (`sketcher`) is rebuilt, and deleting the item deletes its sketch."""

    __tablename__ = "item_sketches"
    __table_args__ = (
        exactly_one_item(),
        *(UniqueConstraint(column, "ngram_words") for column in ITEM_COLUMNS),
        Index(None, "prompt_key"),
    )

    sketcher: Mapped[int] = mapped_column(doc="The sketch rules' version (normaliser, hashes).")
    ngram_words: Mapped[int]
    prompt_key: Mapped[str] = mapped_column(String(64), doc="sha256 of the item's prompt key.")
    grams: Mapped[bytes] = mapped_column(
        LargeBinary, doc="Distinct n-gram hashes, sorted, little-endian uint64."
    )
    signature: Mapped[bytes] = mapped_column(
        LargeBinary, doc="MinHash signature of the compared text as one field."
    )


class EvalIndexPart(IdMixin, Base):
    """Part of a domain's kept eval index (flywheel.datasets.overlap): the eval items it
    covers, and their distinct n-gram hashes and MinHash signatures, as the index holds
    them. The union of a domain's parts (disjoint item sets) is the index of all their items,
    so a build in any process reads the parts instead of every eval item's sketch, and writes
    a part for the items it added. Made by one set of rules (`rules`: the sketcher and the
    decontamination settings); forgetting any item of the tenant deletes its parts."""

    __tablename__ = "eval_index_parts"
    __table_args__ = (Index(None, "domain_id"),)

    domain_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"))
    rules: Mapped[str] = mapped_column(String(255))
    number: Mapped[int] = mapped_column(doc="Its place among the domain's parts, from 0.")
    covers: Mapped[str] = mapped_column(
        String(64), doc="The index key of the items of this part and every earlier one."
    )
    item_count: Mapped[int]
    items: Mapped[bytes] = mapped_column(
        LargeBinary, doc="The items covered: per item its kind's number and id, 17 bytes."
    )
    grams: Mapped[bytes] = mapped_column(
        LargeBinary, doc="Their distinct n-gram hashes, sorted, little-endian uint64."
    )
    signatures: Mapped[bytes] = mapped_column(
        LargeBinary, doc="Their distinct signatures, little-endian uint32 rows."
    )
