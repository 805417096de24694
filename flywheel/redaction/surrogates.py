"""Realistic stand-ins for what redaction removes, so that no training text teaches a model to
write `<NAME>`.

Each surrogate is drawn from an HMAC-SHA256 of the original value, keyed by the deployment's
redaction key (`keys`) and the record it belongs to (`scope`: a ticket thread, a
conversation). So the same person is the same surrogate everywhere in a record, the same text
always becomes the same stored text (content hashes stay stable), the same person in two
records gets unrelated surrogates, and without the key a surrogate says nothing about the
value. A surrogate is never the original value.

Names are replaced word by word ("Maria Lopez" -> "Hannah Keller", then "Maria" -> "Hannah"
and "MARIA" -> "HANNAH"), a first name by a first name and a surname by a surname. E-mail
addresses keep their shape on reserved domains (example.com, RFC 2606), their name parts
mapped like names. Phone numbers keep their country code and grouping (North American ones
go to the fictional 555-01xx range of some area). Addresses keep their street type and
shape. Cards become the networks' published test numbers, IPs documentation addresses
(RFC 5737, RFC 3849), SSNs the advertising range 987-65-432x, NI numbers the QQ prefix HMRC
uses in examples. Everything else keeps its shape with other letters and digits.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from stdnum import verhoeff

from flywheel.redaction.checksums import iban_check_digits
from flywheel.redaction.people import first_name_words


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _names(text: str) -> list[str]:
    return text.split()


FIRST_NAMES = _names(
    "Hannah Oliver Amara Lucas Sofia Mateus Elena Jonas Leila Tomas Nadia Felix Clara Rohan "
    "Ines Kofi Maya Luca Anika Daniel Farah Milo Greta Arjun Lena Marco Alina Samuel Irene "
    "Theo Zara Pablo Freya Omar Julia Nikolai Emma Hugo Selin Adrian Noor Victor Ayla Emil "
    "Lucia Rafael Mira Henrik Chloe Idris Paula Stefan Yara Leon Carmen Tobias Amira Simon "
    "Ruth Anton Keiko Martin Dalia Oskar Nina Elias Sara Bruno Esme Karim Olga Jasper Talia"
)
LAST_NAMES = _names(
    "Keller Marsh Adeyemi Lindgren Moreau Castillo Varga Brennan Novak Holm Serrano Fischer "
    "Dalton Kaur Ribeiro Okonkwo Sato Whitaker Jansen Petrova Quinn Haddad Larsen Fontaine "
    "Mendez Blake Horvat Ferreira Nyberg Osei Rinaldi Sandoval Thorne Weiss Aguilar Baxter "
    "Kowalczyk Lambert Morales Nakagawa Olsen Pereira Rahman Schultz Toivonen Vance Yilmaz "
    "Abbott Bianchi Carver Duarte Ellis Gallagher Hartley Ibsen Jovanovic Kimura Laine Mercer"
)
CJK_NAMES = ("李明", "张伟", "王静", "刘洋", "陈晨", "杨帆", "赵磊", "黄丽", "周杰", "吴敏")
STREETS = _names(
    "Maple Cedar Willow Juniper Alder Linden Hawthorn Rowan Birch Chestnut Laurel Aspen "
    "Magnolia Sycamore Elmwood Foxglove Heather Meadow Orchard Riverside Harbour Kingfisher"
)
TOWNS = _names(
    "Ashford Brookfield Fairview Glenwood Harrow Kingsbridge Lakeside Milton Northwood "
    "Oakridge Pinehurst Redfield Stonebridge Westbury Yarrow Millbrook Easton Highbury"
)
EMAIL_DOMAINS = ("example.com", "example.org", "example.net", "mail.example.com")
TEST_CARDS: dict[int, tuple[str, ...]] = {
    13: ("4222222222222",),
    14: ("36227206271667", "30569309025904"),
    15: ("378282246310005", "371449635398431", "378734493671000"),
    16: (
        *("4242424242424242", "4000056655665556", "5555555555554444", "2223003122003222"),
        *("5200828282828210", "5105105105105100", "6011111111111117", "6011000990139424"),
        *("3566002020360505", "6200000000000005", "4000002500003155", "4000000760000002"),
    ),
    19: ("6205500000000000004", "4000000000000000006"),
}
_KEEP_WORDS = _words(
    """street st avenue ave road rd boulevard blvd lane ln drive dr court ct way place pl
    terrace ter circle cir highway hwy parkway pkwy square sq close crescent cres row mews
    gardens grove walk trail alley plaza broadway park rise hill green parade wharf quay
    apt apartment suite ste unit flat floor fl room rm po p.o box n s e w ne nw se sw north
    south east west rue avenue boulevard bd place allée impasse chemin quai calle c/ avenida
    av. plaza paseo carrer rua via viale piazza corso largo de du des la le l' del della di
    da do dos das am an der im in auf zum zur bis ter"""
)
T = TypeVar("T")
_DIGITS = "0123456789"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_MONTHS_FULL = _names(
    "January February March April May June July August September October November December"
)
_GERMAN_STREET = re.compile(r"(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer)$")
_NAME_PART = re.compile(r"[^\W\d_]+|\d+|[\W_]+")
_WORDS = re.compile(r"[^\W\d_][\w'\u2019.\-]*|\d+|[^\w]+|_")
_UNSPACED = re.compile("[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]")


class Surrogates:
    """Surrogates for one record: `key` is the deployment's redaction key, `scope` the record
    (thread, conversation) within which a value keeps its surrogate."""

    __slots__ = ("key", "scope")

    def __init__(self, key: bytes, scope: str) -> None:
        self.key = key
        self.scope = scope.encode()

    def rng(self, kind: str, value: str) -> Draws:
        digest = hmac.new(
            self.key, b"\x1f".join((self.scope, kind.encode(), value.encode())), hashlib.sha256
        ).digest()
        return Draws(digest)

    def noise(self, kind: str, value: str, size: int) -> bytes:
        """`size` keyed bytes for `value`."""
        seed = self.rng(kind, value).seed
        return hashlib.shake_256(seed).digest(size)

    def __call__(self, kind: str, value: str) -> str:
        """The surrogate for `value`, found as `kind`; never `value` itself."""
        make = _MAKERS.get(kind, _shape)
        surrogate = make(self, value)
        for attempt in range(1, 4):
            if surrogate.casefold() != value.casefold():
                break
            # A draw of its own: the makers key on parts of the value (a phone's digits), so
            # a changed value would draw the same surrogate again; a changed scope does not.
            again = Surrogates(self.key, f"{self.scope.decode()}\x00{attempt}")
            surrogate = make(again, value)
        return surrogate

    def name_word(self, word: str) -> str:
        """One word of a name: a first name for a word that is a first name more than a
        surname (`people.first_name_words`), a surname otherwise; in the same case."""
        folded = word.casefold()
        pool = FIRST_NAMES if folded in first_name_words() else LAST_NAMES
        choice = self.rng("NAME", folded).choice(pool)
        if choice.casefold() == folded:
            choice = pool[(pool.index(choice) + 1) % len(pool)]
        return _same_case(word, choice)


class Draws:
    """Numbers drawn from an HMAC digest, four bytes each (then from SHA-256 of the digest and
    a counter): `Draws`'s interface, at a fraction of the cost of seeding one."""

    __slots__ = ("_counter", "_left", "seed")

    def __init__(self, seed: bytes) -> None:
        self.seed = seed
        self._left = seed
        self._counter = 0

    def _next(self) -> int:
        if len(self._left) < 4:
            self._counter += 1
            self._left = hashlib.sha256(self.seed + self._counter.to_bytes(4, "big")).digest()
        value = int.from_bytes(self._left[:4], "big")
        self._left = self._left[4:]
        return value

    def randrange(self, stop: int) -> int:
        return self._next() % stop

    def randint(self, low: int, high: int) -> int:
        return low + self._next() % (high - low + 1)

    def choice(self, options: Sequence[T]) -> T:
        return options[self._next() % len(options)]


def _same_case(original: str, replacement: str) -> str:
    if original.isupper() and len(original) > 1:
        return replacement.upper()
    if original.islower():
        return replacement.lower()
    return replacement


def _name(surrogates: Surrogates, value: str) -> str:
    if _UNSPACED.search(value) is not None:
        return surrogates.rng("NAME", value).choice(CJK_NAMES)
    return "".join(
        surrogates.name_word(part) if part[0].isalpha() and len(part) > 1 else part
        for part in _NAME_PART.findall(value)
    )


def _email(surrogates: Surrogates, value: str) -> str:
    local, _, domain = value.rpartition("@")
    parts = []
    for part in _NAME_PART.findall(local):
        if part[0].isalpha():
            parts.append(surrogates.name_word(part).lower() if len(part) > 1 else "x")
        elif part.isdigit():
            parts.append(_digits(surrogates.rng("EMAIL", part), len(part)))
        else:
            parts.append(part)
    return "".join(parts) + "@" + surrogates.rng("EMAIL", domain.lower()).choice(EMAIL_DOMAINS)


def _phone(surrogates: Surrogates, value: str) -> str:
    digits = [char for char in value if char.isdigit()]
    rng = surrogates.rng("PHONE", "".join(digits))
    keep = _phone_prefix_digits(value)
    national = digits[keep:]
    north_american = len(national) == 10 and (
        digits[:keep] == ["1"] or (keep == 0 and not value.startswith(("+", "0")))
    )
    if north_american:  # 555-0100 to 555-0199 are fictional, in any area
        area = f"{rng.randint(2, 9)}{rng.randint(0, 8)}{rng.randint(0, 9)}"
        national = [*area, *"55501", *_digits(rng, 2)]
    elif national:  # the first digit (a trunk 0, a mobile 7) stays
        national = [national[0], *_digits(rng, len(national) - 1)]
    replaced = iter(digits[:keep] + national)
    return "".join(next(replaced) if char.isdigit() else char for char in value)


def _phone_prefix_digits(value: str) -> int:
    """Digits kept as they are: a `+country code` (up to its first separator), or the `1`
    before a North American number."""
    stripped = value.lstrip("(")
    if stripped.startswith("+"):
        code = re.match(r"\+(\d{1,3})", stripped)
        return len(code.group(1)) if code else 0
    return 1 if re.match(r"1[ .\-]", stripped) else 0


def _digits(rng: Draws, count: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(count))


def _address(surrogates: Surrogates, value: str) -> str:
    out = []
    named = street_done = False
    for word in _WORDS.findall(value):
        folded = word.casefold().rstrip(".")
        if word.isdigit():
            first = "123456789"[surrogates.rng("ADDRESS", word).randrange(9)]
            out.append(first + _digits(surrogates.rng("ADDRESS", word + "#"), len(word) - 1))
        elif not word[0].isalpha() or folded in _KEEP_WORDS or (len(word) == 2 and word.isupper()):
            out.append(word)  # street types, particles, state codes
            street_done = street_done or (named and word[0].isalpha())
        elif any(char.isdigit() for char in word):
            out.append(_shape(surrogates, word))  # postcodes, house numbers such as 221B
        else:
            out.append(_place_word(surrogates, word, TOWNS if street_done else STREETS))
            named = True
    return "".join(out)


def _place_word(surrogates: Surrogates, word: str, pool: list[str]) -> str:
    """A street or town name for `word`; a German street keeps its type ("...straße")."""
    suffix = _GERMAN_STREET.search(word)
    stem = word[: suffix.start()] if suffix else word
    choice = _same_case(stem, surrogates.rng("ADDRESS", word.casefold()).choice(pool))
    return choice + (suffix.group() if suffix else "")


def _dob(surrogates: Surrogates, value: str) -> str:
    rng = surrogates.rng("DOB", value)
    out = []
    for word in _WORDS.findall(value):
        if word.isdigit():
            if len(word) == 4:
                out.append(str(rng.randint(1950, 2004)))
            else:  # a day or a month, either way valid: 1-12
                out.append(f"{rng.randint(1, 12):0{len(word)}d}")
        elif word[0].isalpha() and word.rstrip(".").capitalize()[:3] in {
            month[:3] for month in _MONTHS_FULL
        }:
            month = rng.choice(_MONTHS_FULL)
            stem = word.rstrip(".")
            month = month[: len(stem)] if len(stem) <= 4 else month
            out.append(_same_case(stem, month) + word[len(stem) :])
        else:
            out.append(word)
    return "".join(out)


def _card(surrogates: Surrogates, value: str) -> str:
    digits = "".join(char for char in value if char.isdigit())
    pool = TEST_CARDS.get(len(digits), TEST_CARDS[16])
    card = iter(surrogates.rng("CARD", digits).choice(pool))
    if len(digits) not in TEST_CARDS:
        return "".join(card)
    return "".join(next(card) if char.isdigit() else char for char in value)


def _iban(surrogates: Surrogates, value: str) -> str:
    compact = value.replace(" ", "").upper()
    country = compact[:2]
    bban = _shape(surrogates, compact[4:]).upper()
    iban = iter(country + iban_check_digits(country, bban) + bban)
    return "".join(next(iban) if char != " " else char for char in value)


def _ip(surrogates: Surrogates, value: str) -> str:
    rng = surrogates.rng("IP", value.lower())
    if ":" in value:
        return f"2001:db8::{rng.randint(1, 0xFFFE):x}:{rng.randint(1, 0xFFFE):x}"
    prefix = rng.choice(("192.0.2", "198.51.100", "203.0.113"))
    return f"{prefix}.{rng.randint(1, 254)}"


def _ssn(surrogates: Surrogates, value: str) -> str:
    number = iter("98765432" + str(surrogates.rng("SSN", value).randrange(10)))
    return "".join(next(number) if char.isdigit() else char for char in value)


def _ni_number(surrogates: Surrogates, value: str) -> str:
    rng = surrogates.rng("NI_NUMBER", value.replace(" ", ""))
    characters = iter(["Q", "Q", *_digits(rng, 6), rng.choice("ABCD")])
    return "".join(next(characters) if char != " " else char for char in value)


def _aadhaar(surrogates: Surrogates, value: str) -> str:
    rng = surrogates.rng("AADHAAR", "".join(char for char in value if char.isdigit()))
    body = rng.choice("23456789") + _digits(rng, 10)
    number = iter(body + verhoeff.calc_check_digit(body))
    return "".join(next(number) if char.isdigit() else char for char in value)


def _shape(surrogates: Surrogates, value: str) -> str:
    """`value` with each ASCII letter and digit replaced by another of the same kind and case
    (one keyed byte each); lines of dashes (a key block's BEGIN and END) stay."""
    noise = surrogates.noise("SHAPE", value, len(value))
    out = []
    for char, byte in zip(value, noise, strict=True):
        if not char.isascii() or not char.isalnum():
            out.append(char)
        elif char.isdigit():
            out.append(_DIGITS[byte % 10])
        else:
            letter = _LETTERS[byte % 26]
            out.append(letter.upper() if char.isupper() else letter)
    shaped = "".join(out)
    if "-----" not in value:
        return shaped
    kept = [
        line if line.startswith("-----") else new
        for line, new in zip(value.split("\n"), shaped.split("\n"), strict=True)
    ]
    return "\n".join(kept)


_MAKERS: dict[str, Callable[[Surrogates, str], str]] = {
    "NAME": _name, "EMAIL": _email, "PHONE": _phone, "ADDRESS": _address, "DOB": _dob,
    "CARD": _card, "IBAN": _iban, "IP": _ip, "SSN": _ssn, "NI_NUMBER": _ni_number,
    "AADHAAR": _aadhaar,
}  # fmt: skip
