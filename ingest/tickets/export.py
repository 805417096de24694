"""What the ticket readers share: the export file, its fingerprint, streaming its records and
handing each to the vendor's reader and then to the shared conversion."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from flywheel.errors import InvalidInput
from flywheel.signals.candidates import Candidate
from ingest.framework import Rejected, SourceRecord
from ingest.jsonl import file_sha256
from ingest.tickets.convert import thread_candidates
from ingest.tickets.fields import Fields
from ingest.tickets.files import read_json_records, read_record_ids, read_sideloads
from ingest.tickets.thread import Thread

Sideloads = dict[str, dict[str, Fields]]  # kind ("users") -> id -> object


class TicketExport:
    """A JSON export holding one record per ticket (see the vendor modules for the shapes)."""

    source_kind = "ticket"
    source_format = ""
    version = "tickets/1"
    records_are_groups = True  # one record is a whole thread: re-reading it replaces it
    noun = "ticket"  # what a record is called in errors: "ticket 4711", "issue SUP-12"
    array_key = "tickets"  # the top-level key of the record array
    is_array_allowed = False  # whether the export may be a bare top-level array
    id_key = "id"  # the key every record has, and a page holding records has not
    # Objects an API side-loads beside the record array (`include=users`), and the fields of
    # each that are kept: kind -> fields, the first being the id.
    sideload_fields: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sideloads: Sideloads = {}
        self.superseded: frozenset[int] = frozenset()

    @property
    def source_ref(self) -> str:
        return str(self.path)

    def fingerprint(self) -> str:
        return file_sha256(self.path)

    def records(self) -> Iterator[SourceRecord]:
        """The records in file order. A record whose id comes again later in the file (an
        incremental export repeats a ticket updated while it ran) is superseded: only its
        last copy, the latest state, is converted."""
        if self.sideload_fields:
            self.sideloads = self._read_sideloads()
        self.superseded = self._superseded_positions()
        for position, (where, payload) in enumerate(self._read_records()):
            ref = f"{self.path.name} {self.noun} {self.name_of(payload)} ({where})"
            yield SourceRecord(position, ref, payload)

    def _read_records(self) -> Iterator[tuple[str, Any]]:
        return read_json_records(
            self.path,
            array_key=self.array_key,
            noun=self.noun,
            name_of=self.name_of,
            is_array_allowed=self.is_array_allowed,
            id_key=self.id_key,
        )

    def _superseded_positions(self) -> frozenset[int]:
        """Positions of records whose id comes again later (read up to any error, which
        the records themselves then report where it is)."""
        last: dict[object, int] = {}
        superseded: set[int] = set()
        ids = read_record_ids(
            self.path,
            array_key=self.array_key,
            id_key=self.id_key,
            is_array_allowed=self.is_array_allowed,
        )
        try:
            for position, ident in enumerate(ids):
                if ident in last:
                    superseded.add(last[ident])
                if isinstance(ident, int | str):
                    last[ident] = position
        except InvalidInput:
            pass
        return frozenset(superseded)

    def _read_sideloads(self) -> Sideloads:
        """Side-loaded objects by kind and id; a later page's copy of one wins."""
        found = read_sideloads(self.path, self.sideload_fields, array_key=self.array_key)
        sideloads: Sideloads = {}
        for kind, items in found.items():
            objects = [
                Fields(item, f"{self.path.name} {kind}[{n}]") for n, item in enumerate(items)
            ]
            id_field = self.sideload_fields[kind][0]
            sideloads[kind] = {item.ident(id_field): item for item in objects}
        return sideloads

    def convert(self, record: SourceRecord) -> list[Candidate]:
        if record.position in self.superseded:
            raise Rejected("superseded", f"{record.ref}: a later copy in the export replaces it")
        return thread_candidates(self.read_thread(Fields(record.payload, record.ref)))

    def name_of(self, payload: Any) -> str:
        """The record's own id, for errors and refs; "?" when it has none."""
        value = payload.get("id") if isinstance(payload, dict) else None
        return str(value) if isinstance(value, int | str) else "?"

    def read_thread(self, record: Fields) -> Thread:
        raise NotImplementedError
