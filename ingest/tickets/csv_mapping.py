"""Tickets from a CSV (or tab-separated) export of any helpdesk, one row per ticket, read
through a column mapping given on the command line:

    --mapping "id=Ticket ID,subject=Subject,body=Description,resolution=Resolution,
               status=Status,requester=Requester,satisfaction=CSAT,reopened=Reopened"

`field=Column` pairs, comma-separated; column names are matched exactly (spaces inside them
are fine, around them ignored). Fields: id, body and resolution are required; subject,
status, requester, assignee, satisfaction, reopened, escalated, first_resolution, category,
priority, product and type are optional. Without a mapping the columns are expected to be
named after the fields.

Rules (a row has no history, so what it says is all there is):
- Resolved: status solved, closed, resolved, done, fixed or completed (any case); without a
  status column, a non-empty resolution.
- The body is the customer's problem, the resolution the accepted agent answer; HTML in
  either becomes text.
- reopened (yes/true/1/y or a reopen count above 0) together with first_resolution: the
  first answer was reopened, giving a pair and an outcome; without first_resolution a
  reopen has no answer to judge and adds nothing.
- escalated (same values): the first answer, when there is one, was overruled.
- satisfaction: good/satisfied/positive/up -> thumbs up; bad/unsatisfied/dissatisfied/
  negative/down -> thumbs down; 1-5 -> stars; empty, offered, unoffered, n/a -> none.
- category, priority, product, type: tags on every item of the ticket
  (`ticket.category:billing`), the slices its evaluation is judged by.
The delimiter is whichever of `,`, `;` and tab the header line has most of.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.errors import InvalidInput
from flywheel.signals.candidates import Candidate
from ingest.framework import SourceRecord
from ingest.tickets.convert import thread_candidates
from ingest.tickets.export import TicketExport
from ingest.tickets.files import detect_encoding, read_lines
from ingest.tickets.text import body_text, looks_like_html
from ingest.tickets.thread import (
    TAGGED_FIELDS,
    Change,
    Entry,
    Post,
    Rating,
    Thread,
    ticket_tags,
    unique_names,
)

if TYPE_CHECKING:
    from _csv import Reader

REQUIRED_FIELDS = ("id", "body", "resolution")
OPTIONAL_FIELDS = (
    "subject",
    "status",
    "requester",
    "assignee",
    "satisfaction",
    "reopened",
    "escalated",
    "first_resolution",
    *TAGGED_FIELDS,
)
RESOLVED_STATUSES = frozenset({"solved", "closed", "resolved", "done", "fixed", "completed"})
MAPPING_EXAMPLE = "id=Ticket ID,body=Description,resolution=Resolution,status=Status"
_THUMBS = {
    **dict.fromkeys(("good", "satisfied", "positive", "up", "thumbs up", "👍"), "up"),
    **dict.fromkeys(("bad", "unsatisfied", "dissatisfied", "negative", "down", "👎"), "down"),
}
_NO_RATING = frozenset({"", "offered", "unoffered", "n/a", "na", "none", "-"})
_TRUE = frozenset({"yes", "y", "true", "1", "x"})
_FALSE = frozenset({"", "no", "n", "false", "0"})


def parse_mapping(mapping: str | None) -> dict[str, str]:
    """field -> column; InvalidInput naming what is wrong with the mapping."""
    if mapping is None:
        return {field: field for field in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)}
    columns: dict[str, str] = {}
    for pair in filter(str.strip, mapping.split(",")):
        field, equals, column = (part.strip() for part in pair.partition("="))
        if not equals or not field or not column:
            raise InvalidInput(f"column mapping: {pair.strip()!r} is not field=Column")
        if field not in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS):
            known = ", ".join((*REQUIRED_FIELDS, *OPTIONAL_FIELDS))
            raise InvalidInput(f"column mapping: unknown field {field!r} (known: {known})")
        if field in columns:
            raise InvalidInput(f"column mapping: {field!r} is mapped twice")
        columns[field] = column
    missing = [field for field in REQUIRED_FIELDS if field not in columns]
    if missing:
        raise InvalidInput(
            f"column mapping: no column for {', '.join(missing)} (e.g. {MAPPING_EXAMPLE})"
        )
    return columns


class CsvIngestor(TicketExport):
    source_format = "csv"

    def __init__(self, path: Path, mapping: str | None = None) -> None:
        super().__init__(path)
        self.columns = parse_mapping(mapping)
        self.is_mapped = mapping is not None

    def records(self) -> Iterator[SourceRecord]:
        lines = (line for _, line in read_lines(self.path, detect_encoding(self.path)))
        header_line = next(lines, "")
        if not header_line.strip():
            raise InvalidInput(f"{self.path}: no header line (the file is empty)")
        delimiter = max(",;\t", key=header_line.count)
        reader = csv.reader(itertools.chain([header_line], lines), delimiter=delimiter, strict=True)
        header = [name.strip() for name in next(reader)]
        positions = self._positions(header)
        for position, (line, row) in enumerate(self._rows(reader, len(header))):
            values = {field: row[index] for field, index in positions.items()}
            ref = f"{self.path.name} ticket {values['id'].strip() or '?'} (line {line})"
            yield SourceRecord(position, ref, values)

    def _positions(self, header: list[str]) -> dict[str, int]:
        """field -> column index; optional fields left unmapped may be absent."""
        positions: dict[str, int] = {}
        for field, column in self.columns.items():
            if column in header:
                positions[field] = header.index(column)
            elif self.is_mapped or field in REQUIRED_FIELDS:
                raise InvalidInput(
                    f"{self.path}: no column {column!r} (for {field}); "
                    f"the header has: {', '.join(header)}"
                )
        return positions

    def _rows(self, reader: Reader, width: int) -> Iterator[tuple[int, list[str]]]:
        while True:
            line = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise InvalidInput(f"{self.path} line {line}: malformed CSV ({error})") from error
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != width:
                raise InvalidInput(
                    f"{self.path} line {line}: {len(row)} fields, the header has {width} "
                    "(a truncated row, or a quote left open)"
                )
            yield line, row

    def convert(self, record: SourceRecord) -> list[Candidate]:
        return thread_candidates(read_row(record.payload, record.ref))


def read_row(values: dict[str, str], ref: str) -> Thread:
    ticket_id = values["id"].strip()
    if not ticket_id:
        raise InvalidInput(f"{ref}: the id is empty")
    first = _text(values.get("first_resolution", ""))
    is_reopened = _yes(values, "reopened", ref)
    timeline: list[Entry] = [Post("body", "customer", _text(values["body"]))]
    if first:
        timeline.append(Post("first_resolution", "agent", first))
    if first and is_reopened:
        timeline += [Change("resolved"), Change("reopened")]
    timeline.append(Post("resolution", "agent", _text(values["resolution"])))
    status = values.get("status")
    if status is None:
        is_resolved = bool(values["resolution"].strip())
    else:
        is_resolved = status.strip().casefold() in RESOLVED_STATUSES
    return Thread(
        source_format="csv",
        ticket_id=ticket_id,
        subject=values.get("subject", "").strip(),
        timeline=tuple(timeline),
        is_resolved=is_resolved,
        is_escalated=_yes(values, "escalated", ref),
        rating=_rating(values.get("satisfaction", ""), ref),
        names=unique_names(values.get("requester"), values.get("assignee")),
        tags=ticket_tags(**{name: values.get(name) for name in TAGGED_FIELDS}),
    )


def _text(cell: str) -> str:
    return body_text(cell, is_html=looks_like_html(cell))


def _yes(values: dict[str, str], field: str, ref: str) -> bool:
    value = values.get(field, "").strip().casefold()
    if value in _TRUE or (value.isdigit() and int(value) > 0):
        return True
    if value in _FALSE:
        return False
    raise InvalidInput(f"{ref}: {field} {value!r} is neither yes nor no (nor a count)")


def _rating(cell: str, ref: str) -> Rating | None:
    value = cell.strip().casefold()
    if value in _NO_RATING:
        return None
    if value in _THUMBS:
        return Rating({"thumbs": _THUMBS[value]})
    if value.isdigit() and 1 <= int(value) <= 5:
        return Rating({"stars": int(value)})
    raise InvalidInput(f"{ref}: satisfaction {cell.strip()!r} is not good/bad or 1-5")
