"""Decontamination sketches, computed once per item and stored (`item_sketches`).

An item's sketch is what decontamination compares, so a build never normalises, hashes or
signs an item's text again once it has one:

- the sha256 of its prompt key (`flywheel.datasets.items`);
- its distinct hashed word n-grams (`flywheel.datasets.decontamination`), sorted;
- the MinHash signature of its compared text as one field (`flywheel.signals.dedup`), which is
  not the item's stored `minhash`: that one is signed over tagged fields for dedup.

Sketches live in this side table, filled for the items that lack one the first time a build
needs them, rather than at item-write time, which would put dataset code into the signal
writers: a build sketches the items it reads without one (`sketched_items`), and the first
build under new rules every item of its domains (`ensure_sketches`). They are keyed by item
and n-gram length and stamped with `SKETCHER`, the version of the rules that made them: a
change of normaliser, word hash or signature bumps it, and the next build deletes the stale
sketches and makes them again.
A signal item's compared text is never updated once written (only its weight and verifier
status are), so a sketch stays its item's; deleting the item deletes it (cascade).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
from psycopg import sql
from sqlalchemy import ColumnElement, Table, and_, delete, or_, select
from sqlalchemy.orm import Session

from flywheel.bulk import chunked
from flywheel.datasets.decontamination import batch_grams
from flywheel.datasets.items import (
    KINDS,
    Item,
    ItemKind,
    eligible_items,
    eligible_query,
    item_of,
    text_and_key,
    text_columns,
)
from flywheel.datasets.models import SKETCHER, ItemSketch
from flywheel.db import psycopg_connection, streamed, utcnow
from flywheel.errors import InvalidState
from flywheel.signals.dedup import minhash_signatures

SKETCHES: Table = ItemSketch.__table__  # type: ignore[assignment]
BATCH = 4_096
LOOKUP = 5_000  # ids per IN (...) when reading sketches back (SQLite)
ARRAY_LOOKUP = 20_000  # ids per array parameter (PostgreSQL)


def prompt_key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def sketch_texts(texts: Sequence[str], n: int) -> list[tuple[bytes, bytes]]:
    """Each text's (distinct sorted n-gram hashes as little-endian uint64, one-field MinHash
    signature): what `EvalIndex` computes from the same texts."""
    grams, owners = batch_grams(texts, n)
    order = np.lexsort((grams, owners))
    grams, owners = grams[order], owners[order]
    first = np.ones(grams.size, dtype=bool)
    first[1:] = (grams[1:] != grams[:-1]) | (owners[1:] != owners[:-1])
    grams, owners = grams[first], owners[first]
    bounds = np.searchsorted(owners, np.arange(len(texts) + 1))
    signatures = minhash_signatures([[text] for text in texts])
    return [
        (grams[bounds[i] : bounds[i + 1]].astype("<u8").tobytes(), signatures[i])
        for i in range(len(texts))
    ]


def sketches_of(
    session: Session,
    items: Iterable[Item],
    n: int,
    known: dict[uuid.UUID, tuple[bytes, bytes]] | None = None,
) -> dict[uuid.UUID, tuple[bytes, bytes]]:
    """The stored (grams, signature) of these items for n-grams of `n` words, by item id
    (those in `known`, read already, taken from there); InvalidState if one has none
    (`ensure_sketches` makes them)."""
    known = known or {}
    wanted: dict[str, list[uuid.UUID]] = {}
    found: dict[uuid.UUID, tuple[bytes, bytes]] = {}
    for item in items:
        if item.id in known:
            found[item.id] = known[item.id]
        else:
            wanted.setdefault(item.kind, []).append(item.id)
    taken = len(found)
    is_postgres = session.get_bind().dialect.name == "postgresql"
    for kind in KINDS:
        ids = wanted.get(kind.name, [])
        if is_postgres:
            found.update(_postgres_sketches(session, kind.member_column, ids, n))
            continue
        column = SKETCHES.c[kind.member_column]
        for chunk in chunked(ids, LOOKUP):
            rows = session.connection().execute(
                select(column, SKETCHES.c.grams, SKETCHES.c.signature).where(
                    column.in_(chunk), SKETCHES.c.ngram_words == n
                )
            )
            found.update((item_id, (grams, signature)) for item_id, grams, signature in rows)
    missing = sum(map(len, wanted.values())) - (len(found) - taken)
    if missing:
        raise InvalidState(f"{missing} items have no sketch: ensure_sketches makes them")
    return found


def _postgres_sketches(
    session: Session, member_column: str, ids: list[uuid.UUID], n: int
) -> Iterator[tuple[uuid.UUID, tuple[bytes, bytes]]]:
    """(item id, (grams, signature)) of these items, read on the driver's cursor with the ids
    as one array parameter: through IN (...) lists of 5,000 bound parameters and SQLAlchemy's
    rows, 90k sketches took 1.7-2.4 s; so, 1.3-1.4 s."""
    query = sql.SQL(
        "SELECT {item}, grams, signature FROM item_sketches "
        "WHERE {item} = ANY(%s) AND ngram_words = %s"
    ).format(item=sql.Identifier(member_column))
    cursor = psycopg_connection(session).cursor()
    for chunk in chunked(ids, ARRAY_LOOKUP):
        cursor.execute(query, [chunk, n])
        for item_id, grams, signature in cursor.fetchall():
            yield item_id, (grams, signature)


def ensure_sketches(session: Session, domain_ids: Iterable[uuid.UUID], n: int) -> int:
    """Sketch every item of these domains that has no sketch by the current rules for n-grams
    of `n` words; how many were made. A stale sketch (another `SKETCHER`) is replaced."""
    made = 0
    for domain_id in domain_ids:
        for kind in KINDS:
            rows = _unsketched(session, kind, n, kind.model.domain_id == domain_id)
            for batch in _batches(rows):
                _insert(session, kind, batch, n)
                made += len(batch)
    return made


def sketched_items(session: Session, domain_id: uuid.UUID, n: int) -> list[Item]:
    """The domain's eligible items (`eligible_items`), each with its prompt key: those read
    without a sketch by the current rules are sketched now (`with_sketches`)."""
    return with_sketches(session, list(eligible_items(session, domain_id, n)), n)


def read_with_sketches(
    session: Session, domain_id: uuid.UUID, n: int
) -> tuple[list[Item], dict[uuid.UUID, tuple[bytes, bytes]]]:
    """`sketched_items`, and the stored (grams, signature) of the items read with them, by
    item id (those sketched now are not among them: `sketches_of` reads those): for a build
    that compares every item. One streamed join of items and sketches; looked up by id
    afterwards, 900k train items' sketches took 20-24 s more at 1M items (11.8 s for items
    and sketches together, against 27-30 s)."""
    items: list[Item] = []
    known: dict[uuid.UUID, tuple[bytes, bytes]] = {}
    for kind in KINDS:
        query = eligible_query(kind, domain_id, n).add_columns(
            SKETCHES.c.grams, SKETCHES.c.signature
        )
        for row in streamed(session, query):
            item = item_of(kind, row)
            items.append(item)
            if item.prompt_key is not None:  # a sketch by the current rules
                known[item.id] = (row[-2], row[-1])
    return with_sketches(session, items, n), known


def with_sketches(session: Session, items: list[Item], n: int) -> list[Item]:
    """The items, each with its prompt key: those read without a sketch by the current rules
    (`eligible_items` gives them None) are sketched now, a stale sketch replaced."""
    unsketched = [item for item in items if item.prompt_key is None]
    if not unsketched:
        return items
    keys: dict[uuid.UUID, str] = {}
    for kind in KINDS:
        ids = [item.id for item in unsketched if item.kind == kind.name]
        for chunk in chunked(ids, BATCH):
            batch = list(_unsketched(session, kind, n, kind.model.id.in_(chunk)))
            _insert(session, kind, batch, n)
            keys.update((row.item_id, prompt_key_hash(row.key)) for row in batch)
    return [item if item.prompt_key else replace(item, prompt_key=keys[item.id]) for item in items]


class _Unsketched(NamedTuple):
    item_id: uuid.UUID
    text: str
    key: str
    stale_id: uuid.UUID | None  # its sketch by other rules, replaced


def _unsketched(
    session: Session, kind: ItemKind, n: int, which: ColumnElement[bool]
) -> Iterator[_Unsketched]:
    """The items of `kind` that `which` selects and that have no sketch by the current
    rules, with their texts."""
    model = kind.model
    column = SKETCHES.c[kind.member_column]
    query = (
        select(model.id, SKETCHES.c.id, *text_columns(model))
        .outerjoin(SKETCHES, and_(column == model.id, SKETCHES.c.ngram_words == n))
        .where(which, or_(SKETCHES.c.id.is_(None), SKETCHES.c.sketcher != SKETCHER))
    )
    rows = session.connection().execute(query.execution_options(yield_per=BATCH))
    for item_id, stale_id, *parts in rows:
        text, key = text_and_key(list(parts))
        yield _Unsketched(item_id, text, key, stale_id)


def _batches(rows: Iterator[_Unsketched]) -> Iterator[list[_Unsketched]]:
    batch: list[_Unsketched] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _insert(session: Session, kind: ItemKind, batch: list[_Unsketched], n: int) -> None:
    sketches = sketch_texts([row.text for row in batch], n)
    stale = [row.stale_id for row in batch if row.stale_id is not None]
    if stale:
        session.execute(delete(ItemSketch).where(ItemSketch.id.in_(stale)))
    now = utcnow()
    names = ["id", "created_at", "sketcher", "ngram_words", "prompt_key", "grams", "signature"]
    names.append(kind.member_column)
    rows: list[list[Any]] = [
        [uuid.uuid4(), now, SKETCHER, n, prompt_key_hash(key), grams, signature, item_id]
        for (item_id, _, key, _), (grams, signature) in zip(batch, sketches, strict=True)
    ]
    if session.get_bind().dialect.name == "postgresql":
        session.flush()
        cursor = psycopg_connection(session).cursor()
        with cursor.copy(f"COPY item_sketches ({', '.join(names)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    session.execute(SKETCHES.insert(), [dict(zip(names, row, strict=True)) for row in rows])
