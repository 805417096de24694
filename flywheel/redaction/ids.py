"""Detectors for national ids and dates of birth: UK National Insurance numbers, Indian
Aadhaar numbers, passport numbers and dates of birth.

- `<NI_NUMBER>`: two prefix letters HMRC issues (not D, F, I, Q, U, V; no O second; never BG,
  GB, KN, NK, NT, TN, ZZ), six digits (spaced in pairs or not) and a suffix A-D.
- `<AADHAAR>`: 12 digits, the first 2-9, with a valid Verhoeff check digit and not a
  palindrome (python-stdnum's `in_.aadhaar`). Written in groups of four with spaces it is
  found anywhere; dashed or unspaced (an order number could be) only near "Aadhaar"/"UID".
- `<PASSPORT>`: passport numbers differ by country (6-9 letters and digits), so only right
  after "passport" ("passport no. X1234567", "Passport number: 533380006").
- `<DOB>`: a date right after "date of birth", "DOB", "born (on)" or "birthday", in ISO,
  numeric (day or month first) or written form, with a year from 1900 to this year. Other
  dates (releases, logs) are no one's birthday and stay.
"""

from __future__ import annotations

import datetime
import re

from stdnum.in_ import aadhaar

from flywheel.redaction.spans import Span

_NI_NUMBER = re.compile(
    r"(?<![A-Za-z0-9])(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
    r"(?: ?\d{2}){3} ?[A-D](?![A-Za-z0-9])"
)
_NI_HINT = re.compile(r"[A-Z][A-Z] ?[0-9][0-9]")  # 0-9, not \d: a bitmap test, much faster

_AADHAAR = re.compile(r"(?<![\w\-.])[2-9]\d{3}([ \-]?)\d{4}\1\d{4}(?![\w\-]|\.\d)")
_AADHAAR_HINT = re.compile(r"[0-9]{4}[ \-]?[0-9]{4}[ \-]?[0-9]{4}")
_AADHAAR_CONTEXT = re.compile(r"(?i:aadhaa?r|\buid\b|uidai|आधार)")
_AADHAAR_WINDOW = 40

_PASSPORT = re.compile(
    r"(?i:passport)(?:[ \t]*(?i:no\.?|number|num\.?|nr\.?|#))?[ \t]*(?:(?i:is)[ \t]+|[:#=][ \t]*)?"
    r"(?P<number>(?=[A-Z]{0,3}\d)[A-Z0-9]{6,9})(?![\w\-])"
)

_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december"
    "|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_DOB = re.compile(
    r"(?i:\b(?:date[ \t]of[ \t]birth|d\.?o\.?b\.?|birth[ \t]?date|born(?:[ \t]on)?|birthday))"
    r"[ \t]*(?:is[ \t]+|was[ \t]+|[:#\-\u2013=,][ \t]*)?(?:(?i:on)[ \t]+)?"
    r"(?P<date>\d{4}-\d{1,2}-\d{1,2}"
    r"|\d{1,2}[./\-]\d{1,2}[./\-](?:\d{4}|\d{2})"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?[ \t](?:of[ \t])?(?i:{_MONTHS})\.?,?[ \t]\d{{4}}"
    rf"|(?i:{_MONTHS})\.?[ \t]\d{{1,2}}(?:st|nd|rd|th)?,?[ \t]\d{{4}})(?![\w])"
)
_DOB_HINTS = ("birth", "dob", "d.o.b", "born")
_YEAR = re.compile(r"\d{4}")
_FIRST_YEAR = 1900


def find_ids(text: str, lowered: str) -> list[Span]:
    """Every UK NI number, Aadhaar, passport number and date of birth in `text`."""
    found: list[Span] = []
    if _NI_HINT.search(text) is not None:
        found += [Span(m.start(), m.end(), "NI_NUMBER") for m in _NI_NUMBER.finditer(text)]
    if _AADHAAR_HINT.search(text) is not None:
        found += _aadhaars(text)
    if "passport" in lowered:
        found += [
            Span(m.start("number"), m.end("number"), "PASSPORT") for m in _PASSPORT.finditer(text)
        ]
    if any(hint in lowered for hint in _DOB_HINTS):
        found += [
            Span(m.start("date"), m.end("date"), "DOB")
            for m in _DOB.finditer(text)
            if _is_plausible_birth_year(m.group("date"))
        ]
    return found


def _aadhaars(text: str) -> list[Span]:
    found = []
    for match in _AADHAAR.finditer(text):
        digits = match.group().replace(" ", "").replace("-", "")
        if not aadhaar.is_valid(digits):
            continue
        if match.group(1) != " ":
            before = text[max(0, match.start() - _AADHAAR_WINDOW) : match.start()]
            if _AADHAAR_CONTEXT.search(before) is None:
                continue
        found.append(Span(match.start(), match.end(), "AADHAAR"))
    return found


def _is_plausible_birth_year(date: str) -> bool:
    year = _YEAR.search(date)
    if year is None:  # a two-digit year: any is plausible
        return True
    return _FIRST_YEAR <= int(year.group()) <= datetime.date.today().year
