"""Ticket exports in the shapes the vendors' tools write them: Zendesk's side-loaded `users`
and `organizations` (`include=users,organizations`), comments that exist only as the Comment
events of ticket audits, the incremental export's pages; GitHub issues as `gh api --paginate`
writes them (arrays one after another, `--slurp`'s array of pages, `--jq '.[]'` lines). A
record whose people cannot be placed on a side is rejected, never guessed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.signals.candidates import (
    Candidate,
    FeedbackItem,
    InteractionCandidate,
    PairCandidate,
    Provenance,
    SftCandidate,
)
from ingest.framework import Ingestor, Rejected
from ingest.tickets import make_ticket_ingestor
from ingest.tickets.convert import REOPENED_WHY

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tickets"
SIDELOADED = FIXTURES / "zendesk_sideloaded.json"
INCREMENTAL = FIXTURES / "zendesk_incremental.jsonl"
GITHUB = FIXTURES / "github_issues.json"
TAGS = ("ticket.priority:high", "ticket.type:problem")


def convert_all(ingestor: Ingestor) -> list[list[Candidate] | str]:
    results: list[list[Candidate] | str] = []
    for record in ingestor.records():
        try:
            results.append(ingestor.convert(record))
        except Rejected as rejected:
            results.append(rejected.reason)
    return results


def provenance(key: str, names: tuple[str, ...], ref: str | None = None) -> Provenance:
    source_ref = key if ref is None else f"{key}:comment:{ref}"
    return Provenance("ticket", source_ref, key, names, TAGS)


def outcome(reason: str, event_id: str) -> FeedbackItem:
    return FeedbackItem("outcome", {"success": False, "reason": reason}, event_id)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


SYNC = "zendesk:5101"
SYNC_NAMES = ("Lena Fischer", "Kenji Tanaka", "Anna Kowalska", "Fischer Logistik GmbH")
SYNC_PROBLEM = user(
    "Calendar sync stopped\n\nSince Monday no new events show up in the shared calendar. "
    "Nothing changed on our side."
)
SYNC_FIRST = (
    "Please disconnect and reconnect the calendar integration under Settings \u203a Integrations."
)
SYNC_FINAL = (
    "Hi Lena,\n\nThe sync stopped because your Google token was revoked when your admin rotated "
    "the OAuth client. I have cleared the stale token; reconnect once and events will sync again "
    "within five minutes."
)
SYNC_CANDIDATES: list[Candidate] = [
    SftCandidate(provenance(SYNC, SYNC_NAMES), SYNC_PROBLEM, SYNC_FINAL),
    PairCandidate(provenance(SYNC, SYNC_NAMES), SYNC_PROBLEM, SYNC_FINAL, SYNC_FIRST, REOPENED_WHY),
    InteractionCandidate(
        provenance(SYNC, SYNC_NAMES, "80002"),
        SYNC_PROBLEM,
        SYNC_FIRST,
        (
            outcome("ticket reopened", f"{SYNC}:reopened:1"),
            outcome("ticket escalated", f"{SYNC}:escalated"),
        ),
    ),
]
EXPORT = "zendesk:5102"
EXPORT_NAMES = ("Tomás Ortega", "Kenji Tanaka", "Ortega Hermanos S.L.")
EXPORT_CANDIDATES: list[Candidate] = [
    SftCandidate(
        provenance(EXPORT, EXPORT_NAMES),
        user(
            'Export to Excel cuts off accents\n\nExporting contacts to Excel turns "Tomás" into '
            '"TomÃ¡s".'
        ),
        'Choose "CSV (UTF-8)" in the export dialog; Excel then keeps the accents.',
    )
]


def test_zendesk_users_side_loaded_at_the_top_level_decide_who_answered() -> None:
    """The reported defect: with `include=users` the users sit beside `tickets`, not in them.
    The tier-2 admin who solved 5101 is neither requester nor assignee; read from the
    side-load, their answer is the target and the frontline answer the rejected side of a
    pair, judged by the reopen and the escalation."""
    results = convert_all(make_ticket_ingestor("zendesk", SIDELOADED))

    assert results == [SYNC_CANDIDATES, EXPORT_CANDIDATES, "unknown_roles"]


def test_a_reply_by_someone_the_export_does_not_describe_is_rejected_not_guessed(
    tmp_path: Path,
) -> None:
    page = json.loads(SIDELOADED.read_text(encoding="utf-8"))
    without_users = tmp_path / "tickets.json"
    without_users.write_text(json.dumps({"tickets": page["tickets"][:1]}), encoding="utf-8")
    ingestor = make_ticket_ingestor("zendesk", without_users)
    (record,) = ingestor.records()

    with pytest.raises(Rejected) as rejected:
        ingestor.convert(record)

    assert rejected.value.reason == "unknown_roles"
    assert "9102" in rejected.value.detail
    assert "include=users" in rejected.value.detail


def test_users_embedded_per_ticket_as_the_comments_endpoint_returns_them(tmp_path: Path) -> None:
    """`/tickets/{id}/comments.json?include=users` embedded as it came: {"comments", "users"}."""
    page = json.loads(SIDELOADED.read_text(encoding="utf-8"))
    ticket = page["tickets"][0]
    authors = [user for user in page["users"] if user["id"] in (9201, 9101, 9102)]
    ticket["comments"] = {"comments": ticket["comments"], "users": authors, "count": 5}
    ticket["organizations"] = page["organizations"]
    path = tmp_path / "tickets.json"
    path.write_text(json.dumps({"tickets": [ticket]}), encoding="utf-8")

    assert convert_all(make_ticket_ingestor("zendesk", path)) == [SYNC_CANDIDATES]


def test_zendesk_incremental_export_pages_one_per_line() -> None:
    """Two pages of /api/v2/incremental/tickets.json: 5101 comes twice (updated during the
    export): only its later copy, the latest state, is read; a ticket exported without its
    comments says so."""
    ingestor = make_ticket_ingestor("zendesk", INCREMENTAL)

    refs = [record.ref for record in ingestor.records()]
    results = convert_all(ingestor)

    assert refs == [
        "zendesk_incremental.jsonl ticket 5101 (line 1 #1)",
        "zendesk_incremental.jsonl ticket 5104 (line 1 #2)",
        "zendesk_incremental.jsonl ticket 5101 (line 2 #1)",
        "zendesk_incremental.jsonl ticket 5102 (line 2 #2)",
    ]
    assert results == ["superseded", "comments_not_exported", SYNC_CANDIDATES, EXPORT_CANDIDATES]


def test_zendesk_incremental_pages_saved_one_after_another_read_the_same(tmp_path: Path) -> None:
    pages = INCREMENTAL.read_text(encoding="utf-8").splitlines()
    path = tmp_path / "incremental.json"
    path.write_text("\n".join(json.dumps(json.loads(p), indent=2) for p in pages), "utf-8")

    assert convert_all(make_ticket_ingestor("zendesk", path)) == convert_all(
        make_ticket_ingestor("zendesk", INCREMENTAL)
    )


# GitHub -------------------------------------------------------------------------------------


def github_issues() -> list[dict[str, object]]:
    issues: list[dict[str, object]] = json.loads(GITHUB.read_text(encoding="utf-8"))
    return issues


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(lambda pages: "".join(json.dumps(page) for page in pages), id="paginate"),
        pytest.param(lambda pages: "\n".join(json.dumps(p, indent=2) for p in pages), id="pretty"),
        pytest.param(lambda pages: json.dumps(pages), id="slurp"),
        pytest.param(
            lambda pages: "".join(json.dumps(i) + "\n" for page in pages for i in page), id="jq"
        ),
    ],
)
def test_gh_api_paginate_output_reads_like_one_array(tmp_path: Path, layout: object) -> None:
    """`gh api --paginate repos/o/r/issues` writes each page's array right after the last."""
    issues = github_issues()
    pages = [issues[:3], issues[3:5], issues[5:]]
    path = tmp_path / "issues.json"
    path.write_text(layout(pages), encoding="utf-8")  # type: ignore[operator]

    assert convert_all(make_ticket_ingestor("github", path)) == convert_all(
        make_ticket_ingestor("github", GITHUB)
    )


def test_gh_paginate_refs_count_across_pages(tmp_path: Path) -> None:
    issues = github_issues()
    path = tmp_path / "issues.json"
    path.write_text(json.dumps(issues[:2]) + json.dumps(issues[2:3]), encoding="utf-8")

    assert [r.ref for r in make_ticket_ingestor("github", path).records()] == [
        "issues.json issue #12 (#1)",
        "issues.json issue #13 (#2)",
        "issues.json issue #14 (#3)",
    ]


def test_a_github_comment_without_author_association_is_not_guessed(tmp_path: Path) -> None:
    """The REST API always sends author_association; an export that dropped it cannot say
    whether a commenter is a maintainer."""
    issue = github_issues()[0]
    for comment in issue["comments"]:  # type: ignore[attr-defined]
        comment.pop("author_association")
    path = tmp_path / "issues.json"
    path.write_text(json.dumps([issue]), encoding="utf-8")
    ingestor = make_ticket_ingestor("github", path)
    (record,) = ingestor.records()

    with pytest.raises(Rejected) as rejected:
        ingestor.convert(record)

    assert rejected.value.reason == "unknown_roles"
    assert "octo-maint" in rejected.value.detail
    assert "author_association" in rejected.value.detail


def test_a_ticket_exported_twice_yields_only_its_later_state(tmp_path: Path) -> None:
    """An incremental export repeats a ticket updated during the export. Both copies solved
    (first with the frontline answer, later reopened and solved by tier 2): were both read,
    the early copy's SFT example (the rejected answer) would sit beside the later copy's
    pair in one batch, and train the answer the customer reopened."""
    pages = [json.loads(line) for line in INCREMENTAL.read_text(encoding="utf-8").splitlines()]
    early = pages[0]["tickets"][0]
    early["status"] = "solved"
    early["comments"], early["audits"] = early["comments"][:2], early["audits"][:1]
    path = tmp_path / "incremental.jsonl"
    path.write_text("".join(json.dumps(page) + "\n" for page in pages), encoding="utf-8")

    results = convert_all(make_ticket_ingestor("zendesk", path))

    assert results == ["superseded", "comments_not_exported", SYNC_CANDIDATES, EXPORT_CANDIDATES]
