"""A domain's eval index kept between processes, in parts (`EvalIndexPart`).

Each part holds the eval items it covers and their distinct n-gram hashes and signatures, as
`EvalIndex` holds them; the parts of a domain cover disjoint items, and their union is the
index of all of them (`EvalIndex.of_hashes`). A build reads the parts instead of every eval
item's sketch, and writes a part for the eval items it added; the newest part records the
hash of everything the parts cover, so a build whose eval set is the kept one reads no item
list at all. A part made by other rules, or covering an item the eval set no longer holds (it
was retracted), makes the build index from the sketches and keep that index as one part; so
does a ninth part, which keeps reads to a few rows.

    kept = Kept.read(session, domain_id, rules_of(config))
    kept.covers(key)                        # the parts are the index of this eval set
    kept.items(session) <= items            # they cover part of it (`item_key`s)
    index = kept.index(session, config)
    kept.add(session, key, added_items, added_index)
    kept.replace(session, key, items, index)

Forgetting deletes a tenant's parts (`purge`): a part holds hashes of its items' text.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from flywheel.datasets.items import KINDS
from flywheel.datasets.models import SKETCHER, EvalIndexPart
from flywheel.db import psycopg_connection, utcnow
from flywheel.tenancy.models import Domain

if TYPE_CHECKING:  # numpy: `purge` serves forgetting, which builds nothing
    from flywheel.datasets.decontamination import DecontaminationConfig, EvalIndex

MAX_PARTS = 8
"""Parts of a domain before a build keeps its index as one part again."""
_KIND_NUMBERS = {kind.name: number for number, kind in enumerate(KINDS)}
_ITEM_BYTES = 17


def item_key(kind: str, item_id: uuid.UUID) -> bytes:
    """An item as a part lists it: its kind's number, then its id (17 bytes)."""
    return bytes([_KIND_NUMBERS[kind]]) + item_id.bytes


def rules_of(config: DecontaminationConfig) -> str:
    """What a part was made by: the sketch rules and the decontamination settings."""
    return f"sketcher {SKETCHER}: {config!r}"


@dataclass(frozen=True)
class _Part:
    id: uuid.UUID
    covers: str
    rules: str


@dataclass
class Kept:
    """The parts of a domain's kept index, in order (their bytes are read when needed)."""

    domain_id: uuid.UUID
    rules: str
    parts: list[_Part]

    @classmethod
    def read(cls, session: Session, domain_id: uuid.UUID, rules: str) -> Kept:
        """The domain's parts, for a build by these rules."""
        rows = session.execute(
            select(EvalIndexPart.id, EvalIndexPart.covers, EvalIndexPart.rules)
            .where(EvalIndexPart.domain_id == domain_id)
            .order_by(EvalIndexPart.number)
        )
        return cls(domain_id, rules, [_Part(*row) for row in rows])

    @property
    def is_usable(self) -> bool:
        """Whether there are parts, all made by these rules."""
        return bool(self.parts) and all(part.rules == self.rules for part in self.parts)

    @property
    def is_full(self) -> bool:
        """Whether the next build keeps its index as one part again (`MAX_PARTS`)."""
        return len(self.parts) >= MAX_PARTS

    def covers(self, key: str) -> bool:
        """Whether the parts are the index of the eval set with this key (`_index_key`)."""
        return self.is_usable and self.parts[-1].covers == key

    def items(self, session: Session) -> frozenset[bytes]:
        """The items the parts cover, each as `item_key` gives it."""
        blobs = self._read(session, "items")
        return frozenset(
            blob[start : start + _ITEM_BYTES]
            for (blob,) in blobs
            for start in range(0, len(blob), _ITEM_BYTES)
        )

    def index(self, session: Session, config: DecontaminationConfig) -> EvalIndex:
        """The index of the items the parts cover."""
        from flywheel.datasets.decontamination import EvalIndex

        return EvalIndex.of_hashes(self._read(session, "grams, signatures, item_count"), config)

    def _read(self, session: Session, columns: str) -> list[Any]:
        """These columns of the parts, in order; bytes read as bytes on PostgreSQL (hex text,
        the default, took 1.3 s for the 76 MB of 100k eval items' hashes)."""
        ids = [part.id for part in self.parts]
        query = f"SELECT {columns} FROM eval_index_parts WHERE id = ANY(%s) ORDER BY number"
        if session.get_bind().dialect.name == "postgresql":
            with psycopg_connection(session).cursor(binary=True) as cursor:
                return cursor.execute(query, [ids]).fetchall()
        rows = session.execute(
            select(*(getattr(EvalIndexPart, name.strip()) for name in columns.split(",")))
            .where(EvalIndexPart.id.in_(ids))
            .order_by(EvalIndexPart.number)
        )
        return [tuple(row) for row in rows]

    def add(self, session: Session, key: str, items: frozenset[bytes], index: EvalIndex) -> None:
        """Keep a part for these items (none of them covered yet): their index, after which
        the parts cover the eval set with this key."""
        self._write(session, len(self.parts), key, items, index)

    def replace(
        self, session: Session, key: str, items: frozenset[bytes], index: EvalIndex
    ) -> None:
        """Keep this index of these items (the eval set with this key) as the only part."""
        session.execute(delete(EvalIndexPart).where(EvalIndexPart.domain_id == self.domain_id))
        self.parts = []
        self._write(session, 0, key, items, index)

    def _write(
        self,
        session: Session,
        number: int,
        key: str,
        items: frozenset[bytes],
        index: EvalIndex,
    ) -> None:
        grams, signatures = index.hashes()
        part_id = uuid.uuid4()
        session.execute(  # Core: the session need not hold the bytes as an object
            insert(EvalIndexPart).values(
                id=part_id,
                created_at=utcnow(),
                domain_id=self.domain_id,
                rules=self.rules,
                number=number,
                covers=key,
                item_count=len(items),
                items=b"".join(sorted(items)),
                grams=grams,
                signatures=signatures,
            )
        )
        self.parts.append(_Part(part_id, key, self.rules))


def purge(session: Session, tenant_id: uuid.UUID) -> None:
    """Delete the kept eval indexes of the tenant's domains (forgetting: they hold hashes of
    their items' text). An index a process keeps in memory covers the forgotten item too, so
    no build uses it again (its items are never a subset of a later eval set)."""
    domains = select(Domain.id).where(Domain.tenant_id == tenant_id)
    session.execute(delete(EvalIndexPart).where(EvalIndexPart.domain_id.in_(domains)))
