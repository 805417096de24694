"""The redaction engine: checksums, each detector, what must survive, names, overlaps, the
planted corpus's per-type recall and precision, and `flywheel redact`."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from flywheel.cli import main
from flywheel.redaction import KINDS, Redaction, Span, redact
from flywheel.redaction.checksums import (
    iban_check_digits,
    iban_valid,
    is_card_number,
    luhn_complete,
    luhn_valid,
)
from tests.fixtures.redaction_corpus import PLANTED_KINDS, build_corpus, code_snippets, score

KEY = b"unit-test-redaction-key-32-bytes"
PLACEHOLDER = re.compile(r"<(?:" + "|".join(KINDS) + r")>")


def assert_surrogates_only(text: str, result: Redaction) -> None:
    """No placeholder in the stored text, and none of the values that were found."""
    assert PLACEHOLDER.search(result.text) is None, result.text
    for start, end, kind in result.spans:
        value = text[start:end]
        word = re.compile(rf"(?<![^\W_]){re.escape(value)}(?![^\W_])")
        assert word.search(result.text) is None, (kind, value, result.text)


@pytest.mark.parametrize(
    ("digits", "valid"),
    [
        ("4111111111111111", True),
        ("4111111111111112", False),
        ("378282246310005", True),
        ("6011000990139424", True),
        ("79927398713", True),
        ("79927398710", False),
    ],
)
def test_luhn(digits: str, valid: bool) -> None:
    assert luhn_valid(digits) is valid


def test_luhn_complete_appends_the_one_check_digit_that_fits() -> None:
    assert luhn_complete("411111111111111") == "4111111111111111"


@pytest.mark.parametrize(
    ("digits", "is_card"),
    [
        ("4111111111111111", True),
        ("5555555555554444", True),
        (luhn_complete("170000000000"), False),  # a millisecond timestamp: no network starts with 1
        (luhn_complete("911111111111111"), False),  # 9 is no issuer prefix either
        (luhn_complete("41111111111"), False),  # too short
    ],
)
def test_card_numbers_need_a_network_prefix_as_well_as_luhn(digits: str, is_card: bool) -> None:
    assert luhn_valid(digits)
    assert is_card_number(digits) is is_card


@pytest.mark.parametrize(
    ("iban", "valid"),
    [
        ("DE89370400440532013000", True),
        ("GB82WEST12345698765432", True),
        ("NL91ABNA0417164300", True),
        ("DE89370400440532013001", False),  # one digit off: mod 97 fails
        ("DE8937040044053201300", False),  # Germany's IBANs have 22 characters
        ("ZZ89370400440532013000", False),  # not an IBAN country
    ],
)
def test_iban_mod97_and_length(iban: str, valid: bool) -> None:
    assert iban_valid(iban) is valid


def test_iban_check_digits_make_a_valid_iban() -> None:
    assert iban_check_digits("DE", "370400440532013000") == "89"
    assert iban_valid(
        "FR" + iban_check_digits("FR", "20041010050500013M02606") + "20041010050500013M02606"
    )


JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwi"
    "aWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq3oQ8d0p1a2b3c4d5e6f7g8h9i0jklmnop\n"
    "qrstuvwxyz0123456789ABCDEFGHIJ+/abcdefgh==\n-----END RSA PRIVATE KEY-----"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail jane.doe+billing@eu.acme.co.uk now", "mail <EMAIL> now"),
        ("Zoë <zoë.müller@beispiel.de>", "Zoë <<EMAIL>>"),
        ("call (415) 555-0132 or +1 415.555.0132", "call <PHONE> or <PHONE>"),
        (
            "UK +44 20 7946 0958, 020 7946 0958, FR 01 23 45 67 89",
            "UK <PHONE>, <PHONE>, FR <PHONE>",
        ),
        ("card 4111 1111 1111 1111, amex 3782-822463-10005.", "card <CARD>, amex <CARD>."),
        ("IBAN DE89 3704 0044 0532 0130 00 BIC COBADEFFXXX", "IBAN <IBAN> BIC COBADEFFXXX"),
        ("iban gb82west12345698765432", "iban <IBAN>"),
        (
            "SSN 078-05-1120; social security number 078051120",
            "SSN <SSN>; social security number <SSN>",
        ),
        ("from 203.0.113.7 and [2001:db8::8a2e:370:7334]:443", "from <IP> and [<IP>]:443"),
        ("key AKIAIOSFODNN7EXAMPLE ok", "key <SECRET> ok"),
        ("GITHUB_TOKEN=ghp_16C7e42F292c6912E7710c838347Ae178B4a", "GITHUB_TOKEN=<SECRET>"),
        ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "<SECRET>"),
        ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe <SECRET>"),
        (f"Authorization: Bearer {JWT}.", "Authorization: Bearer <SECRET>."),
        (f"key:\n{PRIVATE_KEY}\nthanks", "key:\n<SECRET>\nthanks"),
        (
            "postgres://admin:s3cr3t@db.internal:5432/app",
            "postgres://<SECRET>@db.internal:5432/app",
        ),
        ('{"password": "Tr0ub4dor&3"}', '{"password": "<SECRET>"}'),
        (
            "DB_PASSWORD=hunter22 and my password is Summer2024",
            "DB_PASSWORD=<SECRET> and my password is <SECRET>",
        ),
        ("api_key: a8Fj29dKqLzX0pQ7wE3rT5yU", "api_key: <SECRET>"),
        ("secret_key = 'django-insecure-7x!k2@9#m$l&q^w*e(r)t_y+u'", "secret_key = '<SECRET>'"),
    ],
)
def test_each_detector_replaces_what_it_finds(text: str, expected: str) -> None:
    result = redact(text, key=KEY)
    assert result.typed == expected
    assert_surrogates_only(text, result)


@pytest.mark.parametrize(
    "code",
    [
        "brew install python@2.7; npm i lodash@4.17.21",
        "numpy==1.26.4 and v2.3.1-rc1, release 2024.03.15",
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "request_id = '3f2c1a9e-8b7d-4c6e-9f0a-1b2c3d4e5f60'",
        "user_id, AWSRegion, email_field, password_hash, max_tokens=4096",
        "listen 127.0.0.1:8080; bind 0.0.0.0; mask 255.255.255.0; curl http://[::1]:8000",
        "version 1.2.3.4; __version__ = '3.5.0.1'",
        "timestamp 1700000000000, order 2024-0042-7781, ISBN 978-3-16-148410-0",
        "started at 12:30:45; mac 00:1A:2B:3C:4D:5E; x[1::2]; std::vector",
        "git@github.com:acme/flywheel.git",
        'password = os.environ["DB_PASSWORD"]; url = f"postgresql://{user}:{password}@{host}/db"',
        "DB_PASSWORD: ${DB_PASSWORD}; api_key = settings.api_key; password: Optional[SecretStr]",
        "if password == confirm_password: tokenizer = 'bert-base-uncased'",
    ],
)
def test_code_comes_through_unchanged(code: str) -> None:
    assert redact(code) == Redaction(code)


def test_loopback_stays_and_other_addresses_go() -> None:
    """The documented IP rule: loopback, unspecified, multicast and reserved IPv4 (netmasks,
    broadcast) identify no host; private and public addresses do."""
    text = "127.0.0.1 ::1 0.0.0.0 224.0.0.1 255.255.255.255 10.1.2.3 192.168.0.10 8.8.8.8"
    assert redact(text).typed == "127.0.0.1 ::1 0.0.0.0 224.0.0.1 255.255.255.255 <IP> <IP> <IP>"


def test_only_the_value_of_a_secret_assignment_goes() -> None:
    result = redact("export OPENAI_API_KEY=Zx81kQp02LmNv7Rt5YwE3s")
    assert result.typed == "export OPENAI_API_KEY=<SECRET>"
    assert result.counts == {"SECRET": 1}


@pytest.mark.parametrize(
    ("text", "names", "expected"),
    [
        (
            "Thanks Jane Doe! Jane will call. Doe's case.",
            ["Jane Doe"],
            "Thanks <NAME>! <NAME> will call. <NAME>'s case.",
        ),
        (
            "Ann approved the Annual plan; ANN signed.",
            ["Ann Lee"],
            "<NAME> approved the Annual plan; <NAME> signed.",
        ),
        (
            "Zoë Müller and Łukasz Wójcik replied",
            ["Zoë Müller", "Łukasz Wójcik"],
            "<NAME> and <NAME> replied",
        ),
        ("ZOË MÜLLER wrote", ["Zoë Müller"], "<NAME> wrote"),
        ("感谢王芳的帮助", ["王芳"], "感谢<NAME>的帮助"),
        ("Will said we will fix it", ["Will Turner"], "<NAME> said we will fix it"),
        ("ping jdoe or Jdoe", ["jdoe"], "ping <NAME> or <NAME>"),
        ("Dr. Jane Doe", ["Dr. Jane Doe"], "Dr. <NAME>"),
        (
            "Janet and Doehring are other people",
            ["Jane Doe"],
            "Janet and Doehring are other people",
        ),
        ("Ludwig van Beethoven: the van left", ["Ludwig van Beethoven"], "<NAME>: the van left"),
        ("İstanbul office: Jane wrote", ["Jane Doe"], "İstanbul office: <NAME> wrote"),
        ("İlkay Gündoğan and İLKAY", ["İlkay Gündoğan"], "<NAME> and <NAME>"),
    ],
)
def test_known_names_are_redacted_as_whole_words(
    text: str, names: list[str], expected: str
) -> None:
    result = redact(text, names=names, key=KEY)
    assert result.typed == expected
    assert_surrogates_only(text, result)


def test_a_name_nobody_gave_and_nothing_marks_as_one_stays() -> None:
    """Free-text names need context or faker's lists: "Haruto Bianchi" (a first name it does
    not know) in plain prose is not found; "Jane Doe" is."""
    assert redact("Haruto Bianchi wrote").typed == "Haruto Bianchi wrote"
    assert redact("Jane Doe wrote").typed == "<NAME> wrote"


def test_credentials_in_a_url_win_over_the_email_inside_them() -> None:
    result = redact("ftp://anonymous:guest1@ftp.example.org/pub")
    assert result.typed == "ftp://<SECRET>@ftp.example.org/pub"
    assert result.counts == {"SECRET": 1}


def test_an_iban_wins_over_the_card_number_inside_it() -> None:
    # "4146 3859 7173 8085" inside this IBAN is Luhn-valid with a Visa prefix.
    iban = "PL" + iban_check_digits("PL", "114146385971738085391725") + "114146385971738085391725"
    assert is_card_number("4146385971738085")
    assert redact(f"pay to {iban}").typed == "pay to <IBAN>"


def test_the_report_counts_per_type_and_keeps_offsets_not_values() -> None:
    text = "a@b.io, c@d.io and 4111111111111111"
    result = redact(text)
    assert result.typed == "<EMAIL>, <EMAIL> and <CARD>"
    assert result.counts == {"EMAIL": 2, "CARD": 1}
    assert result.spans == (Span(0, 6, "EMAIL"), Span(8, 14, "EMAIL"), Span(19, 35, "CARD"))
    report = result.report()
    assert report["total"] == 3
    assert report["counts"] == {"EMAIL": 2, "CARD": 1}
    assert "a@b.io" not in json.dumps(report)
    assert result.text[:-16] not in json.dumps(report)  # nor the surrogates


def test_text_without_pii_is_returned_as_is() -> None:
    text = "The export failed after upgrading to 2.4.1 on 2024-03-15; retry did nothing."
    assert redact(text, names=["Jane Doe"]) == Redaction(text)


def test_a_long_text_with_many_finds_is_redacted_completely() -> None:
    text = " ".join(f"Jane <jane{i}@acme.io>, 10.0.{i % 256}.{i // 256 + 1};" for i in range(3000))
    result = redact(text, names=["Jane Doe"])
    assert result.counts == {"NAME": 3000, "EMAIL": 3000, "IP": 3000}
    assert result.typed.count("<NAME> <<EMAIL>>, <IP>;") == 3000
    assert "Jane" not in result.text
    assert "acme.io" not in result.text


def test_placeholders_themselves_are_left_alone() -> None:
    text = "Jane <jane@acme.io>, +1 415 555 0132, token=ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    typed = redact(text, names=["Jane"]).typed
    assert redact(typed, names=["Jane"]) == Redaction(typed)


def test_the_corpus_is_deterministic_and_large_enough() -> None:
    corpus = build_corpus()
    assert corpus == build_corpus()
    assert set(PLANTED_KINDS) == {*KINDS, "NAME_FREE"}
    per_kind = {
        kind: sum(p.label == kind for s in corpus for p in s.planted) for kind in PLANTED_KINDS
    }
    assert sum(per_kind.values()) >= 1000
    assert min(per_kind.values()) >= 40, per_kind


def test_recall_and_precision_per_type_on_the_planted_corpus() -> None:
    scores = score(build_corpus(), code_snippets(), lambda text, names: redact(text, names=names))
    for kind, result in scores.items():
        floor = 0.95 if kind == "NAME_FREE" else 0.97  # free text: context or faker's lists
        assert result.recall >= floor, (kind, result.recall, result.misses[:10])
        assert result.precision >= 0.9, (kind, result.precision, result.false_positives[:10])


def test_code_snippets_come_through_byte_for_byte() -> None:
    changed = [snippet for snippet in code_snippets() if redact(snippet).text != snippet]
    assert changed == []


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["redact", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_redacts_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ticket.txt"
    path.write_text("Hi Jane Doe, reach me at jane@acme.io\n", encoding="utf-8")

    code, out, err = run_cli(capsys, str(path), "--name", "Jane Doe")

    assert code == 0
    greeting = re.fullmatch(r"Hi (\w+) \w+, reach me at \1@(\w+\.)*example\.\w+\n", out, re.I)
    assert greeting is not None, out  # the surrogate name, and the address made of it
    assert "Jane" not in out
    assert "acme" not in out
    assert err == "redacted 2: EMAIL 1, NAME 1\n"


def test_cli_reads_stdin_and_prints_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"card 4111 1111 1111 1111\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)

    code, out, err = run_cli(capsys, "-", "--json")

    assert code == 0
    assert err == ""
    document = json.loads(out)
    card = document["text"].removeprefix("card ").removesuffix("\n")
    assert card != "4111 1111 1111 1111"
    assert is_card_number(card.replace(" ", ""))
    assert document["report"] == {
        "total": 1,
        "counts": {"CARD": 1},
        "spans": [{"type": "CARD", "start": 5, "end": 24}],
    }


def test_cli_missing_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, str(tmp_path / "missing.txt"))

    assert code == 2
    assert out == ""
    assert err.startswith("error: cannot read ")
    assert err.count("\n") == 1


def test_cli_refuses_bytes_that_are_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café".encode("latin-1"))

    code, _, err = run_cli(capsys, str(path))

    assert code == 2
    assert err.startswith("error: cannot read ")
    assert "not UTF-8" in err
