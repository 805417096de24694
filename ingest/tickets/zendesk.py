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

or the same ticket objects one per line (`.jsonl`). Other top-level keys (`next_page`,
`count`, `users`...) are ignored. Rules:

- Resolved: status `solved` or `closed`.
- The first comment is the request (Zendesk's description), the customer's even when an
  agent typed it in for a phone call. After it, a comment's side comes from its author's
  role in the sideloaded `users` (end-user: customer; agent, admin: agent); without one,
  the requester is the customer, the assignee the agent, anyone else neither. Private
  comments (internal notes) are left out; attachments are metadata only and add no text.
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

from ingest.tickets.export import TicketExport
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

    def read_thread(self, record: Fields) -> Thread:
        return read_ticket(record)


def read_ticket(ticket: Fields) -> Thread:
    users = {user.ident("id"): user for user in ticket.objects("users")}
    timed = [*_comments(ticket, users), *_changes(ticket.objects("audits"))]
    timed.sort(key=lambda item: (item[0], isinstance(item[1], Change)))
    rating = ticket.obj("satisfaction_rating")
    score = SCORES.get(rating.text("score")) if rating else None
    return Thread(
        source_format="zendesk",
        ticket_id=ticket.ident("id"),
        subject=ticket.text("subject") or ticket.text("raw_subject"),
        timeline=tuple(entry for _, entry in timed),
        is_resolved=ticket.text("status") in RESOLVED_STATUSES,
        is_escalated=any("escalat" in tag.casefold() for tag in ticket.strings("tags")),
        rating=Rating({"thumbs": score}) if score else None,
        names=unique_names(_sender_name(ticket), *(user.text("name") for user in users.values())),
        tags=ticket_tags(priority=ticket.text("priority"), type=ticket.text("type")),
    )


def _comments(ticket: Fields, users: dict[str, Fields]) -> list[tuple[datetime, Entry]]:
    requester = ticket.optional_ident("requester_id")
    assignee = ticket.optional_ident("assignee_id")
    posts: list[tuple[datetime, Entry]] = []
    for index, comment in enumerate(ticket.objects("comments")):
        if not comment.flag("public", default=True):
            continue
        author = comment.optional_ident("author_id")
        role = "customer" if index == 0 else _role(author, users, requester, assignee)
        post = Post(comment.optional_ident("id") or str(index), role, _comment_text(comment))
        posts.append((comment.time("created_at") or _NO_TIME, post))
    return posts


def _role(
    author: str | None, users: dict[str, Fields], requester: str | None, assignee: str | None
) -> Role:
    user = users.get(author or "")
    if user is not None and user.text("role") in _ROLES:
        return _ROLES[user.text("role")]
    if author is not None and author == requester:
        return "customer"
    return "agent" if author is not None and author == assignee else "other"


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
