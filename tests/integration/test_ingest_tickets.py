"""`flywheel ingest tickets`: each vendor's export through the CLI into the database, with
the people the ticket names redacted, one group per thread, and a second run adding nothing."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import FeedbackEvent, Interaction, PreferencePair, SftExample
from tests.conftest import Caller, count_rows, run_cli

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tickets"
TICKETS_JSON = FIXTURES / "zendesk_tickets.json"
CSV_MAPPING = (
    "id=Ticket ID,subject=Subject,body=Description,first_resolution=First Response,"
    "resolution=Resolution,status=Status,requester=Requester,assignee=Agent,"
    "satisfaction=CSAT,reopened=Reopened,escalated=Escalated"
)
EXPORTS = [  # file, format, mapping, records read, rejected
    ("zendesk_tickets.json", "zendesk", None, 6, 2),
    ("zendesk_tickets.jsonl", "zendesk", None, 2, 1),
    ("zendesk_sideloaded.json", "zendesk", None, 3, 1),
    ("zendesk_incremental.jsonl", "zendesk", None, 4, 2),
    ("jira_search_v2.json", "jira", None, 1, 0),
    ("jira_search_v3.json", "jira", None, 5, 2),
    ("github_issues.json", "github", None, 7, 4),
    ("tickets.csv", "csv", CSV_MAPPING, None, None),
]


def ingest(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run_cli(capsys, "ingest", "tickets", *args, "--domain", "billing", "--json")
    return code, (json.loads(out) if code == 0 else {}), err


def stored_text(sessions: sessionmaker[Session]) -> str:
    """Every text the ingest stored, in one string."""
    with sessions() as session:
        parts: list[Any] = [
            *session.execute(select(SftExample.messages, SftExample.completion)),
            *session.execute(
                select(PreferencePair.messages, PreferencePair.chosen, PreferencePair.rejected)
            ),
            *session.execute(select(Interaction.messages, Interaction.response)),
        ]
    return json.dumps([list(part) for part in parts], ensure_ascii=False)


@pytest.mark.parametrize(("name", "source_format", "mapping", "read", "rejected"), EXPORTS)
def test_an_export_goes_in_once(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    name: str,
    source_format: str,
    mapping: str | None,
    read: int | None,
    rejected: int | None,
) -> None:
    args = [str(FIXTURES / name), "--format", source_format]
    args += ["--mapping", mapping] if mapping else []

    code, first, err = ingest(capsys, *args)

    assert code == 0, err
    if read is not None:
        assert (first["read"], sum(first["rejected"].values())) == (read, rejected)
    assert first["accepted"].get("sft_examples", 0) >= 1
    with on_test_database() as session:
        groups = set(session.scalars(select(SftExample.group_key)))
        groups |= set(session.scalars(select(PreferencePair.group_key)))
    assert groups
    assert all(group.startswith(f"{source_format}:") for group in groups)

    code, again, _ = ingest(capsys, *args)

    assert code == 0
    assert again["accepted"] == {}
    assert again["duplicate"] == sum(first["accepted"].values())


def test_zendesk_signal_and_redaction(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, counts, err = ingest(
        capsys, str(FIXTURES / "zendesk_tickets.json"), "--format", "zendesk"
    )

    assert code == 0, err
    assert counts["accepted"]["preference_pairs"] >= 1  # a reopened ticket, solved differently
    assert counts["redacted"] >= 1
    with on_test_database() as session:
        kinds = set(session.scalars(select(FeedbackEvent.kind)))
        ratings = session.scalars(select(FeedbackEvent).where(FeedbackEvent.kind == "rating"))
        assert {"thumbs": "up"} in [event.value for event in ratings]
        pair = session.scalars(select(PreferencePair)).first()
        assert pair is not None
        assert pair.chosen != pair.rejected
        assert pair.why.startswith("reopened")
    assert kinds >= {"rating", "outcome"}
    text = stored_text(on_test_database)
    for person in ("Zoë Müller", "zoe.muller@example.de"):  # the requester of ticket 4711
        assert person not in text
    assert re.search(r"<[A-Z_]+>", text) is None  # surrogates, never placeholders


def test_zendesk_side_loaded_users_train_the_accepted_answer(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported defect, through the CLI: with `users` beside `tickets` the tier-2 answer
    of ticket 5101 is the SFT target, the frontline answer it replaced the rejected side of
    the pair, judged "ticket reopened" and "ticket escalated"."""
    code, counts, err = ingest(
        capsys, str(FIXTURES / "zendesk_sideloaded.json"), "--format", "zendesk"
    )

    assert code == 0, err
    assert counts["rejected"] == {"unknown_roles": 1}
    with on_test_database() as session:
        sft = session.scalars(
            select(SftExample).where(SftExample.group_key == "zendesk:5101")
        ).one()
        pair = session.scalars(select(PreferencePair)).one()
        outcomes = sorted(
            event.value["reason"]
            for event in session.scalars(
                select(FeedbackEvent).where(FeedbackEvent.kind == "outcome")
            )
        )
    assert sft.completion.startswith("Hi ")
    assert "stale token" in sft.completion
    assert (pair.chosen, pair.group_key) == (sft.completion, "zendesk:5101")
    assert pair.rejected.startswith("Please disconnect and reconnect")
    assert outcomes == ["ticket escalated", "ticket reopened"]


def test_bad_exports_fail_with_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    binary = tmp_path / "export.json"
    binary.write_bytes(b"PK\x03\x04" + bytes(range(256)))
    cases = [
        ([str(FIXTURES / "zendesk_truncated.json"), "--format", "zendesk"], "ticket"),
        ([str(FIXTURES / "zendesk_tickets.json"), "--format", "freshdesk"], "freshdesk"),
        ([str(binary), "--format", "zendesk"], "export.json"),
        (
            [str(FIXTURES / "tickets.csv"), "--format", "csv", "--mapping", "id=Nope"],
            "no column for body",
        ),
    ]
    for args, message in cases:
        code, _, err = ingest(capsys, *args)
        assert code == 2, args
        assert message in err
        assert len(err.strip().splitlines()) == 1
    assert count_rows(on_test_database, "sft_examples") == 0


def zendesk_export(path: Path, tickets: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"tickets": tickets}), encoding="utf-8")
    return path


def test_a_ticket_read_again_replaces_what_it_yielded(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Ticket 4712 exported right after its first solve, then again once it was reopened and
    solved differently: the first answer stops being an SFT example (it is the rejected side
    of the pair now), and reading the early export again brings it back."""
    full = next(
        ticket
        for ticket in json.loads(TICKETS_JSON.read_text(encoding="utf-8"))["tickets"]
        if ticket["id"] == 4712
    )
    early = {
        **full,
        "comments": full["comments"][:2],
        "audits": [audit for audit in full["audits"] if audit["created_at"] <= "2024-03-05T10:30"],
    }
    early_path = zendesk_export(tmp_path / "early.json", [early])
    full_path = zendesk_export(tmp_path / "full.json", [full])

    assert ingest(capsys, str(early_path), "--format", "zendesk")[0] == 0
    code, _, err = ingest(capsys, str(full_path), "--format", "zendesk")
    assert code == 0, err

    with on_test_database() as session:
        examples = {row.completion: row.weight for row in session.scalars(select(SftExample))}
        pair = session.scalars(select(PreferencePair)).one()
    assert examples[pair.chosen] == 1.0
    assert examples[pair.rejected] == 0.0  # retracted, not deleted

    assert ingest(capsys, str(early_path), "--format", "zendesk")[0] == 0
    with on_test_database() as session:
        examples = {row.completion: row.weight for row in session.scalars(select(SftExample))}
        pair = session.scalars(select(PreferencePair)).one()
    assert examples[pair.rejected] == 1.0
    assert (examples[pair.chosen], pair.weight) == (0.0, 0.0)
    assert pair.why.startswith("retracted: ")


def test_one_export_into_two_domains_gives_each_its_own_feedback(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "domains", "create", "support", "--tenant", "acme")[0] == 0
    path = str(TICKETS_JSON)
    first = ingest(capsys, path, "--format", "zendesk")
    code, out, err = run_cli(
        capsys, "ingest", "tickets", path, "--format", "zendesk", "--domain", "support", "--json"
    )

    assert code == 0, err
    assert json.loads(out)["accepted"] == first[1]["accepted"]
    with on_test_database() as session:
        per_domain = Counter(session.scalars(select(FeedbackEvent.domain_id)))
    assert len(per_domain) == 2
    assert len(set(per_domain.values())) == 1
