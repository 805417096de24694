"""Support tickets from vendor exports (Zendesk, Jira, GitHub issues, a mapped CSV) into
signal: resolved threads become SFT examples, reopened-then-resolved ones preference pairs,
ratings, reopens and escalations feedback on the answers they judged.

Each vendor module documents the export shape it accepts and what "resolved", "reopened"
and "escalated" mean there; `thread.py` is the shared model they read into, `convert.py` the
rules that turn it into candidates, `text.py` the cleaning of bodies (HTML, quoted replies,
signatures), `files.py` the streaming, encodings and errors.
"""

from __future__ import annotations

from pathlib import Path

from flywheel.errors import InvalidInput
from ingest.framework import Ingestor
from ingest.tickets.csv_mapping import CsvIngestor, parse_mapping
from ingest.tickets.export import TicketExport
from ingest.tickets.github import GithubIngestor
from ingest.tickets.jira import JiraIngestor
from ingest.tickets.zendesk import ZendeskIngestor

INGESTORS: dict[str, type[TicketExport]] = {
    "zendesk": ZendeskIngestor,
    "jira": JiraIngestor,
    "github": GithubIngestor,
    "csv": CsvIngestor,
}
TICKET_FORMATS = tuple(INGESTORS)

__all__ = ["INGESTORS", "TICKET_FORMATS", "make_ticket_ingestor", "parse_mapping"]


def make_ticket_ingestor(source_format: str, path: Path, mapping: str | None = None) -> Ingestor:
    """The ingestor for an export; InvalidInput for an unknown format, a mapping given to a
    format that takes none, or a malformed mapping."""
    if source_format not in INGESTORS:
        raise InvalidInput(
            f"unknown ticket format {source_format!r}; known: {', '.join(TICKET_FORMATS)}"
        )
    if source_format == "csv":
        return CsvIngestor(path, mapping)
    if mapping is not None:
        raise InvalidInput(f"a column mapping is for the csv format only, not {source_format}")
    return INGESTORS[source_format](path)
