"""Surrogates instead of placeholders, the detectors added for free-text names, addresses,
dates of birth and national ids, what ordinary text keeps, and the redaction key."""

from __future__ import annotations

import datetime
import ipaddress
import re
import stat
from pathlib import Path

import pytest
from stdnum.in_ import aadhaar

from bench.redaction import CLEAN_SENTENCES
from flywheel.redaction import KINDS, Redaction, redact
from flywheel.redaction.checksums import iban_valid, is_card_number
from flywheel.redaction.keys import redaction_key, workspace_key
from flywheel.redaction.surrogates import _MAKERS, TEST_CARDS, Surrogates

KEY = b"unit-test-redaction-key-32-bytes"
PLACEHOLDER = re.compile(r"<(?:" + "|".join(KINDS) + r")>")


def surrogate(text: str, *, scope: str = "thread-1", key: bytes = KEY) -> Redaction:
    result = redact(text, scope=scope, key=key)
    assert PLACEHOLDER.search(result.text) is None, result.text
    return result


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi Maria Lopez, thanks for the logs.", "Hi <NAME>, thanks for the logs."),
        ("Hi Maria, could you retry?", "Hi <NAME>, could you retry?"),
        (
            "Dear Ms. Nowak, your refund is on its way.",
            "Dear Ms. <NAME>, your refund is on its way.",
        ),
        ("hello, my name is Thandeka Mensah and", "hello, my name is <NAME> and"),
        ("user: I'm Pedro, the admin.", "user: I'm <NAME>, the admin."),
        ("Kind regards,\nJames Whitfield", "Kind regards,\n<NAME>"),
        ("Thanks,\nRosa\n", "Thanks,\n<NAME>\n"),
        ("I spoke with Giulia Osei yesterday.", "I spoke with <NAME> yesterday."),
        ("Escalated to Dr. Camille Dubois.", "Escalated to Dr. <NAME>."),
        (
            "Hi Maria Lopez, as I said, Maria's case is open.",
            "Hi <NAME>, as I said, <NAME>'s case is open.",
        ),
        ("Ship to 1234 Elm Street, Springfield, IL 62704.", "Ship to <ADDRESS>."),
        ("at 221B Baker Street, London NW1 6XE now", "at <ADDRESS> now"),
        ("500 W 5th Ave, Suite 200, Austin, TX 78701", "<ADDRESS>"),
        ("Lieferung: Hauptstraße 5, 10115 Berlin", "Lieferung: <ADDRESS>"),
        ("chez 12 rue de la Paix", "chez <ADDRESS>"),
        ("en Calle Mayor 5, Madrid", "en <ADDRESS>, Madrid"),
        ("PO Box 4411", "<ADDRESS>"),
        ("DOB: 1985-03-12", "DOB: <DOB>"),
        ("date of birth 12/03/1985.", "date of birth <DOB>."),
        ("I was born on March 12, 1985 in Leeds", "I was born on <DOB> in Leeds"),
        ("Date of Birth: 3 June 1990", "Date of Birth: <DOB>"),
        ("NI number AB 12 34 56 C", "NI number <NI_NUMBER>"),
        ("nino=JG103759A;", "nino=<NI_NUMBER>;"),
        ("Aadhaar 2345 6789 0124", "Aadhaar <AADHAAR>"),
        ("my Aadhar number is 234567890124", "my Aadhar number is <AADHAAR>"),
        ("passport no. X1234567 expires", "passport no. <PASSPORT> expires"),
        ("Passport number: 533380006", "Passport number: <PASSPORT>"),
    ],
)
def test_the_new_detectors_find_what_they_document(text: str, expected: str) -> None:
    result = surrogate(text)
    assert result.typed == expected
    for start, end, _ in result.spans:
        assert text[start:end] not in result.text


ORDINARY = [
    *CLEAN_SENTENCES,
    "May I ask whether Will from sales can Grant Access to the Annual Report?",
    "Mark as read. Rose Garden Cafe opens at 9. Frank feedback is welcome.",
    "Hi team, Hi all, Hello World! Dear Customer, Thanks Support!",
    "We moved 3 Main points into the 12 Best Practices doc; 5 Things To Check.",
    "The release date is 2024-03-15 and CI was born in 2019; build of 12/03/2024.",
    "Order 482135792201 and invoice 2024-0042-7781 were paid; ref 2345 6789 0123.",
    "Passport photos are required; the passport office opens on Monday.",
    "Use Python 3.11 with Django and FastAPI; Apple Pay and Google Maps work.",
    "I am Happy with the result. This is Important. I'm Sorry for the delay.",
    "Regards,\nThe Billing Team",
    "Thanks,\nSupport",
    "Codes GB 12 34 56 A and QQ123456C are not NI numbers; AB123456E neither.",
    "We ship via the API in place of the CSV export; take the 3 main roads.",
    "Set PYTHONPATH and run Black on the main branch; see Section 4 of the Road Map.",
    "Contact Customer Success at the Help Center between 9 and 5.",
    "EXPORT FAILED FOR JANE DOE'S ACCOUNT",  # shouting is no naming (no names were given)
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text, key=KEY) == Redaction(text)


def first_name(result: Redaction) -> str:
    match = re.match(r"Hi (\w+)", result.text)
    assert match is not None, result.text
    return match.group(1)


def test_a_person_keeps_one_surrogate_within_a_record() -> None:
    greeting = surrogate("Hi Maria Lopez, welcome. Maria asked again. MARIA LOPEZ, in capitals.")
    first, last = greeting.text.split(",")[0].removeprefix("Hi ").split()
    assert greeting.text == (
        f"Hi {first} {last}, welcome. {first} asked again. {first.upper()} {last.upper()}, "
        "in capitals."
    )
    assert {first, last}.isdisjoint({"Maria", "Lopez"})
    # Another text of the same record: the same surrogate, also inside an e-mail address.
    mail = surrogate("Write to maria.lopez@acme.io, Maria Lopez.", scope="thread-1")
    assert mail.text.startswith(f"Write to {first.lower()}.{last.lower()}@example.")
    assert mail.text.endswith(f", {first} {last}.")


def test_the_same_person_in_other_records_is_not_linkable() -> None:
    surrogates = {first_name(surrogate("Hi Maria Lopez,", scope=f"t{n}")) for n in range(40)}
    assert len(surrogates) >= 10  # one surrogate per record, unrelated across records
    assert "Maria" not in surrogates


def test_surrogates_are_deterministic_and_depend_on_the_key() -> None:
    text = "Hi Maria Lopez, call (415) 555-0132 or write to maria.lopez@acme.io."
    assert surrogate(text) == surrogate(text)
    others = {surrogate(text, key=bytes([n]) * 32).text for n in range(10)}
    assert len(others) >= 8


@pytest.mark.parametrize("name", ["Hannah Keller", "Oliver Marsh", "Sofia Weiss", "Theo Mercer"])
def test_a_surrogate_is_never_the_original(name: str) -> None:
    """Even for names that are on the surrogate lists themselves."""
    for scope in range(30):
        stored = surrogate(f"Hi {name}, thanks", scope=str(scope)).text
        first, last = stored.removeprefix("Hi ").split(",")[0].split()
        assert first != name.split()[0]
        assert last != name.split()[1]


def test_a_phone_whose_first_draw_is_itself_gets_another() -> None:
    """A phone's draw is keyed on its digits, so a retry must draw anew, not rehash the same
    digits: search scopes for one whose first draw of a fictional number is that number."""
    phone = "(415) 555-0132"
    first_draw = _MAKERS["PHONE"]
    scope = next(
        str(n) for n in range(1_000_000) if first_draw(Surrogates(KEY, str(n)), phone) == phone
    )
    replaced = Surrogates(KEY, scope)("PHONE", phone)
    assert replaced != phone
    assert re.fullmatch(r"\(\d{3}\) 555-01\d\d", replaced), replaced
    assert Surrogates(KEY, scope)("PHONE", phone) == replaced  # still deterministic


def test_surrogates_keep_the_shape_of_what_they_replace() -> None:
    text = (
        "Hi Maria Lopez, <maria.lopez@acme.io>, (415) 555-0132, +44 20 7946 0958, "
        "card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00, from 8.8.4.4, "
        "SSN 078-05-1120, NI AB 12 34 56 C, Aadhaar 2345 6789 0124, DOB: 1985-03-12, "
        "at 1234 Elm Street"
    )
    stored = surrogate(text).text
    first, last = re.match(r"Hi (\w+) (\w+),", stored).groups()  # type: ignore[union-attr]
    assert f"<{first.lower()}.{last.lower()}@example." in stored  # the same person's address
    assert re.search(r"\(\d{3}\) 555-01\d\d,", stored)  # North America's fictional range
    assert re.search(r"\+44 \d\d \d{4} \d{4},", stored)
    card = re.search(r"card ([\d ]{19}),", stored).group(1)  # type: ignore[union-attr]
    assert is_card_number(card.replace(" ", ""))
    assert card != "4111 1111 1111 1111"
    iban = re.search(r"IBAN (DE[\d ]{25}),", stored).group(1)  # type: ignore[union-attr]
    assert iban_valid(iban.replace(" ", ""))
    address = re.search(r"from ([\d.]+),", stored).group(1)  # type: ignore[union-attr]
    assert ipaddress.ip_address(address) in ipaddress.ip_network("192.0.0.0/2")  # RFC 5737
    assert re.search(r"SSN 987-65-432\d,", stored)
    assert re.search(r"NI QQ \d\d \d\d \d\d [A-D],", stored)
    number = re.search(r"Aadhaar ([\d ]{14}),", stored).group(1)  # type: ignore[union-attr]
    assert aadhaar.is_valid(number.replace(" ", ""))
    assert number != "2345 6789 0124"
    born = re.search(r"DOB: (\S+),", stored).group(1)  # type: ignore[union-attr]
    assert datetime.date.fromisoformat(born) != datetime.date(1985, 3, 12)
    assert re.search(r"at \d{4} [A-Z][a-z]+ Street$", stored)


def test_the_workspace_key_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "home" / "redaction.key"
    key = workspace_key(path)
    assert len(key) == 32
    assert workspace_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_configured_key_wins_over_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("FLYWHEEL_REDACTION_KEY", raising=False)
    from_workspace = redaction_key()
    assert from_workspace == workspace_key(tmp_path / "redaction.key")
    monkeypatch.setenv("FLYWHEEL_REDACTION_KEY", "a shared secret")
    configured = redaction_key()
    assert configured != from_workspace
    text = "Hi Maria Lopez,"
    assert redact(text).text == redact(text, key=configured).text


def test_card_surrogates_are_published_test_numbers_that_look_real() -> None:
    cards = [card for pool in TEST_CARDS.values() for card in pool]
    assert all(is_card_number(card) for card in cards)
    assert all(len(card) == length for length, pool in TEST_CARDS.items() for card in pool)
