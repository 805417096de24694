"""GitHub issues exports.

Accepted shape: the issues of `GET /repos/{owner}/{repo}/issues?state=all`, each with its
`GET .../issues/{number}/comments` embedded as `comments` (in place of the API's comment
count) and, for reopen and escalation history, its `GET .../issues/{number}/events` (or
`/timeline`) as `events` (or `timeline`):

    [{"number": 12, "title", "body", "user": {"login", "type"}, "state": "closed",
      "state_reason": "completed", "labels": [{"name"}], "assignees": [{"login"}],
      "repository_url": "https://api.github.com/repos/octo/app", "created_at",
      "comments": [{"id", "user": {"login", "type"}, "author_association", "body",
                    "created_at"}],
      "events": [{"event": "closed"|"reopened"|"labeled", "label": {"name"},
                  "created_at"}]}]

as a top-level array, as `{"issues": [...]}`, or one issue per line (`.jsonl`); and as
`gh api --paginate` writes it: page arrays one after another (`[...][...]`), an array of
pages (`--slurp`) or issues one after another (`--jq '.[]'`). `flywheel ingest tickets
--from-github owner/repo` fetches this shape from the REST API (`ingest.tickets.github_api`).
Bodies are Markdown and stay Markdown (code in them must survive); HTML comments (issue-template
instructions) and quoted replies are taken out. Rules:

- Pull requests (they carry `pull_request`) are rejected `pull_request`.
- Resolved: `state` closed with `state_reason` completed (or none, as issues closed before
  GitHub recorded reasons); closed as not_planned or duplicate is rejected `not_planned`.
- The issue author is the customer; comments by the repository's OWNER, MEMBER or
  COLLABORATOR (`author_association`, as the REST API returns it) are the agent's
  (maintainers'); bots and other users are neither. A closed issue with a comment that has
  no `author_association` (an export that dropped it) is rejected `unknown_roles`: the
  commenter's side is not guessed. An issue
  whose `comments` is still the API's count was exported without its comments: rejected
  `comments_not_exported`.
- Resolutions, reopens: `closed` and `reopened` events.
- Escalated: a label containing "escalat"; its `labeled` event says when.
- GitHub has no satisfaction rating; reactions are not read.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from ingest.framework import Rejected
from ingest.tickets.export import TicketExport
from ingest.tickets.fields import Fields
from ingest.tickets.text import body_text
from ingest.tickets.thread import Change, ChangeKind, Entry, Post, Role, Thread, unique_names

MAINTAINERS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
COMPLETED = frozenset({"completed", ""})
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_REPOSITORY = re.compile(r"(?:api\.)?github\.com/(?:repos/)?([^/]+/[^/]+?)(?:/issues/\d+)?/?$")
_EVENT_KINDS: dict[str, ChangeKind] = {"closed": "resolved", "reopened": "reopened"}
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class GithubIngestor(TicketExport):
    source_format = "github"
    noun = "issue"
    array_key = "issues"
    id_key = "number"
    is_array_allowed = True

    def name_of(self, payload: Any) -> str:
        number = payload.get("number") if isinstance(payload, dict) else None
        return f"#{number}" if isinstance(number, int) else "?"

    def read_thread(self, record: Fields) -> Thread:
        return read_issue(record)


def read_issue(issue: Fields) -> Thread:
    number = issue.ident("number")
    ticket_id = f"{_repository(issue)}#{number}"
    if issue.raw("pull_request") is not None:
        raise Rejected("pull_request", f"github:{ticket_id} is a pull request")
    reason = issue.text("state_reason")
    if issue.text("state") == "closed" and reason not in COMPLETED:
        raise Rejected("not_planned", f"github:{ticket_id} was closed as {reason}")
    if isinstance(issue.raw("comments"), int) and issue.raw("comments"):
        raise Rejected(
            "comments_not_exported",
            f"github:{ticket_id} has only a comment count (embed each issue's comments, or "
            "fetch with --from-github)",
        )
    author = _login(issue.obj("user"))
    posts, unplaced = _posts(issue, author)
    if issue.text("state") == "closed" and unplaced:
        raise Rejected(
            "unknown_roles",
            f"github:{ticket_id}: no author_association for {', '.join(unplaced)} (export "
            "comments as the REST API returns them)",
        )
    timed = [*posts, *_changes(issue)]
    timed.sort(key=lambda item: (item[0], isinstance(item[1], Change)))
    labels = _labels(issue)
    return Thread(
        source_format="github",
        ticket_id=ticket_id,
        subject=issue.text("title"),
        timeline=tuple(entry for _, entry in timed),
        is_resolved=issue.text("state") == "closed",
        is_escalated=any("escalat" in label.casefold() for label in labels),
        names=unique_names(author, *_other_logins(issue)),
    )


def _repository(issue: Fields) -> str:
    """owner/repo, from the URLs every issue carries; "" when none is there."""
    for key in ("repository_url", "html_url", "url"):
        if match := _REPOSITORY.search(issue.text(key)):
            return match.group(1)
    return ""


def _posts(issue: Fields, author: str) -> tuple[list[tuple[datetime, Entry]], list[str]]:
    """The posts, and the commenters whose side the export does not say."""
    created = issue.time("created_at") or _NO_TIME
    posts: list[tuple[datetime, Entry]] = [(created, Post("body", "customer", _text(issue)))]
    unplaced: dict[str, None] = {}
    comments = issue.objects("comments") if isinstance(issue.raw("comments"), list) else []
    for comment in comments:
        role = _role(comment, author)
        if role is None:
            unplaced.setdefault(_login(comment.obj("user")) or "(no user)", None)
        post = Post(comment.ident("id"), role or "other", _text(comment))
        posts.append((comment.time("created_at") or created, post))
    return posts, list(unplaced)


def _role(comment: Fields, author: str) -> Role | None:
    """None when the comment has no author_association to tell (the REST API always sends
    one: OWNER, MEMBER, COLLABORATOR are the maintainers; CONTRIBUTOR, NONE... are not)."""
    user = comment.obj("user")
    if user is not None and user.text("type") == "Bot":
        return "other"
    if author and _login(user) == author:
        return "customer"
    association = comment.text("author_association")
    if not association:
        return None
    return "agent" if association in MAINTAINERS else "other"


def _text(record: Fields) -> str:
    return body_text(_HTML_COMMENT.sub("", record.text("body")), is_html=False)


def _changes(issue: Fields) -> list[tuple[datetime, Entry]]:
    events = issue.objects("events") or issue.objects("timeline")
    return [
        (event.time("created_at") or _NO_TIME, Change(kind))
        for event in events
        if (kind := _event_kind(event)) is not None
    ]


def _event_kind(event: Fields) -> ChangeKind | None:
    name, label = event.text("event"), event.obj("label")
    if name == "labeled" and label is not None and "escalat" in label.text("name").casefold():
        return "escalated"
    return _EVENT_KINDS.get(name)


def _labels(issue: Fields) -> list[str]:
    """Label objects ({"name": ...}) as the REST API gives them, or plain names."""
    raw = issue.raw("labels")
    items = raw if isinstance(raw, list) else []
    return [
        item if isinstance(item, str) else Fields(item, f"{issue.where}.labels").text("name")
        for item in items
    ]


def _login(user: Fields | None) -> str:
    return user.text("login") if user is not None else ""


def _other_logins(issue: Fields) -> list[str]:
    people = [issue.obj("assignee"), *issue.objects("assignees")]
    if isinstance(issue.raw("comments"), list):
        people += [comment.obj("user") for comment in issue.objects("comments")]
    return [_login(person) for person in people if person and person.text("type") != "Bot"]
