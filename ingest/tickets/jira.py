"""Jira (Software or Service Management) exports.

Accepted shape: the response of `GET /rest/api/2/search` or `/rest/api/3/search` with
`fields=*all&expand=changelog` (concatenate the pages' `issues`), optionally with each
request's Service Management CSAT (`GET /rest/servicedeskapi/request/{key}/feedback`)
embedded as `feedback`:

    {"issues": [{"key": "SUP-12",
                 "fields": {"summary", "description", "created", "status": {"name"},
                            "resolution": {"name"} | null, "resolutiondate",
                            "reporter": {"accountId", "displayName"}, "assignee": {...},
                            "labels": [...],
                            "comment": {"comments": [{"id", "author", "body", "created",
                                                      "jsdPublic", "visibility"}]}},
                 "changelog": {"histories": [{"created", "items": [{"field",
                               "fromString", "toString"}]}]},
                 "feedback": {"type": "csat", "rating": 4, "comment": {"body"}}}]}

or the same issue objects one per line (`.jsonl`). Bodies are wiki-markup strings (v2, where
`{quote}` blocks are taken out as quoted replies) or ADF documents (v3). Rules:

- Resolved: `resolution` is set, and is not one that says nothing was fixed (Won't Do,
  Won't Fix, Duplicate, Cannot Reproduce, Incomplete, Declined...: rejected `not_fixed`).
- The description is the customer's (the reporter's); a comment is the customer's when its
  author is the reporter, an agent's otherwise. Internal comments (`jsdPublic: false`, or a
  `visibility` restriction) are left out.
- Resolutions, reopens: changelog items on `resolution` (set resolves, cleared reopens) and
  status transitions into a status named "Reopened".
- Escalated: a label containing "escalat" or a status named so; the changelog (labels or
  status) says when.
- Satisfaction: `feedback.rating` 1-5 -> stars.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from flywheel.errors import InvalidInput
from ingest.framework import Rejected
from ingest.tickets.adf import adf_to_text
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
    unique_names,
)

NOT_FIXED = frozenset(
    {
        "won't do",
        "won't fix",
        "wont fix",
        "duplicate",
        "cannot reproduce",
        "incomplete",
        "declined",
        "rejected",
        "obsolete",
        "not a bug",
        "abandoned",
    }
)
_QUOTE_BLOCK = re.compile(r"\{quote\}.*?\{quote\}", re.S)
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class JiraIngestor(TicketExport):
    source_format = "jira"
    noun = "issue"
    array_key = "issues"

    def name_of(self, payload: object) -> str:
        key = payload.get("key") if isinstance(payload, dict) else None
        return key if isinstance(key, str) else "?"

    def read_thread(self, record: Fields) -> Thread:
        return read_issue(record)


def read_issue(issue: Fields) -> Thread:
    key = issue.ident("key")
    fields = issue.obj("fields")
    if fields is None:
        raise InvalidInput(f"{issue.where}: no fields (export with fields=*all)")
    resolution = fields.obj("resolution")
    if resolution is not None and resolution.text("name").casefold() in NOT_FIXED:
        raise Rejected("not_fixed", f"jira:{key} was resolved as {resolution.text('name')}")
    reporter = fields.obj("reporter")
    timed = [*_posts(fields, _person_id(reporter)), *_changes(issue)]
    timed.sort(key=lambda item: (item[0], isinstance(item[1], Change)))
    status = fields.obj("status")
    markers = [*fields.strings("labels"), status.text("name") if status else ""]
    return Thread(
        source_format="jira",
        ticket_id=key,
        subject=fields.text("summary"),
        timeline=tuple(entry for _, entry in timed),
        is_resolved=resolution is not None,
        is_escalated=any("escalat" in marker.casefold() for marker in markers),
        rating=_rating(issue.obj("feedback")),
        names=unique_names(*_names(fields)),
    )


def _posts(fields: Fields, reporter: str | None) -> list[tuple[datetime, Entry]]:
    created = fields.time("created") or _NO_TIME
    posts: list[tuple[datetime, Entry]] = [
        (created, Post("description", "customer", _body(fields, "description")))
    ]
    thread = fields.obj("comment")
    for comment in thread.objects("comments") if thread else []:
        if not comment.flag("jsdPublic", default=True) or comment.raw("visibility"):
            continue
        author = _person_id(comment.obj("author"))
        role: Role = "customer" if author is not None and author == reporter else "agent"
        post = Post(comment.ident("id"), role, _body(comment, "body"))
        posts.append((comment.time("created") or created, post))
    return posts


def _body(record: Fields, key: str) -> str:
    """A v2 wiki-markup string or a v3 ADF document, as clean text."""
    value = record.raw(key)
    if isinstance(value, dict):
        return body_text(adf_to_text(value), is_html=False)
    return body_text(_QUOTE_BLOCK.sub("", record.text(key)), is_html=False)


def _person_id(person: Fields | None) -> str | None:
    """Cloud users have an accountId, Server/Data Center ones a name or key."""
    if person is None:
        return None
    for key in ("accountId", "name", "key", "emailAddress", "displayName"):
        if value := person.text(key):
            return value
    return None


def _changes(issue: Fields) -> list[tuple[datetime, Entry]]:
    changelog = issue.obj("changelog")
    changes: list[tuple[datetime, Entry]] = []
    for history in changelog.objects("histories") if changelog else []:
        when = history.time("created") or _NO_TIME
        kinds = {kind for item in history.objects("items") if (kind := _change_kind(item))}
        changes += [
            (when, Change(kind)) for kind in ("escalated", "reopened", "resolved") if kind in kinds
        ]
    return changes


def _change_kind(item: Fields) -> ChangeKind | None:
    field = item.text("field").casefold()
    before, after = _string(item.raw("fromString")), _string(item.raw("toString"))
    if field == "resolution" and before != after:
        return "resolved" if after else "reopened"
    if field == "status" and "reopen" in after.casefold():
        return "reopened"
    if field in ("status", "labels") and "escalat" in after.casefold():
        return None if "escalat" in before.casefold() else "escalated"
    return None


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _rating(feedback: Fields | None) -> Rating | None:
    stars = feedback.number("rating") if feedback else None
    if stars is None:
        return None
    if not 1 <= stars <= 5:
        raise InvalidInput(f"{feedback.where if feedback else ''}.rating must be 1-5, not {stars}")
    return Rating({"stars": stars})


def _names(fields: Fields) -> list[str]:
    people = [fields.obj("reporter"), fields.obj("assignee"), fields.obj("creator")]
    thread = fields.obj("comment")
    people += [comment.obj("author") for comment in (thread.objects("comments") if thread else [])]
    return [person.text("displayName") for person in people if person is not None]
