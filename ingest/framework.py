"""What an ingestor is: records in (streamed), candidate signal out.

`ingest.runner` drives an ingestor: it skips records a crashed run already committed,
converts the rest in batches, stores each batch atomically with the run's counts and
checkpoint, and shows progress.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from flywheel.signals.candidates import Candidate


@dataclass(frozen=True)
class SourceRecord:
    """One record of a source. `position` counts records from 0 in reading order (the resume
    checkpoint is a position); `ref` is what an error or a rejection names ("line 42",
    "ticket 4711")."""

    position: int
    ref: str
    payload: Any


class Rejected(Exception):
    """A record that yields no signal, for a reason the run counts (a short slug such as
    `unresolved`, `binary_file`, `no_tests`)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Ingestor(Protocol):
    """A source reader. Constructed with its source (a path, a URL, a column mapping...)."""

    source_kind: str  # one of flywheel.signals.models.SOURCE_KINDS
    source_format: str  # "zendesk", "jira", "github", "csv", "repository", "humaneval", ...
    version: str  # stored on every row it produces: bump it when its output changes
    # True when one record is all of its group's signal (a ticket thread): reading it again
    # retracts what the group yielded before and no longer does.
    records_are_groups: bool

    @property
    def source_ref(self) -> str:
        """What was read, for people: a path or a URL."""
        ...

    def fingerprint(self) -> str:
        """sha256 hex of exactly what `records` will read (file bytes, a commit...)."""
        ...

    def records(self) -> Iterator[SourceRecord]:
        """Stream the records in a stable order, in constant memory. A malformed source
        raises flywheel.errors.InvalidInput naming the record or line."""
        ...

    def convert(self, record: SourceRecord) -> list[Candidate]:
        """The candidates one record yields; raises Rejected when it yields none."""
        ...
