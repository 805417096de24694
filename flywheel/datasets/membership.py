"""What a dataset version holds, stored as what changed: a member row spans versions.

A row (`DatasetMember`) runs from the version that added it (`dataset_version_id`, its first)
to `until_version` (the first of the domain's versions that no longer holds it; None: still
open). A version v of the row's domain within that span holds it when

- it is an eval row (the eval set only grows: a row ends when its item stops being eligible);
- it is a train row new there (`is_new`) and v is its first version;
- it is a train row and v's replay draw picks it (`is_drawn(str(v), content hash, v's replay
  fraction)`: afresh each version, as the build draws).

So a build writes rows for its new items and closes the rows of items that left (retracted,
contaminated by a new eval item, weight or curriculum key changed: those reopen with the new
values), instead of writing every item it holds again. A train row stays open while its item
is a replay candidate; it is checked (eligible, decontaminated, weight) by the builds that
draw it, and a build that draws it and finds it wanting closes it there. Rows written before
rows spanned versions span their own version only and keep their `position`.

    for row in held_rows(session, version, kind, "train", columns): row.weight
    held_item_ids(session, version, kind, "eval")
    prompt_keys(session, [version.id], "eval")          # the keys of what a model is scored on
    versions_holding(session, "sft_example_id", ids)    # forget: the versions to taint
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from sqlalchemy import Row, Select, and_, case, func, or_, select, true, update
from sqlalchemy.orm import Session, aliased

from flywheel.bulk import chunked
from flywheel.datasets.items import (
    KIND_OF_COLUMN,
    KINDS,
    History,
    Item,
    ItemKind,
    is_eligible,
    item_of,
    item_query,
    messages_of,
    text_columns,
)
from flywheel.datasets.manifest import ease_of, hash_lines, manifest_line
from flywheel.datasets.models import DatasetMember, DatasetVersion, ItemSketch
from flywheel.db import psycopg_connection, streamed
from flywheel.signals.content import prompt_key, task_prompt_key
from flywheel.signals.models import VerifiableTask

CHUNK_ROWS = 1_000
FIRST = aliased(DatasetVersion, name="first_version")
"""The version that added a row (the start of its span)."""


def is_drawn(salt: str, content_sha256: str, fraction: float) -> bool:
    """A deterministic sample: the same salt and fraction draw the same items (the first 8
    bytes of sha256(salt, newline, content hash), big-endian, below `draw_threshold`)."""
    digest = hashlib.sha256(f"{salt}\n{content_sha256}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < draw_threshold(fraction)


@functools.lru_cache(maxsize=64)
def draw_threshold(fraction: float) -> int:
    """The draw keeps the 8-byte keys below this: `fraction` of 2**64, exactly (a float's
    rounding would move keys at the boundary between Python and SQL)."""
    return math.ceil(Fraction(fraction) * 2**64)


def holds(
    version: DatasetVersion, split: str, first: int, is_new: bool, content_sha256: str
) -> bool:
    """Whether the version holds a row of its domain whose span covers it."""
    if split == "eval" or (is_new and first == version.version):
        return True
    return is_drawn(str(version.version), content_sha256, _replay_fraction(version))


def _replay_fraction(version: DatasetVersion) -> float:
    """The share of earlier train items the version replays (none recorded: none)."""
    return float(version.recipe.get("replay_fraction", 0.0))


def held_rows(
    session: Session, version: DatasetVersion, kind: ItemKind, split: str, columns: Iterable[Any]
) -> Iterator[Row[Any]]:
    """The `columns` of each `kind` item the version holds in `split`, then its member row's
    `weight` as the version saw it (and `held_sha256`, `position`, `ease`), in the version's
    order; streamed (a server-side cursor, plain rows). On PostgreSQL the replay draw is made
    in the query too, so only held items' columns are read."""
    model, column = kind.model, getattr(DatasetMember, kind.member_column)
    held = (
        DatasetMember.weight,
        DatasetMember.position,
        DatasetMember.ease,
        FIRST.version.label("held_first"),
        DatasetMember.is_new.label("held_is_new"),
        func.coalesce(DatasetMember.content_sha256, model.content_sha256).label("held_sha256"),
    )
    query = (
        _spanning(select(*columns, *held), version, split)
        .join(model, column == model.id)
        .order_by(DatasetMember.position, DatasetMember.ease, DatasetMember.content_sha256)
    )
    if split == "train" and session.get_bind().dialect.name == "postgresql":
        query = query.where(_drawn_or_new(version))
    rows = session.execute(query.execution_options(stream_results=True, yield_per=CHUNK_ROWS))
    for row in rows:
        if holds(version, split, row.held_first, row.held_is_new, row.held_sha256):
            yield row


def _drawn_or_new(version: DatasetVersion) -> Any:
    """`holds` for train rows in SQL (PostgreSQL): new in this version, or drawn by it (from
    the member row alone: the items are read for the rows it holds only)."""
    is_new_here = and_(DatasetMember.is_new, FIRST.version == version.version)
    draw = sql_draw(str(version.version), DatasetMember.content_sha256, _replay_fraction(version))
    return or_(is_new_here, draw)


def sql_draw(salt: str, content_sha256: Any, fraction: float) -> Any:
    """`is_drawn` as a PostgreSQL expression over a content-hash column."""
    threshold = draw_threshold(fraction)
    if threshold >= 2**64:
        return true()
    key = func.substring(func.sha256(func.convert_to(f"{salt}\n" + content_sha256, "UTF8")), 1, 8)
    return key < threshold.to_bytes(8, "big")


def held_item_ids(
    session: Session, version: DatasetVersion, kind: ItemKind, split: str
) -> Iterator[uuid.UUID]:
    """The ids of the `kind` items the version holds in `split` (in its order)."""
    for row in held_rows(session, version, kind, split, (kind.model.id,)):
        yield row.id


def prompt_keys(session: Session, version_ids: Iterable[uuid.UUID], split: str) -> set[str]:
    """The prompt keys (flywheel.datasets.items) of every item these versions hold in `split`
    (of any domain: a mixed-in item is keyed like the domain's own)."""
    keys: set[str] = set()
    for version_id in set(version_ids):
        version = session.get_one(DatasetVersion, version_id)
        for kind in KINDS:
            held = sorted(set(held_item_ids(session, version, kind, split)))
            prompt_column = text_columns(kind.model)[0]
            for chunk in chunked(held):
                rows = session.execute(select(prompt_column).where(kind.model.id.in_(chunk)))
                if kind.model is VerifiableTask:
                    keys.update(task_prompt_key(str(prompt)) for (prompt,) in rows)
                else:
                    keys.update(prompt_key(messages_of(messages)) for (messages,) in rows)
    return keys


def versions_holding(
    session: Session, member_column: str, item_ids: list[uuid.UUID]
) -> set[uuid.UUID]:
    """The dataset versions that hold any of these items (of the kind `member_column` names),
    in any split and in any domain (a mixed-in item is held by the versions that mixed it)."""
    kind = KIND_OF_COLUMN[member_column]
    column = getattr(DatasetMember, member_column)
    spans: list[tuple[Any, ...]] = []
    for chunk in chunked(item_ids):
        spans += session.execute(
            select(
                FIRST.domain_id,
                DatasetMember.split,
                FIRST.version,
                DatasetMember.until_version,
                DatasetMember.is_new,
                kind.model.content_sha256,
            )
            .join(FIRST, FIRST.id == DatasetMember.dataset_version_id)
            .join(kind.model, kind.model.id == column)
            .where(column.in_(chunk))
        ).all()
    versions: dict[uuid.UUID, list[DatasetVersion]] = {}
    for domain_id in {span[0] for span in spans}:
        versions[domain_id] = list(
            session.scalars(select(DatasetVersion).where(DatasetVersion.domain_id == domain_id))
        )
    return {
        version.id
        for domain_id, split, first, until, is_new, sha256 in spans
        for version in versions[domain_id]
        if first <= version.version
        and (until is None or version.version < until)
        and holds(version, split, first, is_new, sha256)
    }


@dataclass(frozen=True)
class Held:
    """One item a version holds, as the version saw it."""

    split: str
    kind: str
    item_id: uuid.UUID
    group_key: str
    content_sha256: str
    weight: float


def version_members(session: Session, version: DatasetVersion) -> list[Held]:
    """Every item the version holds: train then eval, each in the version's order (the
    manifest's: by curriculum key, kind, content hash)."""
    held: list[Held] = []
    for split in ("train", "eval"):
        keyed: list[tuple[tuple[Any, ...], Held]] = []
        for kind in KINDS:
            model = kind.model
            for row in held_rows(session, version, kind, split, (model.id, model.group_key)):
                sha256, weight = row.held_sha256, float(row.weight)
                order = (row.position or 0, row.ease, kind.name, sha256)
                item = Held(split, kind.name, row.id, row.group_key, sha256, weight)
                keyed.append((order, item))
        held += [item for _, item in sorted(keyed, key=lambda pair: pair[0])]
    return held


def stored_manifest(session: Session, version: DatasetVersion) -> str:
    """The manifest hash (flywheel.datasets.manifest) of what the version's rows hold: its
    `manifest_sha256` while they hold what its build chose."""
    lines = [json.dumps(version.recipe, sort_keys=True)]
    members = version_members(session, version)
    for split in ("eval", "train"):
        lines += [
            manifest_line(split, held.kind, held.content_sha256, held.weight)
            for held in members
            if held.split == split
        ]
    return hash_lines(lines)


OpenRow = tuple[uuid.UUID, str, float | None, float]
"""An open row of a domain: its id, split, weight and ease (keyed by its item's id)."""
Sketch = tuple[bytes, bytes]
"""An item's stored n-gram hashes and signature (flywheel.datasets.sketches)."""


@dataclass
class DomainRows:
    """A domain's member rows as a build needs them: what earlier versions held (`history`)
    and the open rows, by item id (ids are unique across the item tables). Read whole
    (`load`), or for an incremental build only the rows that may change (`load_changing`):
    then `untouched` counts the open rows left out, which the version keeps as they are."""

    history: History
    open: dict[uuid.UUID, OpenRow]
    untouched: int = 0
    sketches: dict[uuid.UUID, Sketch] = field(default_factory=dict)
    """Stored sketches read with the rows (`load_changing`: those of the train rows the
    version draws), so that decontamination does not look them up again."""
    drawn: set[uuid.UUID] = field(default_factory=set)
    """The items of open train rows the version's replay draw picked as the rows were read
    (`load_changing`: every eligible train row it reads), which the build need not draw again
    (224k sha256 draws at 1M items)."""

    @classmethod
    def load(cls, session: Session, domain_id: uuid.UUID) -> DomainRows:
        history = History(set(), set())
        open_rows: dict[uuid.UUID, OpenRow] = {}
        for kind in KINDS:
            column = getattr(DatasetMember, kind.member_column)
            query = select(
                column,
                DatasetMember.split,
                DatasetMember.until_version,
                DatasetMember.id,
                DatasetMember.weight,
                DatasetMember.ease,
            ).where(column.is_not(None))
            for item_id, split, until, row_id, weight, ease in streamed(
                session, _of_domain(query, domain_id)
            ):
                history.add(kind.name, item_id, split)
                if until is None:
                    open_rows[item_id] = (row_id, split, weight, ease)
        return cls(history, open_rows)

    @classmethod
    def load_changing(
        cls, session: Session, domain_id: uuid.UUID, number: int, fraction: float, ngram: int
    ) -> tuple[list[Item], DomainRows]:
        """What an incremental build of version `number` (replaying `fraction`) looks at,
        instead of every item and row of the domain: the eligible items without an open row
        (new, or back after they left), and the open rows the version may not keep as they
        are (eval rows, the train rows its draw picks, rows whose item is no longer eligible),
        with their eligible items. The other open rows are train rows the version does not
        draw, of eligible items: the full build keeps them unchecked too. Its `history`
        covers these items only; an item with an open train row was never evaluated (its
        group is a train group, and a group's split never changes)."""
        history = History(set(), set())
        open_rows: dict[uuid.UUID, OpenRow] = {}
        sketches: dict[uuid.UUID, Sketch] = {}
        drawn: set[uuid.UUID] = set()
        items: list[Item] = []
        for kind in KINDS:
            for item, is_eligible_now, open_row, sketch in _changing_rows(
                session, kind, domain_id, number, fraction, ngram
            ):
                open_rows[item.id] = open_row
                history.add(kind.name, item.id, open_row[1])
                if is_eligible_now:
                    items.append(item)
                    if open_row[1] == "train":
                        drawn.add(item.id)
                if sketch is not None:
                    sketches[item.id] = sketch
            loose = _without_open_row(session, kind, domain_id, ngram)
            for split, item_id in _rows_of(session, kind, domain_id, [item.id for item in loose]):
                history.add(kind.name, item_id, split)
            items += loose
        untouched = _open_count(session, domain_id) - len(open_rows)
        return items, cls(history, open_rows, untouched, sketches, drawn)


def changing_queries(
    session: Session, domain_id: uuid.UUID, number: int, fraction: float, n: int
) -> list[Select[Any]]:
    """Every query an incremental build of version `number` reads its items and rows with
    (`DomainRows.load_changing`, less two small ones: the count of open rows, the history of
    returning items): its floor, timed by `python -m bench.dataset_build`."""
    queries: list[Select[Any]] = []
    for kind in KINDS:
        queries += _changing_queries(session, kind, domain_id, number, fraction, n)
        queries.append(_without_open_row_query(kind, domain_id, n))
    return queries


def _changing_queries(
    session: Session, kind: ItemKind, domain_id: uuid.UUID, number: int, fraction: float, n: int
) -> list[Select[Any]]:
    """`_changing_rows`' queries: on PostgreSQL the draw is made in the query (held rows, then
    the few rows whose item left: each query filters rows before it joins what the other
    needs), elsewhere one over every open row."""
    column = getattr(DatasetMember, kind.member_column)
    is_train = DatasetMember.split == "train"
    query = (
        item_query(kind, n)
        .add_columns(
            is_eligible(kind.model),
            DatasetMember.id,
            DatasetMember.split,
            DatasetMember.weight,
            DatasetMember.ease,
            case((is_train, ItemSketch.grams)),
            case((is_train, ItemSketch.signature)),
        )
        .join(DatasetMember, column == kind.model.id)
    )
    query = _of_domain(query, domain_id, open_only=True)
    if session.get_bind().dialect.name != "postgresql":
        return [query]
    sha256 = func.coalesce(DatasetMember.content_sha256, kind.model.content_sha256)
    drawn = sql_draw(str(number), sha256, fraction)
    return [
        query.where(or_(DatasetMember.split == "eval", drawn)),
        query.where(~is_eligible(kind.model)),
    ]


def _changing_rows(
    session: Session, kind: ItemKind, domain_id: uuid.UUID, number: int, fraction: float, n: int
) -> Iterator[tuple[Item, bool, OpenRow, Sketch | None]]:
    """The domain's open rows of `kind` items that version `number` may not keep as they are
    (eval, drawn, or of an item no longer eligible): each row's item, whether it is eligible,
    the row, and for a train row the item's stored sketch by the current rules (None without
    one), which the query joins anyway (a second lookup by id took 3.9 s for the 227k drawn
    rows of 1M items). The draw is made in SQL on PostgreSQL, elsewhere here."""
    is_postgres = session.get_bind().dialect.name == "postgresql"
    queries = _changing_queries(session, kind, domain_id, number, fraction, n)
    read: set[uuid.UUID] = set()
    for query in queries:
        for row in streamed(session, query):
            *_, is_eligible_now, row_id, split, weight, ease, grams, signature = row
            if row_id in read:
                continue  # an eval or drawn row of an item that left: read by both queries
            item = item_of(kind, row)
            undrawn = split == "train" and is_eligible_now and not is_postgres
            if undrawn and not is_drawn(str(number), item.content_sha256, fraction):
                continue
            read.add(row_id)
            sketch = None if grams is None else (bytes(grams), bytes(signature))
            yield item, is_eligible_now, (row_id, split, weight, ease), sketch


def _without_open_row(
    session: Session, kind: ItemKind, domain_id: uuid.UUID, ngram: int
) -> list[Item]:
    """The domain's eligible `kind` items that no open row of the domain holds."""
    query = _without_open_row_query(kind, domain_id, ngram)
    return [item_of(kind, row) for row in session.connection().execute(query)]


def _without_open_row_query(kind: ItemKind, domain_id: uuid.UUID, ngram: int) -> Select[Any]:
    column = getattr(DatasetMember, kind.member_column)
    open_rows = select(DatasetMember.id).where(column == kind.model.id)
    has_open_row = _of_domain(open_rows, domain_id, open_only=True).exists()
    return item_query(kind, ngram).where(
        kind.model.domain_id == domain_id, is_eligible(kind.model), ~has_open_row
    )


def _rows_of(
    session: Session, kind: ItemKind, domain_id: uuid.UUID, item_ids: list[uuid.UUID]
) -> Iterator[tuple[str, uuid.UUID]]:
    """(split, item id) of every row, open or closed, of the domain holding these items."""
    column = getattr(DatasetMember, kind.member_column)
    for chunk in chunked(item_ids):
        query = select(DatasetMember.split, column).where(column.in_(chunk))
        yield from session.connection().execute(_of_domain(query, domain_id))


def _open_count(session: Session, domain_id: uuid.UUID) -> int:
    """How many of the domain's rows are open."""
    query = select(func.count()).select_from(DatasetMember)
    return session.scalar(_of_domain(query, domain_id, open_only=True)) or 0


def _of_domain(query: Select[Any], domain_id: uuid.UUID, *, open_only: bool = False) -> Select[Any]:
    """The query over the member rows of the domain's versions (`open_only`: still open)."""
    query = query.join(FIRST, FIRST.id == DatasetMember.dataset_version_id).where(
        FIRST.domain_id == domain_id
    )
    return query.where(DatasetMember.until_version.is_(None)) if open_only else query


@dataclass(frozen=True)
class Wanted:
    """What the new version holds: its eval and train items in order, and the replay
    candidates it did not draw (kept open, unchecked, for the builds that draw them)."""

    evaluation: list[Item]
    train: list[Item]
    undrawn: list[Item]
    curriculum: str


def write_changes(
    session: Session, version: DatasetVersion, wanted: Wanted, rows: DomainRows
) -> dict[str, int]:
    """Store the version as what changed since the domain's open rows: close those it does not
    hold as they are, add rows for the rest. The counts of rows kept, closed and added."""
    wants: dict[uuid.UUID, tuple[str, float | None, float, Item]] = {}
    for item in wanted.evaluation:
        wants[item.id] = ("eval", item.weight, 0.0, item)
    for item in wanted.train:
        wants[item.id] = ("train", item.weight, ease_of(item, wanted.curriculum), item)
    pool = {item.id: item for item in wanted.undrawn}
    closed: list[uuid.UUID] = []
    for item_id, (row_id, split, weight, ease) in rows.open.items():
        want = wants.get(item_id)
        if want is not None and want[:3] == (split, weight, ease):
            del wants[item_id]
        elif want is not None or split != "train" or pool.pop(item_id, None) is None:
            closed.append(row_id)
        # else: a replay candidate this version did not draw: checked when one draws it
    for chunk in chunked(closed):
        session.execute(
            update(DatasetMember)
            .where(DatasetMember.id.in_(chunk))
            .values(until_version=version.version)
        )
    seen = rows.history.seen
    added = [
        (split, weight, ease, split == "eval" or (item.kind, item.id) not in seen, item)
        for split, weight, ease, item in wants.values()
    ]
    added += [
        ("train", item.weight, ease_of(item, wanted.curriculum), False, item)
        for item in pool.values()
    ]
    _insert_rows(session, version.id, added)
    kept = len(rows.open) + rows.untouched - len(closed)
    return {"kept": kept, "closed": len(closed), "added": len(added)}


def _spanning(query: Select[Any], version: DatasetVersion, split: str) -> Select[Any]:
    """The query over the rows of the version's domain whose span covers it, in `split`."""
    return (
        query.select_from(DatasetMember)
        .join(FIRST, FIRST.id == DatasetMember.dataset_version_id)
        .where(
            FIRST.domain_id == version.domain_id,
            FIRST.version <= version.version,
            or_(
                DatasetMember.until_version.is_(None), DatasetMember.until_version > version.version
            ),
            DatasetMember.split == split,
        )
    )


def _insert_rows(
    session: Session,
    version_id: uuid.UUID,
    added: list[tuple[str, float | None, float, bool, Item]],
) -> None:
    """The new rows (new ids: nothing to conflict with): COPY on PostgreSQL, one executemany
    on SQLite."""
    slot = {kind.name: index for index, kind in enumerate(KINDS)}
    names = ["id", "dataset_version_id", "split", "group_key", "weight", "is_new", "ease"]
    names += ["content_sha256"]
    names += [kind.member_column for kind in KINDS]

    def values() -> Iterator[list[Any]]:
        for split, weight, ease, is_new, item in added:
            refs: list[uuid.UUID | None] = [None] * len(KINDS)
            refs[slot[item.kind]] = item.id
            yield [
                *(uuid.uuid4(), version_id, split, item.group_key, weight, is_new, ease),
                *(item.content_sha256, *refs),
            ]

    if not added:
        return
    if session.get_bind().dialect.name == "postgresql":
        cursor = psycopg_connection(session).cursor()
        with cursor.copy(f"COPY dataset_members ({', '.join(names)}) FROM STDIN") as copy:
            for row in values():
                copy.write_row(row)
        return
    session.execute(
        DatasetMember.__table__.insert(),  # type: ignore[attr-defined]
        [dict(zip(names, row, strict=True)) for row in values()],
    )
