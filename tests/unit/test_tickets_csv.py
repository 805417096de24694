"""CSV ticket exports through a column mapping: the rows' candidates, the mapping syntax
and the errors for mappings and cells that do not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.errors import InvalidInput
from flywheel.signals.candidates import InteractionCandidate, PairCandidate, SftCandidate
from ingest.tickets import make_ticket_ingestor, parse_mapping
from ingest.tickets.convert import REOPENED_WHY
from tests.unit.test_tickets import (
    CSV_MAPPING,
    FIXTURES,
    comment,
    convert_all,
    escalated,
    rating,
    reopened,
    ticket,
    user,
)

ADMIN_PROBLEM = user(
    "Can't add a second admin\n\nHello,\n\nWhen I invite a colleague as admin the button is "
    "greyed out."
)
ADMIN_ANSWER = (
    "Your plan allows one admin. Upgrade to Team in Settings > Billing to add more admins, or "
    "give your colleague the Manager role, which can do everything except billing."
)
EXPORT_CSV_PROBLEM = user(
    'Export "Q2, final" is empty\n\nThe export named "Q2, final" downloads as an empty file.\n'
    "It worked last week."
)
EXPORT_CSV_FINAL = (
    'Exports over 50 MB were cut off by a proxy timeout. We raised the limit; your "Q2, final" '
    "export now downloads in full."
)
CHARGE_PROBLEM = user(
    "Charged after cancelling\n\nI cancelled on June 3rd but was charged on July 1st. Call me at "
    "+1 (555) 010-0199."
)
CHARGE_FINAL = (
    "We found the cancellation did not go through because of a payment-provider outage. We "
    "refunded the July charge in full."
)


def test_csv_export_with_a_mapping_gives_the_promised_candidates_per_row() -> None:
    results = convert_all(make_ticket_ingestor("csv", FIXTURES / "tickets.csv", CSV_MAPPING))

    admin, export, charge = "csv:T-1001", "csv:T-1002", "csv:T-1004"
    admin_names = ("Łukasz Nowak", "Sofia Rossi")
    export_names = ("Amara Okafor", "Sofia Rossi")
    charge_names = ("Dmitri Ivanov", "Sofia Rossi")
    assert results == [
        [  # HTML body made text, sign-off dropped; CSAT 5 on a 1-5 scale
            SftCandidate(ticket(admin, admin_names), ADMIN_PROBLEM, ADMIN_ANSWER),
            InteractionCandidate(
                comment(admin, "resolution", admin_names),
                ADMIN_PROBLEM,
                ADMIN_ANSWER,
                (rating(admin, {"stars": 5}),),
            ),
        ],
        [  # reopened with a first response: a pair; "Sent from my iPad" dropped
            SftCandidate(ticket(export, export_names), EXPORT_CSV_PROBLEM, EXPORT_CSV_FINAL),
            PairCandidate(
                ticket(export, export_names),
                EXPORT_CSV_PROBLEM,
                EXPORT_CSV_FINAL,
                "Please try another browser.",
                REOPENED_WHY,
            ),
            InteractionCandidate(
                comment(export, "first_resolution", export_names),
                EXPORT_CSV_PROBLEM,
                "Please try another browser.",
                (reopened(export),),
            ),
        ],
        "unresolved",
        [  # escalated and rated bad: no SFT, both answers judged
            InteractionCandidate(
                comment(charge, "first_resolution", charge_names),
                CHARGE_PROBLEM,
                "Charges can't be reversed after 14 days.",
                (escalated(charge),),
            ),
            InteractionCandidate(
                comment(charge, "resolution", charge_names),
                CHARGE_PROBLEM,
                CHARGE_FINAL,
                (rating(charge, {"thumbs": "down"}),),
            ),
        ],
    ]


def test_csv_mapping_syntax_and_its_errors() -> None:
    assert parse_mapping("id=Ticket ID, body = Description ,resolution=Resolution,") == {
        "id": "Ticket ID",
        "body": "Description",
        "resolution": "Resolution",
    }
    with pytest.raises(InvalidInput, match=r"unknown field 'urgency' \(known: id, body"):
        parse_mapping("id=ID,body=Body,resolution=Res,urgency=Prio")
    with pytest.raises(InvalidInput, match="no column for resolution"):
        parse_mapping("id=ID,body=Body")
    with pytest.raises(InvalidInput, match="'body Body' is not field=Column"):
        parse_mapping("id=ID,body Body,resolution=Res")
    with pytest.raises(InvalidInput, match="'id' is mapped twice"):
        parse_mapping("id=ID,id=Other,body=Body,resolution=Res")


def test_csv_mapping_naming_a_column_the_file_lacks_lists_the_header() -> None:
    ingestor = make_ticket_ingestor(
        "csv", FIXTURES / "tickets.csv", "id=Ticket ID,body=Body Text,resolution=Resolution"
    )

    with pytest.raises(InvalidInput) as error:
        list(ingestor.records())

    assert "no column 'Body Text' (for body)" in error.value.message
    assert "the header has: Ticket ID, Subject, Description, First Response" in error.value.message


def test_csv_without_a_mapping_expects_columns_named_after_the_fields(tmp_path: Path) -> None:
    export = tmp_path / "tickets.tsv"
    export.write_text(
        "id\tbody\tresolution\n7\tMy printer is on fire.\tUnplug it first.\n", encoding="utf-8"
    )

    results = convert_all(make_ticket_ingestor("csv", export))

    problem, answer = user("My printer is on fire."), "Unplug it first."
    assert results == [[SftCandidate(ticket("csv:7", ()), problem, answer)]]


def test_csv_cell_values_that_mean_nothing_name_the_row(tmp_path: Path) -> None:
    export = tmp_path / "tickets.csv"
    export.write_text("id,body,resolution,satisfaction\n7,Help,Done,meh\n", encoding="utf-8")
    ingestor = make_ticket_ingestor("csv", export)
    record = next(ingestor.records())

    with pytest.raises(InvalidInput, match=r"ticket 7 \(line 2\): satisfaction 'meh' is not"):
        ingestor.convert(record)
