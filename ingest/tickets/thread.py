"""One support thread, whatever tool it came from: the model every vendor reader produces and
`ingest.tickets.convert` turns into signal.

A thread is its subject and a timeline, in the order things happened: the posts people could
see (private notes are left out by the readers) and the status changes that matter for
signal, `resolved`, `reopened` and `escalated`. Vendors differ in how they say "solved" or
"reopened"; once in a timeline, the rules for what a resolution is and what a reopen means
are written once, in convert.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["customer", "agent", "other"]
ChangeKind = Literal["resolved", "reopened", "escalated"]


@dataclass(frozen=True)
class Post:
    """A public comment, its text already cleaned. `ref` is the source's id for it (a
    comment id), used to name the interaction it may become."""

    ref: str
    role: Role  # customer: the requester's side; agent: support staff; other: bots, bystanders
    text: str


@dataclass(frozen=True)
class Change:
    kind: ChangeKind


Entry = Post | Change


@dataclass(frozen=True)
class Rating:
    """The requester's satisfaction rating, as a RatingValue: {"thumbs": ...} or {"stars": n}."""

    value: dict[str, Any]

    @property
    def is_negative(self) -> bool:
        stars = self.value.get("stars")
        return self.value.get("thumbs") == "down" or (isinstance(stars, int) and stars <= 2)


@dataclass(frozen=True)
class Thread:
    """`source_format` and `ticket_id` make the key ("zendesk:4711") every candidate of the
    thread is grouped under. `is_resolved` is the ticket's final state, which wins over a
    timeline that ends otherwise (a history can be cut short; the status field cannot).
    `tags` are the ticket's own fields as labels (`ticket_tags`): every candidate of the
    thread carries them, and the evaluation slices by them."""

    source_format: str
    ticket_id: str
    subject: str
    timeline: tuple[Entry, ...]
    is_resolved: bool
    is_escalated: bool = False
    rating: Rating | None = None
    names: tuple[str, ...] = field(default=())
    tags: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return f"{self.source_format}:{self.ticket_id}"


def unique_names(*names: str | None) -> tuple[str, ...]:
    """Person names, each once, in order of appearance; blanks dropped."""
    seen: dict[str, None] = {}
    for name in names:
        if name and name.strip():
            seen.setdefault(name.strip(), None)
    return tuple(seen)


TAGGED_FIELDS = ("category", "priority", "product", "type")
"""Ticket fields that become tags: what a helpdesk sorts tickets by, so what a regression
would be noticed by."""


def ticket_tags(**fields: str | None) -> tuple[str, ...]:
    """`ticket.<field>:<value>` for each field given a value, lower-cased, spaces as dashes.

    >>> ticket_tags(category="Billing", priority="High", product=None)
    ('ticket.category:billing', 'ticket.priority:high')
    """
    return tuple(
        f"ticket.{name}:{'-'.join(value.split()).casefold()}"
        for name, value in fields.items()
        if value and value.strip()
    )
