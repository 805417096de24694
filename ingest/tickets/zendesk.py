"""Zendesk Support exports.

Accepted shape, as paging `GET /api/v2/tickets.json` and fetching each ticket's
`/tickets/{id}/comments.json?include=users` (and, for reopen and escalation history,
`/tickets/{id}/audits.json`) produces:

    {"tickets": [{"id": 4711, "subject": ..., "status": "solved", "requester_id": ...,
                  "assignee_id": ..., "tags": [...], "satisfaction_rating": {"score": "good"},
                  "via": {"source": {"from": {"name": ...}}},
                  "comments": [{"id", "author_id", "public", "html_body"|"plain_body"|"body",
                                "created_at", "attachments": [...]}, ...],
                  "users": [{"id", "name", "role": "end-user"|"agent"|"admin"}, ...],
                  "audits": [{"created_at", "events": [{"type": "Change",
                              "field_name": "status"|"tags", "value", "previous_value"}]}]}]}

Also accepted, as Zendesk's tools write them:

- users and organizations side-loaded beside the tickets (`?include=users,organizations`:
  `{"tickets": [...], "users": [...], "organizations": [...], "next_page": ...}`), read
  before the tickets wherever they sit in the file;
- a ticket's `comments` (or `audits`) embedded as the endpoint returned them,
  `{"comments": [...], "users": [...]}`; a ticket with no `comments` at all reads its
  comments from its audits' `Comment` events (`/tickets/{id}/audits.json`);
- the incremental export (`/api/v2/incremental/tickets.json`, time- or cursor-based): its
  pages (`tickets`, side-loads, `end_time`, `next_page`/`after_url`, `end_of_stream`) saved
  one after another or one per line. A ticket updated during the export comes again in a
  later page: only its last copy is read, the others are rejected `superseded`. Incremental tickets
  carry no comments: embed them, or they are rejected `comments_not_exported`;
- the ticket objects one per line (`.jsonl`).

Rules:

- Resolved: status `solved` or `closed`.
- The first comment is the request (Zendesk's description), the customer's even when an
  agent typed it in for a phone call. After it, a comment's side comes from its author's
  role (embedded or side-loaded `users`: end-user is the customer's side; agent, admin the
  agent's); without one, the requester is the customer and the assignee the agent (only
  agents can be assigned). A resolved ticket with a public reply by anyone else is
  rejected `unknown_roles`: their side is never guessed. Private comments (internal
  notes) are left out; attachments are metadata only and add no text.
- Resolutions, reopens: audit `Change` events on `status` (into solved/closed resolves, out
  of them reopens). `metric_set.reopens` only counts reopens and cannot say which answer was
  reopened, so it is not read: without audits a ticket has one resolution.
- Escalated: a tag containing "escalat"; its audit `Change` on `tags` says when.
- Satisfaction: `satisfaction_rating.score` good -> thumbs up, bad -> thumbs down
  (offered/unoffered are no rating).
- Tags for the evaluation's slices: `priority` and `type` (`ticket.priority:high`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from ingest.framework import Rejected
from ingest.tickets.export import Sideloads, TicketExport
from ingest.tickets.fields import Fields
from ingest.tickets.text import body_text
from ingest.tickets.thread import (
    Change,
    ChangeKind,
    Entry,
    Post,
    Rating,
    Role,
    Thread,
    ticket_tags,
    unique_names,
)

RESOLVED_STATUSES = frozenset({"solved", "closed"})
SCORES = {"good": "up", "bad": "down"}
_ROLES: dict[str, Role] = {"end-user": "customer", "agent": "agent", "admin": "agent"}
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class ZendeskIngestor(TicketExport):
    source_format = "zendesk"
    sideload_fields: ClassVar[dict[str, tuple[str, ...]]] = {
        "users": ("id", "name", "role"),
        "organizations": ("id", "name"),
    }

    def read_thread(self, record: Fields) -> Thread:
        return read_ticket(record, self.sideloads)


def read_ticket(ticket: Fields, sideloads: Sideloads | None = None) -> Thread:
    """The ticket's thread; Rejected `comments_not_exported` for a ticket exported without
    its comments, `unknown_roles` for a resolved one with a reply by someone the export
    does not place on a side."""
    loaded = sideloads or {}
    people = _People(ticket, loaded.get("users", {}))
    comments = _ticket_comments(ticket)
    if comments is None:
        raise Rejected(
            "comments_not_exported",
            f"zendesk:{ticket.ident('id')} has no comments (embed each ticket's comments.json "
            "or audits.json)",
        )
    posts = _comments(comments, people)
    timed = [*posts, *_changes(_audits(ticket))]
    timed.sort(key=lambda item: (item[0], isinstance(item[1], Change)))
    is_resolved = ticket.text("status") in RESOLVED_STATUSES
    if is_resolved and people.unplaced:
        raise Rejected(
            "unknown_roles",
            f"zendesk:{ticket.ident('id')}: no role known for user "
            f"{', '.join(dict.fromkeys(people.unplaced))} (export the users with the tickets: "
            "include=users)",
        )
    rating = ticket.obj("satisfaction_rating")
    score = SCORES.get(rating.text("score")) if rating else None
    return Thread(
        source_format="zendesk",
        ticket_id=ticket.ident("id"),
        subject=ticket.text("subject") or ticket.text("raw_subject"),
        timeline=tuple(entry for _, entry in timed),
        is_resolved=is_resolved,
        is_escalated=any("escalat" in tag.casefold() for tag in ticket.strings("tags")),
        rating=Rating({"thumbs": score}) if score else None,
        names=unique_names(
            _sender_name(ticket),
            *people.names(comments),
            _organization_name(ticket, loaded.get("organizations", {})),
        ),
        tags=ticket_tags(priority=ticket.text("priority"), type=ticket.text("type")),
    )


def _embedded(ticket: Fields, key: str) -> tuple[list[Fields], list[Fields]]:
    """A list the ticket embeds (`comments`, `audits`) and the users that came with it: the
    list itself, or the endpoint's response as it came ({"comments": [...], "users": [...]})."""
    response = ticket.obj(key) if isinstance(ticket.raw(key), dict) else None
    if response is not None:
        return response.objects(key), response.objects("users")
    return ticket.objects(key), []


def _audits(ticket: Fields) -> list[Fields]:
    return _embedded(ticket, "audits")[0]


def _ticket_comments(ticket: Fields) -> list[_Comment] | None:
    """The ticket's comments, from `comments` or else from its audits' Comment events; None
    when the export has neither."""
    if ticket.raw("comments") is not None:
        return [_Comment(c, c.time("created_at")) for c in _embedded(ticket, "comments")[0]]
    comments = [
        _Comment(event, audit.time("created_at"), audit.optional_ident("author_id"))
        for audit in _audits(ticket)
        for event in audit.objects("events")
        if event.text("type") == "Comment"
    ]
    return comments or None


class _Comment:
    __slots__ = ("author", "fields", "when")

    def __init__(self, fields: Fields, when: datetime | None, author: str | None = None) -> None:
        self.fields, self.when = fields, when or _NO_TIME
        self.author = fields.optional_ident("author_id") or author


class _People:
    """Who is on which side: a user's role (embedded with the ticket, or side-loaded beside
    the tickets); without one, the requester is the customer and the assignee the agent
    (only agents can be assigned). Anyone else is `unplaced`: their side is not guessed."""

    def __init__(self, ticket: Fields, loaded: dict[str, Fields]) -> None:
        own = [user for key in ("comments", "audits") for user in _embedded(ticket, key)[1]]
        own = [*ticket.objects("users"), *own]
        self.own = {user.ident("id"): user for user in own}
        self.loaded = loaded
        self.requester = ticket.optional_ident("requester_id")
        self.assignee = ticket.optional_ident("assignee_id")
        self.ids = [self.requester, ticket.optional_ident("submitter_id"), self.assignee]
        self.unplaced: list[str] = []

    def user(self, ident: str | None) -> Fields | None:
        return self.own.get(ident or "") or self.loaded.get(ident or "")

    def role(self, author: str | None) -> Role:
        user = self.user(author)
        if user is not None and user.text("role") in _ROLES:
            return _ROLES[user.text("role")]
        if author is not None and author == self.requester:
            return "customer"
        if author is not None and author == self.assignee:
            return "agent"
        self.unplaced.append(author or "(none)")
        return "other"

    def names(self, comments: list[_Comment]) -> list[str]:
        """Names of the ticket's own users, then of the side-loaded ones it refers to."""
        ids = [*self.ids, *(comment.author for comment in comments)]
        loaded = [self.loaded[i] for i in dict.fromkeys(ids) if i and i in self.loaded]
        users = [*self.own.values(), *(user for user in loaded if user not in self.own.values())]
        return [user.text("name") for user in users]


def _comments(comments: list[_Comment], people: _People) -> list[tuple[datetime, Entry]]:
    posts: list[tuple[datetime, Entry]] = []
    for index, comment in enumerate(comments):
        if not comment.fields.flag("public", default=True):
            continue
        role = "customer" if index == 0 else people.role(comment.author)
        ref = comment.fields.optional_ident("id") or str(index)
        posts.append((comment.when, Post(ref, role, _comment_text(comment.fields))))
    return posts


def _organization_name(ticket: Fields, loaded: dict[str, Fields]) -> str:
    """The requester's organization (embedded or side-loaded): a name to redact too."""
    ident = ticket.optional_ident("organization_id") or ""
    own = {org.ident("id"): org for org in ticket.objects("organizations")}
    organization = own.get(ident) or loaded.get(ident)
    return organization.text("name") if organization is not None else ""


def _comment_text(comment: Fields) -> str:
    if html := comment.text("html_body"):
        return body_text(html, is_html=True)
    return body_text(comment.text("plain_body") or comment.text("body"), is_html=False)


def _changes(audits: list[Fields]) -> list[tuple[datetime, Entry]]:
    changes: list[tuple[datetime, Entry]] = []
    for audit in audits:
        when = audit.time("created_at") or _NO_TIME
        for event in audit.objects("events"):
            kind = _change_kind(event) if event.text("type") == "Change" else None
            if kind is not None:
                changes.append((when, Change(kind)))
    return changes


def _change_kind(event: Fields) -> ChangeKind | None:
    field, value, previous = (
        event.text("field_name"),
        event.raw("value"),
        event.raw("previous_value"),
    )
    if field == "status" and isinstance(value, str) and isinstance(previous, str | None):
        was_resolved, is_resolved = previous in RESOLVED_STATUSES, value in RESOLVED_STATUSES
        if was_resolved != is_resolved:
            return "resolved" if is_resolved else "reopened"
    if field == "tags" and _has_escalation(value) and not _has_escalation(previous):
        return "escalated"
    return None


def _has_escalation(tags: object) -> bool:
    """Audit tag values come as a list of tags or one space-separated string."""
    items = tags.split() if isinstance(tags, str) else tags if isinstance(tags, list) else []
    return any(isinstance(tag, str) and "escalat" in tag.casefold() for tag in items)


def _sender_name(ticket: Fields) -> str:
    """The name on the email a ticket came from (via.source.from.name)."""
    via = ticket.obj("via")
    source = via.obj("source") if via else None
    sender = source.obj("from") if source else None
    return sender.text("name") if sender else ""
