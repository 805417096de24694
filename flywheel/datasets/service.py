"""Building immutable dataset versions: eligible signal, group-aware split, decontamination,
curriculum order and a manifest hash that is the same for the same inputs and recipe.

What a version holds:
- eval: every item of an eval group (flywheel.datasets.split) that is eligible now, plus every
  item any earlier version held in eval (the eval set is append-only and frozen);
- train: eligible items of train groups that no earlier version held (new), plus a replay
  share of those it did (so adapters do not forget), minus what overlaps the eval set: the
  same prompt key (`flywheel.datasets.items`: the same question, whatever the answer, from
  this domain, a replay or a mix), 13-gram overlap or near-duplicate
  (flywheel.datasets.decontamination), counted by reason in the stats' `contaminated`;
- a new eval item whose prompt key an earlier version trained on is withheld from eval (it
  stays in its eval group, so out of train too), counted in `withheld_from_eval`.
Eligible: weight > 0 (retracted items are out), not a near-duplicate of another item, and for
code tasks a verifier status of usable.

Mixing (`DatasetRecipe.mix`): a share of each named domain's train items joins train, drawn by
content hash; only from groups that domain's own builds placed in train and never an item it
evaluated on, and train is decontaminated against that domain's eval items too. A domain must
have a version of its own before it can be mixed in. `DatasetRecipe.source_weights` scales train
items' weights by their source kind (0 leaves a source out). Both are part of the recipe, so of
the manifest hash; a changed mix makes a new version even when no item is new.

What a build reads: each item's sketch (flywheel.datasets.sketches: its prompt-key hash,
n-grams and signature), made once, when a build first needs it, and stored; an item's text is
read only then. Decontamination compares sketches, against the eval index the last build of
the eval set kept (flywheel.datasets.overlap), extended by the new eval items. So a build after
a few new items sketches those, and reads the sketches of this version's train candidates
only; its manifest is the one a build from scratch (no sketch, no kept index) would give.

What a version stores (flywheel.datasets.membership): rows for what changed since its parent,
each spanning the versions that hold it; the replay draw is made again when a version is read.
The manifest hash is of what the version holds, as before, so it is the one a build from
scratch gives.

What a build reads after the first: when the parent was built by these rules from the same
recipe, without a mix, only what may change (`DomainRows.load_changing`): the eligible items
without an open row (new ones), the eval rows, the train rows this version's draw picks, and
the rows whose item left. The undrawn train rows (about two thirds of a domain at the default
replay fraction) are neither read nor checked, as a full build keeps them unchecked too; the
rest is the same code, so the version is the one a full build gives (`from_scratch=True`
reads everything). The work is still in proportion to what the version holds (eval and replay
included), not to what is new.

Small domains: the recipe's eval fraction places only groups no build placed yet, and a
domain's `dataset.min_eval_items` (flywheel.datasets.settings) makes new groups fill eval first
while its eval groups hold fewer items (the minimum used is kept in the stats). A build whose
eval split is empty or below the gate's minimum returns warnings with the fix
(`Built.warnings`, flywheel.datasets.eval_size).
"""

from __future__ import annotations

import contextlib
import gc
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from flywheel.bulk import chunked, insert_new_rows
from flywheel.datasets.eval_size import eval_size_warnings
from flywheel.datasets.items import KINDS, History, Item
from flywheel.datasets.manifest import manifest_hashes, order_items, split_counts
from flywheel.datasets.membership import DomainRows, Wanted, is_drawn, write_changes
from flywheel.datasets.models import (
    SKETCHER,
    DatasetGroup,
    DatasetMember,
    DatasetVersion,
    ItemSketch,
)
from flywheel.datasets.settings import dataset_settings
from flywheel.datasets.split import Split, assign_groups
from flywheel.datasets.versions import latest_version
from flywheel.db import domain_lock, refresh_statistics, utcnow
from flywheel.errors import InvalidInput, NotFound
from flywheel.signals.models import (
    SOURCE_KINDS,
)
from flywheel.tenancy.models import Domain
from flywheel.tenancy.service import get_domain

BUILDER = 2
"""The build rules' version, kept in each version's stats: a version built by older rules (1:
before prompt keys kept eval prompts out of train) is rebuilt even when no item is new."""


@dataclass(frozen=True)
class DatasetRecipe:
    """How a version is built: recorded in it, so the same recipe on the same signal gives
    the same version (and manifest hash)."""

    eval_fraction: float = 0.1
    replay_fraction: float = 0.25
    ngram: int = 13
    near_duplicate_threshold: float = 0.85
    curriculum: str = "easy_first"  # tasks by verifier pass rate, highest first; or "none"
    # other domains of the tenant -> the share (0, 1] of their train items mixed into train
    mix: dict[str, float] = field(default_factory=dict)
    # source kind -> a multiplier of its train items' weights (0 leaves the source out)
    source_weights: dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        if not 0 <= self.eval_fraction < 1:
            raise InvalidInput(f"eval fraction must be in [0, 1), not {self.eval_fraction}")
        if not 0 <= self.replay_fraction <= 1:
            raise InvalidInput(f"replay fraction must be in [0, 1], not {self.replay_fraction}")
        if self.ngram < 1:
            raise InvalidInput(f"the n-gram length must be at least 1, not {self.ngram}")
        if self.curriculum not in ("easy_first", "none"):
            raise InvalidInput(f"curriculum must be easy_first or none, not {self.curriculum!r}")
        for name, share in self.mix.items():
            if not 0 < share <= 1:
                raise InvalidInput(f"the mixing share of domain {name!r} must be in (0, 1]")
        for kind, weight in self.source_weights.items():
            if kind not in SOURCE_KINDS:
                known = ", ".join(SOURCE_KINDS)
                raise InvalidInput(f"unknown source kind {kind!r} (one of {known})")
            if not 0 <= weight < float("inf"):
                raise InvalidInput(f"the weight of source {kind!r} must be >= 0, not {weight}")


@dataclass
class Built:
    """The outcome of a build: the version, and whether it is new (False: nothing changed
    since the latest version, which is returned)."""

    version: DatasetVersion
    is_new: bool
    stats: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    """One line per problem with the splits, with its fix (flywheel.datasets.eval_size)."""
    rows: dict[str, int] = field(default_factory=dict)
    """Member rows the version kept open, closed and added (flywheel.datasets.membership)."""
    considered: int = 0
    """Items of the domain the build looked at: every eligible one from scratch, what may
    change for an incremental build (`DomainRows.load_changing`)."""


def build_dataset_version(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    recipe: DatasetRecipe,
    from_scratch: bool = False,
) -> Built:
    """Build the domain's next version (or find that nothing changed), with warnings when
    its eval split is too small to gate on. `from_scratch` reads every item and member row
    of the domain even where an incremental build could (the same version either way)."""
    recipe.check()
    domain = session.get_one(Domain, domain_id)
    min_eval_items = dataset_settings(domain).min_eval_items
    with _cyclic_gc_paused():
        built = _build(session, tenant_id, domain_id, recipe, min_eval_items, from_scratch)
    built.warnings = eval_size_warnings(
        session, domain, built.version, min_eval_items=min_eval_items
    )
    return built


def _build(
    session: Session,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    recipe: DatasetRecipe,
    min_eval_items: int,
    from_scratch: bool,
) -> Built:
    # Here: decontamination and sketches load numpy, which the version reads (`flywheel
    # dataset list`) skip.
    from flywheel.datasets.overlap import decontaminate, withhold_trained
    from flywheel.datasets.sketches import ensure_sketches, read_with_sketches, with_sketches

    domain_lock(session, domain_id, "dataset-build")
    session.flush()  # the reads below run on the connection (Core rows: a third of the cost)
    parent = latest_version(session=session, domain_id=domain_id)
    domains = _sketched_domains(session, tenant_id, domain_id, recipe)
    # Sketches are read by joins whose plans need current statistics (`refresh_statistics`).
    refresh_statistics(session, ItemSketch.__tablename__)
    if parent is None or parent.stats.get("sketcher") != SKETCHER:
        # The first build under these sketch rules: every item of the domains, held by an
        # earlier version or not (what they trained on keeps new eval items out). After it,
        # each build sketches the items it reads without one.
        made = ensure_sketches(session, domains, recipe.ngram)
        refresh_statistics(session, ItemSketch.__tablename__, written=made)
    number = (parent.version + 1) if parent else 1
    if not from_scratch and _is_incremental(parent, recipe):
        # Its joins of open rows to items plan by statistics, stale right after a build wrote
        # a domain's rows (at 100k items, a nested loop: 185 s instead of about 1 s).
        for table in (DatasetMember.__tablename__, *(kind.model.__tablename__ for kind in KINDS)):
            refresh_statistics(session, table)
        changing, rows = DomainRows.load_changing(
            session, domain_id, number, recipe.replay_fraction, recipe.ngram
        )
        eligible = with_sketches(session, changing, recipe.ngram)
        known = rows.sketches
    else:
        eligible, known = read_with_sketches(session, domain_id, recipe.ngram)
        rows = DomainRows.load(session, domain_id)
    history = rows.history
    considered = len(eligible)
    mixed, their_eval = _mixed_items(session, tenant_id, domain_id, recipe)
    splits = _assign(session, domain_id, recipe, eligible, min_eval_items)
    evaluation, train, undrawn, stats = _choose(
        [*eligible, *mixed], splits, history, recipe, number, drawn=rows.drawn
    )
    is_same = parent is not None and _is_same_recipe(parent, recipe)
    if parent is not None and is_same and not stats["new"] and not stats["new_eval"]:
        return Built(parent, False, parent.stats, considered=considered)  # nothing new
    evaluation, stats["withheld_from_eval"] = withhold_trained(
        session, domain_id, evaluation, history.evaluated, recipe.ngram
    )
    train, stats["source_weighted_out"] = _source_weighted(train, recipe.source_weights)
    undrawn, _ = _source_weighted(undrawn, recipe.source_weights)
    train, contaminated = decontaminate(
        session,
        domain_id,
        train,
        [*evaluation, *their_eval],
        recipe,
        read_kept=not from_scratch,
        sketches=known,
    )
    if parent is not None and is_same and not _has_new(evaluation, train, history):
        # what was new was left out again (withheld, weighted out, contaminated): no new version
        return Built(parent, False, parent.stats, considered=considered)
    stats["contaminated"] = dict(contaminated)
    stats["builder"] = BUILDER
    stats["sketcher"] = SKETCHER
    stats["min_eval_items"] = min_eval_items
    ordered = {
        "eval": order_items(evaluation, "none"),
        "train": order_items(train, recipe.curriculum),
    }
    manifest, eval_sha256 = manifest_hashes(ordered, recipe)
    if parent is not None and parent.manifest_sha256 == manifest:
        return Built(parent, False, parent.stats, considered=considered)
    stats |= split_counts(ordered)
    version = DatasetVersion(
        tenant_id=tenant_id,
        domain_id=domain_id,
        version=number,
        manifest_sha256=manifest,
        eval_sha256=eval_sha256,
        recipe=asdict(recipe),
        stats=stats,
        parent_id=parent.id if parent else None,
    )
    session.add(version)
    session.flush()
    _record_groups(session, domain_id, splits.new, version.id)
    wanted = Wanted(ordered["eval"], ordered["train"], undrawn, recipe.curriculum)
    changed = write_changes(session, version, wanted, rows)
    return Built(version, True, stats, rows=changed, considered=considered)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a build, which holds an item object per item it
    reads and frees them when it ends (reference counting frees them; they form no cycles):
    each full collection walks every one of them, and the build's own allocations trigger
    one after another (+1% on 1M items: 14 full collections, 4.8 s of a 19 s build). On
    again after it, as it was. The collector is the process's: a worker running jobs side by
    side (`flywheel worker --concurrency` above 1) has it paused for them too while a build
    runs, and on again when the build that paused it ends (others' cycles wait till then)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_for(
    *, session: Session, tenant_id: uuid.UUID, domain: str, recipe: DatasetRecipe
) -> Built:
    """`build_dataset_version` for a domain named by its tenant (NotFound otherwise)."""
    domain_id = get_domain(session, tenant_id, domain).id
    return build_dataset_version(
        session=session, tenant_id=tenant_id, domain_id=domain_id, recipe=recipe
    )


def taint_versions(
    session: Session, version_ids: Iterable[uuid.UUID], *, request_id: uuid.UUID
) -> None:
    """Mark the versions tainted by this forget request (the first request stays recorded)."""
    now = utcnow()
    for chunk in chunked(version_ids):
        session.execute(
            update(DatasetVersion)
            .where(DatasetVersion.id.in_(chunk), DatasetVersion.tainted_at.is_(None))
            .values(tainted_at=now, tainted_by_id=request_id)
        )


def get_version(session: Session, domain: Domain, number: int) -> DatasetVersion:
    """The domain's version `number`; NotFound (naming the fix) otherwise."""
    found = session.scalar(
        select(DatasetVersion).where(
            DatasetVersion.domain_id == domain.id, DatasetVersion.version == number
        )
    )
    if found is None:
        raise NotFound(
            f"dataset version {number} not found: domain {domain.name!r} has no dataset "
            f"v{number} (flywheel dataset build --domain {domain.name})"
        )
    return found


def _is_incremental(parent: DatasetVersion | None, recipe: DatasetRecipe) -> bool:
    """Whether a build may look at what can change only (`DomainRows.load_changing`): after
    a version built by these rules from this very recipe, which mixes in no other domain.
    Then no open row holds another domain's item (the parent's build closed those), and an
    open train row this version does not draw stays as it is, as in a full build: the
    parent's build already closed those its source weights leave out. Any other recipe, or
    a first build, reads everything."""
    return (
        parent is not None
        and parent.recipe == asdict(recipe)
        and not recipe.mix
        and parent.stats.get("builder") == BUILDER
        and parent.stats.get("sketcher") == SKETCHER
    )


def _is_same_recipe(parent: DatasetVersion, recipe: DatasetRecipe) -> bool:
    """Whether the parent was built by these rules with this mix (see `_same_mix`)."""
    return _same_mix(parent, recipe) and parent.stats.get("builder") == BUILDER


def _has_new(evaluation: list[Item], train: list[Item], history: History) -> bool:
    """Whether the splits hold an item no earlier version held there."""
    return any((item.kind, item.id) not in history.evaluated for item in evaluation) or any(
        (item.kind, item.id) not in history.seen for item in train
    )


def _same_mix(parent: DatasetVersion, recipe: DatasetRecipe) -> bool:
    """Whether the parent was mixed and weighted as the recipe asks (a changed mix makes a
    new version even when no item is new; the other fields only act on new items)."""
    return bool(
        parent.recipe.get("mix", {}) == recipe.mix
        and parent.recipe.get("source_weights", {}) == recipe.source_weights
    )


def _mixed_items(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, recipe: DatasetRecipe
) -> tuple[list[Item], list[Item]]:
    """The recipe's share of each mixed-in domain's train items, and those domains' eval items
    (train is decontaminated against them too). Only groups that domain's own builds put in
    train are drawn from (its eval set stays unseen), never an item it ever evaluated on;
    drawn by content hash (the same items every time for the same share)."""
    from flywheel.datasets.sketches import sketched_items  # numpy: only builds load it

    items: list[Item] = []
    their_eval: list[Item] = []
    for name, share in sorted(recipe.mix.items()):
        other = _mixed_domain(session, tenant_id, domain_id, name)
        train_groups = set(
            session.scalars(
                select(DatasetGroup.group_key).where(
                    DatasetGroup.domain_id == other, DatasetGroup.split == "train"
                )
            )
        )
        evaluated = DomainRows.load(session, other).history.evaluated
        for item in sketched_items(session, other, recipe.ngram):
            if item.group_key not in train_groups or (item.kind, item.id) in evaluated:
                their_eval.append(item)  # or not yet placed: compared against, never drawn
            elif _drawn(f"mix:{other}", item, share):
                items.append(replace(item, mixed_from=name))
    return items, their_eval


def _sketched_domains(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, recipe: DatasetRecipe
) -> list[uuid.UUID]:
    """The domains whose items a build compares: its own, those it mixes in now, and those
    its earlier versions mixed in (their trained prompts keep new eval items out)."""
    names = set(recipe.mix)
    for mixed in session.scalars(
        select(DatasetVersion.recipe).where(DatasetVersion.domain_id == domain_id)
    ):
        names.update(mixed.get("mix", {}))
    others = session.scalars(
        select(Domain.id).where(Domain.tenant_id == tenant_id, Domain.name.in_(sorted(names)))
    )
    return [domain_id, *sorted(set(others) - {domain_id})]


def _mixed_domain(
    session: Session, tenant_id: uuid.UUID, domain_id: uuid.UUID, name: str
) -> uuid.UUID:
    other = session.scalars(
        select(Domain.id).where(Domain.tenant_id == tenant_id, Domain.name == name)
    ).first()
    if other is None:
        raise InvalidInput(f"cannot mix in domain {name!r}: the tenant has no such domain")
    if other == domain_id:
        raise InvalidInput(f"domain {name!r} is the one being built: mix in other domains")
    if latest_version(session=session, domain_id=other) is None:
        raise InvalidInput(
            f"cannot mix in {name!r} before it has a dataset version of its own (its eval "
            f"set must be frozen first): flywheel dataset build --domain {name}"
        )
    return other


def _source_weighted(train: list[Item], weights: dict[str, float]) -> tuple[list[Item], int]:
    """Train items with their source's weight applied, and how many were weighted to 0 (and
    left out)."""
    if not weights:
        return train, 0
    weighted = [
        replace(item, weight=item.weight * weights.get(item.source_kind, 1.0)) for item in train
    ]
    kept = [item for item in weighted if item.weight > 0]
    return kept, len(weighted) - len(kept)


@dataclass
class _Splits:
    assigned: dict[str, Split]
    new: dict[str, Split]

    def of(self, group_key: str) -> Split:
        return self.new.get(group_key) or self.assigned[group_key]


def _assign(
    session: Session,
    domain_id: uuid.UUID,
    recipe: DatasetRecipe,
    eligible: list[Item],
    min_eval_items: int,
) -> _Splits:
    """Place the groups no build placed yet: new groups fill eval first while the eval groups
    hold fewer eligible items than the domain's minimum, then the recipe's fraction."""
    assigned: dict[str, Split] = {
        group_key: cast(Split, split)
        for group_key, split in session.connection().execute(
            select(DatasetGroup.group_key, DatasetGroup.split).where(
                DatasetGroup.domain_id == domain_id
            )
        )
    }
    sizes = Counter(item.group_key for item in eligible)
    in_eval = sum(count for key, count in sizes.items() if assigned.get(key) == "eval")
    new = assign_groups(
        domain_id,
        assigned,
        sizes,
        recipe.eval_fraction,
        eval_shortfall=max(0, min_eval_items - in_eval),
        sizes=sizes,
    )
    return _Splits(assigned, new)


def _choose(
    eligible: list[Item],
    splits: _Splits,
    history: History,
    recipe: DatasetRecipe,
    number: int,
    *,
    drawn: AbstractSet[uuid.UUID] = frozenset(),
) -> tuple[list[Item], list[Item], list[Item], dict[str, Any]]:
    """Eval, train (new and replayed) and the replay candidates this version did not draw
    (`drawn`: items its draw is known to pick, as `DomainRows.drawn`)."""
    evaluation: list[Item] = []
    train: list[Item] = []
    undrawn: list[Item] = []
    counts: Counter[str] = Counter()
    for item in eligible:
        key = (item.kind, item.id)
        if item.mixed_from is not None:
            counts[f"mixed:{item.mixed_from}"] += 1
        if item.mixed_from is None and (
            splits.of(item.group_key) == "eval" or key in history.evaluated
        ):
            evaluation.append(item)
            counts["new_eval"] += key not in history.evaluated
        elif key not in history.seen:
            train.append(item)
            counts["new"] += 1
        elif item.id in drawn or _drawn(str(number), item, recipe.replay_fraction):
            # replay: drawn afresh each version
            train.append(item)
            counts["replayed"] += 1
        else:
            undrawn.append(item)
    names = ("new", "new_eval", "replayed")
    mixed = {key.partition(":")[2]: n for key, n in sorted(counts.items()) if ":" in key}
    stats = {name: counts[name] for name in names} | {"mixed": mixed}
    return evaluation, train, undrawn, stats


def _drawn(salt: str, item: Item, fraction: float) -> bool:
    """A deterministic sample: the same salt and fraction draw the same items."""
    return is_drawn(salt, item.content_sha256, fraction)


def _record_groups(
    session: Session, domain_id: uuid.UUID, new: dict[str, Split], version_id: uuid.UUID
) -> None:
    rows = [
        {
            "id": uuid.uuid4(),
            "created_at": utcnow(),
            "domain_id": domain_id,
            "group_key": group_key,
            "split": split,
            "first_version_id": version_id,
        }
        for group_key, split in sorted(new.items())
    ]
    # New groups as a rule (the domain is locked, and these are the groups no build placed):
    # one COPY, which falls back to skipping conflicts if one was placed after all.
    insert_new_rows(session, DatasetGroup.__table__, rows)  # type: ignore[arg-type]
