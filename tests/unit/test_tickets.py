"""Ticket exports (Zendesk, Jira, GitHub, CSV) into candidates: each vendor fixture's tickets
give exactly the SFT examples, pairs and judged interactions the rules in
`ingest.tickets.convert` promise, and nothing for tickets with no signal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flywheel.errors import InvalidInput
from flywheel.feedback.values import OutcomeValue, RatingValue
from flywheel.signals.candidates import (
    Candidate,
    FeedbackItem,
    InteractionCandidate,
    PairCandidate,
    Provenance,
    SftCandidate,
)
from ingest.framework import Ingestor, Rejected
from ingest.tickets import TICKET_FORMATS, make_ticket_ingestor
from ingest.tickets.convert import REOPENED_WHY

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tickets"
CSV_MAPPING = (
    "id=Ticket ID, subject=Subject, body=Description, first_resolution=First Response, "
    "resolution=Resolution, status=Status, requester=Requester, assignee=Agent, "
    "satisfaction=CSAT, reopened=Reopened, escalated=Escalated"
)


def convert_all(ingestor: Ingestor) -> list[list[Candidate] | str]:
    """Per record in order: its candidates, or the reason it was rejected."""
    results: list[list[Candidate] | str] = []
    for record in ingestor.records():
        try:
            results.append(ingestor.convert(record))
        except Rejected as rejected:
            results.append(rejected.reason)
    return results


def ticket(key: str, names: tuple[str, ...]) -> Provenance:
    return Provenance("ticket", key, key, names)


def comment(key: str, ref: str, names: tuple[str, ...]) -> Provenance:
    return Provenance("ticket", f"{key}:comment:{ref}", key, names)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def reopened(key: str, number: int = 1) -> FeedbackItem:
    value = {"success": False, "reason": "ticket reopened"}
    return FeedbackItem("outcome", value, f"{key}:reopened:{number}")


def escalated(key: str) -> FeedbackItem:
    return FeedbackItem(
        "outcome", {"success": False, "reason": "ticket escalated"}, f"{key}:escalated"
    )


def rating(key: str, value: dict[str, object]) -> FeedbackItem:
    return FeedbackItem("rating", value, f"{key}:satisfaction")


# Zendesk ------------------------------------------------------------------------------------

ZOE, KENJI = "Zoë Müller", "Kenji Tanaka"
VAT_PROBLEM = user(
    "Invoice PDF shows the wrong VAT rate\n\nHello,\n\nThe invoice PDF for March shows 19% VAT "
    "but we are a reverse-charge customer (VAT ID DE123456789).\n\nCould you fix it?"
)
VAT_ANSWER = (
    "Hi Zoë,\n\nThanks for the VAT ID. I have enabled reverse charge on your billing profile and "
    "re-issued the March invoice without VAT; you will find it under Billing \u203a Invoices "
    "(https://app.acme.example/billing/invoices)."
)
LOGIN_PROBLEM = user(
    "无法登录 \u2013 login loop after password reset\n\nAfter resetting my password I get sent "
    "back to the login page every time. 我已经试了三次了 😩"
)
LOGIN_FIRST = (
    "Sorry about that! Please clear your browser cookies for app.acme.example and sign in again."
)
LOGIN_FINAL = (
    "Thanks for checking. Your account had a stale two-factor session, which I have reset.\n\n"
    "1. Sign in with your new password.\n2. Set up two-factor authentication again when prompted."
)
EXPORT_PROBLEM = user(
    "API returns 500 on bulk export\n\nSince this morning POST /v2/exports returns HTTP 500 for "
    "any request with more than 1,000 rows.\n\nRequest id: 7f3c9e2a"
)
EXPORT_FIRST = (
    "Thanks José. Could you try splitting the export into batches of 1,000 rows while we look "
    "into it?"
)
EXPORT_FINAL = (
    "Hi José,\n\nOur engineers found a timeout in the export service for requests over 1,000 "
    "rows and deployed a fix at 14:20 UTC. Full exports work again; no change is needed on your "
    "side."
)
REFUND_PROBLEM = user(
    "Refund for duplicate charge\n\nI was charged twice for the March subscription (2 \u00d7 49.00 "
    "EUR). Please refund one of them.\nYou can reach me at zoe.muller@example.de or +49 30 "
    "1234567."
)
REFUND_ANSWER = (
    "Refunds for card payments can only be issued by your bank. Please contact them with the "
    "transaction reference."
)


def without_tags(results: list[Any]) -> list[Any]:
    """The candidates with their tags left out (Zendesk's priority and type, checked apart)."""
    return [
        [replace(c, provenance=replace(c.provenance, tags=())) for c in item]
        if isinstance(item, list)
        else item
        for item in results
    ]


def test_zendesk_export_gives_the_promised_candidates_per_ticket() -> None:
    tagged = convert_all(make_ticket_ingestor("zendesk", FIXTURES / "zendesk_tickets.json"))
    assert {c.provenance.tags for c in tagged[0]} == {
        ("ticket.priority:normal", "ticket.type:question")
    }
    results = without_tags(tagged)

    vat, login, export = ("zendesk:4711", "zendesk:4712", "zendesk:4713")
    vat_names, login_names = (ZOE, KENJI), ("王芳", KENJI)
    export_names = ("José Álvarez", KENJI, "Anna Kowalska")
    assert results == [
        [  # solved and rated good: the resolution, and the rating on it
            SftCandidate(ticket(vat, vat_names), VAT_PROBLEM, VAT_ANSWER),
            InteractionCandidate(
                comment(vat, "70003", vat_names),
                VAT_PROBLEM,
                VAT_ANSWER,
                (rating(vat, {"thumbs": "up"}),),
            ),
        ],
        [  # reopened, solved differently; the customer's "thanks" reopen judged nothing
            SftCandidate(ticket(login, login_names), LOGIN_PROBLEM, LOGIN_FINAL),
            PairCandidate(
                ticket(login, login_names), LOGIN_PROBLEM, LOGIN_FINAL, LOGIN_FIRST, REOPENED_WHY
            ),
            InteractionCandidate(
                comment(login, "71002", login_names), LOGIN_PROBLEM, LOGIN_FIRST, (reopened(login),)
            ),
        ],
        [  # escalated to tier 2: the frontline answer before the escalation was overruled
            SftCandidate(ticket(export, export_names), EXPORT_PROBLEM, EXPORT_FINAL),
            InteractionCandidate(
                comment(export, "72002", export_names),
                EXPORT_PROBLEM,
                EXPORT_FIRST,
                (escalated(export),),
            ),
        ],
        "unresolved",
        "no_agent_reply",  # solved with an internal note only (merged duplicate)
        [  # rated bad: no SFT example, the rating still lands on the answer
            InteractionCandidate(
                comment("zendesk:4716", "74002", vat_names),
                REFUND_PROBLEM,
                REFUND_ANSWER,
                (rating("zendesk:4716", {"thumbs": "down"}),),
            )
        ],
    ]


def test_zendesk_json_lines_export_reads_the_same_tickets() -> None:
    ingestor = make_ticket_ingestor("zendesk", FIXTURES / "zendesk_tickets.jsonl")

    records = list(ingestor.records())

    assert [record.ref for record in records] == [
        "zendesk_tickets.jsonl ticket 4711 (line 1)",
        "zendesk_tickets.jsonl ticket 4714 (line 2)",
    ]
    assert without_tags([ingestor.convert(records[0])])[0][0] == SftCandidate(
        ticket("zendesk:4711", (ZOE, KENJI)), VAT_PROBLEM, VAT_ANSWER
    )


# Jira ---------------------------------------------------------------------------------------

SYNC_PROBLEM = user(
    "Sync with Salesforce stopped after upgrade\n\nHi, since upgrading to 4.2 our Salesforce "
    "sync stops after a few minutes. What we tried:\n\n- Reconnecting the integration\n"
    "- Re-entering the API token\n\nTakk! 🙏\n\nForgot to add: the log says RATE_LIMIT_EXCEEDED."
)
SYNC_ANSWER = (
    "Hi @Ingrid Øvrebø,\n\n4.2 syncs in parallel and hits the Salesforce API limit. Set the sync "
    "concurrency to 2 as described in our guide (https://docs.acme.example/salesforce#limits):"
    "\n\nsalesforce:\n  concurrency: 2"
)
DATES_PROBLEM = user(
    'CSV import rejects dates\n\nImporting contacts.csv fails with "invalid date" for every '
    "row. Dates look like 31/12/2024."
)
DATES_FIRST = "Please save the file as UTF-8 and import again."
DATES_FINAL = (
    "The importer expects ISO dates. Choose Date format: DD/MM/YYYY in step 2 of the import "
    "wizard, or convert the column to YYYY-MM-DD."
)
MIGRATION_PROBLEM = user(
    "Data missing after migration\n\nAfter the migration to the EU region, all attachments "
    "before 2023 are gone."
)
MIGRATION_FIRST = "Attachments are migrated in the background; please wait 24 hours."
MIGRATION_FINAL = (
    "The background job skipped attachments larger than 2 GB. We re-ran it with the limit "
    "lifted; all attachments are back as of 15:40 CEST."
)


def test_jira_v3_search_export_gives_the_promised_candidates_per_issue() -> None:
    results = convert_all(make_ticket_ingestor("jira", FIXTURES / "jira_search_v3.json"))

    sync, dates, migration = "jira:SUP-101", "jira:SUP-102", "jira:SUP-105"
    sync_names = ("Ingrid Øvrebø", "Priya Raman")
    dates_names = ("佐藤 愛子", "Marcus Lindqvist")
    migration_names = ("Ingrid Øvrebø", "Marcus Lindqvist", "Priya Raman")
    assert results == [
        [  # ADF bodies as text; the internal comment left out; CSAT 5 stars
            SftCandidate(ticket(sync, sync_names), SYNC_PROBLEM, SYNC_ANSWER),
            InteractionCandidate(
                comment(sync, "20003", sync_names),
                SYNC_PROBLEM,
                SYNC_ANSWER,
                (rating(sync, {"stars": 5}),),
            ),
        ],
        [  # resolution cleared by a reopen, resolved again with another answer
            SftCandidate(ticket(dates, dates_names), DATES_PROBLEM, DATES_FINAL),
            PairCandidate(
                ticket(dates, dates_names), DATES_PROBLEM, DATES_FINAL, DATES_FIRST, REOPENED_WHY
            ),
            InteractionCandidate(
                comment(dates, "21001", dates_names), DATES_PROBLEM, DATES_FIRST, (reopened(dates),)
            ),
            InteractionCandidate(
                comment(dates, "21003", dates_names),
                DATES_PROBLEM,
                DATES_FINAL,
                (rating(dates, {"stars": 4}),),
            ),
        ],
        "not_fixed",  # Won't Do
        "unresolved",
        [
            SftCandidate(ticket(migration, migration_names), MIGRATION_PROBLEM, MIGRATION_FINAL),
            InteractionCandidate(
                comment(migration, "24001", migration_names),
                MIGRATION_PROBLEM,
                MIGRATION_FIRST,
                (escalated(migration),),
            ),
        ],
    ]


def test_jira_v2_wiki_bodies_drop_quote_blocks_and_restricted_comments() -> None:
    results = convert_all(make_ticket_ingestor("jira", FIXTURES / "jira_search_v2.json"))

    problem = user(
        "Cannot export report to PDF\n\nExporting the *Q1 report* to PDF gives a blank page.\n\n"
        "{code}Error: canvas is null{code}\n\nOla\n\nAny news?"
    )
    answer = (
        "Fixed in 7.4.1: charts are now rendered before the PDF is written. Please update and "
        "export again."
    )
    names = ("Ola Nordmann", "Jane Doe")
    assert results == [[SftCandidate(ticket("jira:HELP-7", names), problem, answer)]]


# GitHub -------------------------------------------------------------------------------------

PARSER_PROBLEM = user(
    "Parser crashes on empty generic type `List<>`\n\n### Describe the bug\n\nParsing this file "
    "crashes the parser:\n\n```java\nList<String> a = new ArrayList<>();\nMap<> broken;\n```\n\n"
    "### Version\n\nwidgets 2.3.1 on Python 3.12 🐍"
)
PARSER_ANSWER = (
    "Thanks for the report! `Map<>` without type arguments hit an unchecked index. Fixed in #15, "
    "released in **2.3.2**:\n\n```\npip install -U widgets==2.3.2\n```"
)
TZ_PROBLEM = user(
    "Timezone offset wrong for Europe/Lisbon\n\nTimestamps for `Europe/Lisbon` are one hour off "
    "in summer.\n\nExpected `+01:00`, got `+00:00`."
)
TZ_FIRST = "Please upgrade `tzdata`; old versions have this bug."
TZ_FINAL = (
    "Found it: we cached the UTC offset at import time. 2.3.3 computes it per timestamp, so DST "
    "is respected."
)
LEAK_PROBLEM = user(
    "Memory leak in long-running worker\n\nWorker RSS grows ~50 MB/hour under constant load "
    "until it is OOM-killed."
)
LEAK_FIRST = "Could you restart the worker daily as a workaround?"
LEAK_FINAL = (
    "The leak was the per-request logger cache. Fixed in 2.3.4: the cache is now bounded "
    "(`LOG_CACHE_SIZE`, default 1024)."
)


def test_github_issues_export_gives_the_promised_candidates_per_issue() -> None:
    results = convert_all(make_ticket_ingestor("github", FIXTURES / "github_issues.json"))

    parser, tz, leak = "github:acme/widgets#12", "github:acme/widgets#13", "github:acme/widgets#18"
    tz_names = ("rene-dupont", "octo-maint", "acme-owner")
    leak_names = ("mei-lin", "octo-maint", "acme-owner")
    assert results == [
        [  # code in Markdown survives; the template comment, bystander and bot do not count
            SftCandidate(
                ticket(parser, ("mei-lin", "octo-maint", "random-dev")),
                PARSER_PROBLEM,
                PARSER_ANSWER,
            )
        ],
        [
            SftCandidate(ticket(tz, tz_names), TZ_PROBLEM, TZ_FINAL),
            PairCandidate(ticket(tz, tz_names), TZ_PROBLEM, TZ_FINAL, TZ_FIRST, REOPENED_WHY),
            InteractionCandidate(
                comment(tz, "9101", tz_names), TZ_PROBLEM, TZ_FIRST, (reopened(tz),)
            ),
        ],
        "pull_request",
        "not_planned",
        "unresolved",
        "comments_not_exported",
        [
            SftCandidate(ticket(leak, leak_names), LEAK_PROBLEM, LEAK_FINAL),
            InteractionCandidate(
                comment(leak, "9401", leak_names), LEAK_PROBLEM, LEAK_FIRST, (escalated(leak),)
            ),
        ],
    ]


def test_github_issues_wrapped_in_an_object_read_the_same(tmp_path: Path) -> None:
    issues = (FIXTURES / "github_issues.json").read_text(encoding="utf-8")
    wrapped = tmp_path / "issues.json"
    wrapped.write_text(f'{{"issues": {issues}}}', encoding="utf-8")

    assert convert_all(make_ticket_ingestor("github", wrapped)) == convert_all(
        make_ticket_ingestor("github", FIXTURES / "github_issues.json")
    )


# Across vendors -----------------------------------------------------------------------------

ALL_EXPORTS = [
    ("zendesk", "zendesk_tickets.json", None),
    ("jira", "jira_search_v3.json", None),
    ("jira", "jira_search_v2.json", None),
    ("github", "github_issues.json", None),
    ("csv", "tickets.csv", CSV_MAPPING),
]


@pytest.mark.parametrize(("source_format", "name", "mapping"), ALL_EXPORTS)
def test_feedback_values_are_valid_events_and_threads_stay_one_group(
    source_format: str, name: str, mapping: str | None
) -> None:
    ingestor = make_ticket_ingestor(source_format, FIXTURES / name, mapping)
    candidates = [
        candidate
        for result in convert_all(ingestor)
        if isinstance(result, list)
        for candidate in result
    ]
    items = [item for c in candidates if isinstance(c, InteractionCandidate) for item in c.feedback]

    for item in items:
        value_type = RatingValue if item.kind == "rating" else OutcomeValue
        assert value_type.model_validate(item.value).model_dump(exclude_unset=True) == item.value
    assert len({item.event_id for item in items}) == len(items)
    for candidate in candidates:
        assert candidate.provenance.source_kind == "ticket"
        assert (
            candidate.provenance.group_key == candidate.provenance.source_ref.split(":comment:")[0]
        )
    assert ingestor.source_kind == "ticket"
    assert ingestor.source_format == source_format


def test_unknown_format_lists_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as error:
        make_ticket_ingestor("freshdesk", FIXTURES / "zendesk_tickets.json")

    assert error.value.message == (
        f"unknown ticket format 'freshdesk'; known: {', '.join(TICKET_FORMATS)}"
    )
    assert TICKET_FORMATS == ("zendesk", "jira", "github", "csv")


def test_a_mapping_for_a_json_format_is_refused() -> None:
    with pytest.raises(InvalidInput, match="column mapping is for the csv format only, not jira"):
        make_ticket_ingestor("jira", FIXTURES / "jira_search_v3.json", "id=key")


def test_fingerprint_is_the_sha256_of_the_file() -> None:
    import hashlib

    path = FIXTURES / "zendesk_tickets.json"
    ingestor = make_ticket_ingestor("zendesk", path)

    assert ingestor.fingerprint() == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ingestor.source_ref == str(path)
