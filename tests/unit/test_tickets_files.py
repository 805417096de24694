"""Bad ticket exports get a one-line InvalidInput naming the record, line or byte (never a
traceback); odd encodings are read or refused by rule; big exports stream in constant
memory."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from bench.ticket_corpus import write_zendesk_export
from flywheel.errors import InvalidInput
from flywheel.signals.candidates import Candidate, Provenance, SftCandidate
from ingest.framework import Ingestor, Rejected
from ingest.tickets import files, make_ticket_ingestor

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tickets"
ZENDESK = FIXTURES / "zendesk_tickets.json"


def convert_all(ingestor: Ingestor) -> list[list[Candidate] | str]:
    results: list[list[Candidate] | str] = []
    for record in ingestor.records():
        try:
            results.append(ingestor.convert(record))
        except Rejected as rejected:
            results.append(rejected.reason)
    return results


def read_error(source_format: str, path: Path, mapping: str | None = None) -> str:
    """The message of the InvalidInput that reading and converting every record raises."""
    with pytest.raises(InvalidInput) as error:
        convert_all(make_ticket_ingestor(source_format, path, mapping))
    assert "\n" not in error.value.message
    return error.value.message


def test_truncated_json_names_the_record_it_broke_in() -> None:
    path = FIXTURES / "zendesk_truncated.json"

    assert read_error("zendesk", path) == (
        f"{path}: truncated or malformed JSON in ticket #3 (after ticket 4712): "
        "parse error: premature EOF"
    )


def test_malformed_json_names_the_record_it_broke_in() -> None:
    path = FIXTURES / "zendesk_malformed.json"

    assert read_error("zendesk", path).startswith(
        f"{path}: truncated or malformed JSON in ticket #3 (after ticket 4712): parse error"
    )


def test_records_before_the_break_are_yielded_first() -> None:
    records = make_ticket_ingestor("zendesk", FIXTURES / "zendesk_truncated.json").records()

    assert [next(records).ref, next(records).ref] == [
        "zendesk_truncated.json ticket 4711 (#1)",
        "zendesk_truncated.json ticket 4712 (#2)",
    ]
    with pytest.raises(InvalidInput, match="ticket #3"):
        next(records)


def test_an_export_of_another_vendor_says_what_it_found() -> None:
    jira = FIXTURES / "jira_search_v3.json"
    github = FIXTURES / "github_issues.json"

    assert read_error("zendesk", jira) == (
        f'{jira}: no "tickets" array at the top level (its keys are expand, startAt, '
        "maxResults, total, issues); is --format right for this export?"
    )
    assert read_error("jira", github) == (
        f'{github}: a JSON array, where this export has {{"issues": [...]}}; '
        "is --format right for this export?"
    )


def test_an_empty_tickets_array_is_an_empty_export(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text('{"tickets": [], "count": 0}', encoding="utf-8")

    assert convert_all(make_ticket_ingestor("zendesk", path)) == []


def test_an_empty_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_bytes(b"  \n")

    assert read_error("zendesk", path) == f"{path}: the file is empty"


def test_a_bad_json_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tickets.jsonl"
    lines = (FIXTURES / "zendesk_tickets.jsonl").read_text(encoding="utf-8").splitlines()
    path.write_text(f"{lines[0]}\n\n{lines[1][:100]}\n", encoding="utf-8")

    assert read_error("zendesk", path).startswith(f"{path} line 3: not JSON (")


def test_a_record_of_the_wrong_shape_names_the_record_and_field(tmp_path: Path) -> None:
    path = tmp_path / "tickets.json"
    ticket = {"id": 1, "status": "solved", "comments": [{"id": 5, "public": "yes"}]}
    path.write_text(json.dumps({"tickets": [ticket, {"subject": "no id"}]}), encoding="utf-8")
    ingestor = make_ticket_ingestor("zendesk", path)
    first, second = ingestor.records()

    with pytest.raises(InvalidInput) as error:
        ingestor.convert(first)
    assert error.value.message == (
        "tickets.json ticket 1 (#1).comments[0].public must be true or false, not 'yes'"
    )
    with pytest.raises(InvalidInput, match=r"^tickets.json ticket \? \(#2\).id must be an id"):
        ingestor.convert(second)


def test_a_missing_file_is_invalid_input(tmp_path: Path) -> None:
    ingestor = make_ticket_ingestor("github", tmp_path / "nope.json")

    with pytest.raises(InvalidInput, match="no such file"):
        list(ingestor.records())
    with pytest.raises(InvalidInput, match=r"nope\.json"):
        ingestor.fingerprint()


# Encodings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff")],
)
def test_utf8_with_bom_and_utf16_with_bom_read_like_utf8(
    tmp_path: Path, encoding: str, bom: bytes
) -> None:
    path = tmp_path / "tickets.json"
    path.write_bytes(bom + ZENDESK.read_text(encoding="utf-8").encode(encoding))

    assert convert_all(make_ticket_ingestor("zendesk", path)) == convert_all(
        make_ticket_ingestor("zendesk", ZENDESK)
    )


def test_excel_unicode_text_csv_reads_like_utf8(tmp_path: Path) -> None:
    """Excel's "Unicode text" is UTF-16 LE with a BOM, tab-separated."""
    path = tmp_path / "tickets.txt"
    text = "id\tbody\tresolution\tstatus\r\nT-1\tÇa ne marche pas 😕\tRedémarrez.\tSolved\r\n"
    path.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))

    results = convert_all(make_ticket_ingestor("csv", path))

    problem = [{"role": "user", "content": "Ça ne marche pas 😕"}]
    provenance = Provenance("ticket", "csv:T-1", "csv:T-1", ())
    assert results == [[SftCandidate(provenance, problem, "Redémarrez.")]]


def test_a_legacy_code_page_is_refused_naming_line_and_byte(tmp_path: Path) -> None:
    json_path, csv_path = tmp_path / "tickets.json", tmp_path / "tickets.csv"
    json_path.write_bytes('{"tickets": [\n{"id": 1, "subject": "Grüße"}]}'.encode("latin-1"))
    csv_path.write_bytes("id,body,resolution\n1,ok,ok\n2,Grüße,ok\n".encode("cp1252"))

    assert read_error("zendesk", json_path) == (
        f"{json_path} line 2 (byte 38): not valid utf-8 (invalid start byte); "
        "save the export as UTF-8"
    )
    assert read_error("csv", csv_path) == (
        f"{csv_path} line 3 (byte 31): not valid UTF-8; save the export as UTF-8"
    )


def test_utf16_without_a_bom_is_taken_for_binary(tmp_path: Path) -> None:
    path = tmp_path / "tickets.json"
    path.write_bytes('{"tickets": []}'.encode("utf-16-le"))

    assert read_error("zendesk", path) == (
        f"{path}: binary data (a NUL byte at byte 1), not a text export; "
        "UTF-16 needs a byte-order mark"
    )


@pytest.mark.parametrize(
    ("head", "what"),
    [
        (b"\x89PNG\r\n\x1a\n", "a PNG image"),
        (b"PK\x03\x04", "a zip archive or an .xlsx workbook (export as CSV or JSON instead)"),
        (b"%PDF-1.7", "a PDF document"),
    ],
)
def test_binary_files_are_refused_saying_what_they_look_like(
    tmp_path: Path, head: bytes, what: str
) -> None:
    path = tmp_path / "export.csv"
    path.write_bytes(head + bytes(range(256)) * 4)

    assert read_error("csv", path) == f"{path}: this is {what}, not a ticket export"


def test_a_gzipped_export_is_read_decompressed(tmp_path: Path) -> None:
    path = tmp_path / "tickets.json.gz"
    path.write_bytes(gzip.compress(ZENDESK.read_bytes()))

    assert convert_all(make_ticket_ingestor("zendesk", path)) == convert_all(
        make_ticket_ingestor("zendesk", ZENDESK)
    )


def test_a_line_over_the_limit_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_LINE_BYTES", 64)
    path = tmp_path / "tickets.csv"
    path.write_text("id,body,resolution\n1," + "x" * 100 + ",ok\n", encoding="utf-8")

    assert read_error("csv", path) == f"{path} line 2: longer than 64 bytes"


# CSV structure ------------------------------------------------------------------------------


def test_a_truncated_csv_row_is_named(tmp_path: Path) -> None:
    path = FIXTURES / "tickets_truncated.csv"
    mapping = "id=Ticket ID,body=Description,resolution=Resolution"

    assert read_error("csv", path, mapping) == (
        f"{path} line 8: 5 fields, the header has 12 (a truncated row, or a quote left open)"
    )


def test_malformed_csv_quoting_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tickets.csv"
    path.write_text('id,body,resolution\n1,"ok" trailing,done\n', encoding="utf-8")

    assert read_error("csv", path).startswith(f"{path} line 2: malformed CSV (")


def test_an_empty_csv_says_it_has_no_header(tmp_path: Path) -> None:
    path = tmp_path / "tickets.csv"
    path.write_text("", encoding="utf-8")

    assert read_error("csv", path) == f"{path}: no header line (the file is empty)"


# Streaming ----------------------------------------------------------------------------------


def test_a_large_export_streams_in_constant_memory(tmp_path: Path) -> None:
    """Peak traced memory while reading 5,000 tickets stays a small fraction of the file:
    records are parsed one at a time, never the whole array. (Converting holds one record's
    thread at a time; the records are the part that could grow with the file.)"""
    path = tmp_path / "big.json"
    write_zendesk_export(path, 5_000, seed=1)
    records = make_ticket_ingestor("zendesk", path).records()

    tracemalloc.start()
    try:
        last = max(record.position for record in records)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert last == 4_999
    assert path.stat().st_size > 6_000_000
    assert peak_bytes < 1_500_000
