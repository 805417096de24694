"""Detectors for personal data: e-mail addresses, phone numbers, payment cards, IBANs, US SSNs
and IP addresses.

Each detector starts with a test that costs next to nothing (an `@` in the text, a run of
digits long enough), because most texts hold no PII at all and the feedback compiler runs
millions of them. Patterns compile once, at import.
"""

from __future__ import annotations

import ipaddress
import re

from flywheel.redaction.checksums import IBAN_LENGTHS, iban_valid, is_card_number
from flywheel.redaction.spans import Span

# `@`, dot-separated labels and an alphabetic top-level domain (so `python@2.7` and
# `lodash@4.17.21` are not addresses); the local part is found by scanning left from the `@`.
_EMAIL_DOMAIN = re.compile(r"@(?:[^\W_](?:[\w\-]*[^\W_])?\.)+[^\W\d_]{2,24}(?![\w\-])")
_LOCAL_PART_CHARS = frozenset("._%+-")
_LOCAL_PART_MAX = 64  # RFC 5321
# scp-style git remotes (`git@github.com:org/repo.git`) are not a person's address.
_SERVICE_LOCAL_PARTS = frozenset({"git"})

# Where phones, cards, SSNs, IBANs and IPv4 addresses can be: a run of 7+ digits and
# separators. The run starts with a digit, `+` or `(` so that the regex engine skips ahead to
# those characters instead of trying every position, and spells digits `0-9` (a bitmap test;
# `\d` calls Unicode's tables per character, three times slower). The precise patterns below
# then only look inside and around runs.
_NUMERIC_RUN = re.compile(r"[+(0-9][0-9 ().\-]{5,}[0-9]")
_LOOKAHEAD_MARGIN = 2  # the precise patterns peek this far past a run's end

# North American numbers (area code 2-9), with or without +1; any number written with a
# leading `+country code`; national numbers with a trunk 0 in their usual groupings (UK
# `020 7946 0958`, `07700 900123`; DE `030 12345678`; FR `01 23 45 67 89`). Bare digit runs
# without separators are ids, not phones.
_PHONE = re.compile(
    r"(?<![\w+\-.])(?:"
    r"(?:\+?1[ .\-]?)?(?:\([2-9]\d\d\) ?|[2-9]\d\d[ .\-])\d{3}[ .\-]\d{4}"
    r"|\+[1-9]\d{0,2}(?:[ .\-]?\(?\d{1,5}\)?){2,6}"
    r"|0[1-9]\d{1,4}[ \-]\d{3,4}[ \-]?\d{3,4}"
    r"|0[1-9](?:[ .]\d\d){4}"
    r")(?![\w\-]|\.\d)"
)
_PHONE_DIGITS = (8, 15)  # E.164 allows at most 15 digits; fewer than 8 is an extension or id

# 4-4-4-4(-3) groups or Amex 4-6-5 with one consistent separator, or 13-19 digits in a row.
_CARD = re.compile(
    r"(?<![\w\-.])(?:\d{4}([ \-]?)\d{4}\1\d{4}\1\d{4}(?:\1\d{3})?"
    r"|\d{4}([ \-]?)\d{6}\2\d{5}|\d{13,19})(?![\w\-]|\.\d)"
)
_NOT_DIGIT = re.compile(r"\D")

# Dashed SSNs, minus the ranges never issued (area 000, 666, 9xx; group 00; serial 0000);
# undashed ones only right after "SSN" or "social security number".
_SSN = re.compile(r"(?<![\w\-.])(?!000|666|9)\d{3}-(?!00)\d\d-(?!0000)\d{4}(?![\w\-]|\.\d)")
_SSN_LABELLED = re.compile(
    r"(?i:ssn|social security(?: number| no\.?)?)\s*(?:#|:|is)?\s*"
    r"((?!000|666|9)\d{3}([ \-]?)(?!00)\d\d\2(?!0000)\d{4})(?!\d)"
)

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# Not after a version pin (`pkg==1.2.3.4`, `v1.2.3.4`, `pkg@1.2.3.4`), not inside a longer
# dotted number.
_IPV4 = re.compile(rf"(?<![\w.@])(?<![=<>~!]=){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.\d)")
# "version 1.2.3.4", `__version__ = "3.5.0.1"`, "RFC 9110 section 8.4.1.3": numbers, not hosts.
_VERSION_BEFORE = re.compile(r"(?i:(?:version|ver\.?|build|release|section|§)[\W_]{0,6})\Z")
_VERSION_WINDOW = 16
_IPV6 = re.compile(
    r"(?<![\w:.])(?=[0-9A-Fa-f:]*\d)[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])"
)
_IPV6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")  # starts with a literal: a fast scan
_IPV6_GROUP = re.compile(r"[0-9A-Fa-f]{3,4}")

# Country code, check digits, then groups of four (spaced or not, any case); trimmed to the
# country's registered length, so trailing upper-case words are not swallowed. Every IBAN's
# account number holds a numeric run that starts at most 12 characters in ("GB82 WEST 1234..."),
# so IBANs are looked for around runs only.
_IBAN = re.compile(r"(?<![\w\-])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?", re.I)
_IBAN_BEFORE_RUN = 12
_IBAN_MAX = 42  # 34 characters and 8 spaces
_IBAN_START = re.compile(r"[A-Za-z][A-Za-z][0-9][0-9]")  # cheap test before the full pattern

# What a run must hold before each pattern is worth trying: (pattern, kind, digits, one of
# these characters). A date (`2024-03-15`, 8 digits) only wakes the phone pattern, over ten
# characters. Every phone alternative has a `+` or a separator among its digits, inside the
# run (the lookahead margin past it is too short for one): a bare digit run (an order number)
# is no phone.
_IN_RUNS = (
    (_PHONE, "PHONE", 8, "+ .-"),
    (_CARD, "CARD", 13, ""),
    (_SSN, "SSN", 9, "-"),
    (_IPV4, "IP", 4, "."),
)
_IBAN_RUN_DIGITS = 6


def find_pii(text: str, lowered: str) -> list[Span]:
    """Every e-mail, phone, card, IBAN, SSN and IP address in `text` (overlaps allowed);
    `lowered` is `text.lower()`, shared with the other detectors."""
    found: list[Span] = []
    if "@" in text:
        found += _emails(text)
    if ":" in text and _IPV6_HINT.search(text) is not None:
        found += _ipv6(text)
    if "ssn" in lowered or "social security" in lowered:
        found += [Span(m.start(1), m.end(1), "SSN") for m in _SSN_LABELLED.finditer(text)]
    for run in _NUMERIC_RUN.finditer(text):
        found += _in_run(text, run)
    return found


def _in_run(text: str, run: re.Match[str]) -> list[Span]:
    found = []
    start, end = run.span()
    digits = len(_NOT_DIGIT.sub("", run.group()))
    for pattern, kind, min_digits, needed in _IN_RUNS:
        if digits < min_digits or (needed and not any(char in run.group() for char in needed)):
            continue
        for match in pattern.finditer(text, start, min(len(text), end + _LOOKAHEAD_MARGIN)):
            if _is_valid(kind, match, text):
                found.append(Span(match.start(), match.end(), kind))
    if digits >= _IBAN_RUN_DIGITS:
        country = _IBAN_START.search(text, max(0, start - _IBAN_BEFORE_RUN), start + 4)
        if country is not None:
            found += _ibans(text, country.start(), end + _IBAN_MAX)
    return found


def _is_valid(kind: str, match: re.Match[str], text: str) -> bool:
    """The checks a regex cannot make: digit counts, Luhn and card prefixes, address kinds."""
    if kind == "PHONE":
        low, high = _PHONE_DIGITS
        return low <= len(_NOT_DIGIT.sub("", match.group())) <= high
    if kind == "CARD":
        return is_card_number(_NOT_DIGIT.sub("", match.group()))
    if kind == "IP":
        if not _ipv4_identifies_host(match.group()):
            return False
        before = text[max(0, match.start() - _VERSION_WINDOW) : match.start()]
        return _VERSION_BEFORE.search(before) is None  # "version 1.2.3.4" is no address
    return True


def _ipv4_identifies_host(address: str) -> bool:
    """What `_identifies_host` decides, from the first octet alone (the pattern has checked
    the octets): 0/8 ("this network", 0.0.0.0), 127/8 loopback, 224/4 multicast and 240/4
    reserved (netmasks, broadcast) point at no host. Skips `ipaddress` on the hot path."""
    first = int(address[: address.index(".")])
    return 0 < first < 224 and first != 127


def _emails(text: str) -> list[Span]:
    found = []
    for domain in _EMAIL_DOMAIN.finditer(text):
        start = at = domain.start()
        while at - start < _LOCAL_PART_MAX and start > 0 and _is_local_char(text[start - 1]):
            start -= 1
        while start < at and text[start] in _LOCAL_PART_CHARS:
            start += 1  # a local part starts with a letter or digit
        if start < at and text[start:at] not in _SERVICE_LOCAL_PARTS:
            found.append(Span(start, domain.end(), "EMAIL"))
    return found


def _is_local_char(char: str) -> bool:
    return char.isalnum() or char in _LOCAL_PART_CHARS


def _ibans(text: str, start: int, end: int) -> list[Span]:
    found = []
    for match in _IBAN.finditer(text, start, end):
        candidate = match.group().upper()
        length = IBAN_LENGTHS.get(candidate[:2])
        if length is None:
            continue
        size = _end_after_alnum(candidate, length)
        if size is None:
            continue
        after = match.start() + size
        if after < len(text) and text[after].isalnum():
            continue  # part of a longer code
        if iban_valid(candidate[:size].replace(" ", "")):
            found.append(Span(match.start(), after, "IBAN"))
    return found


def _end_after_alnum(candidate: str, count: int) -> int | None:
    """The index in `candidate` just past its `count`-th letter or digit, if it has that many."""
    seen = 0
    for index, char in enumerate(candidate):
        if char != " ":
            seen += 1
            if seen == count:
                return index + 1
    return None


def _ipv6(text: str) -> list[Span]:
    found = []
    for match in _IPV6.finditer(text):
        candidate = match.group()
        if _IPV6_GROUP.search(candidate) is None:
            continue  # `x[1::2]` and `a::b` are slices and scopes, not addresses
        try:
            address = ipaddress.IPv6Address(candidate)
        except ValueError:
            continue  # times (12:30:45), MAC addresses
        if _identifies_host(address):
            found.append(Span(match.start(), match.end(), "IP"))
    return found


def _identifies_host(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Public and private addresses can point at a person's machine or a company's network;
    loopback, unspecified (`0.0.0.0`, `::`) and multicast ones point at nobody, nor do IPv4's
    reserved ones (netmasks such as 255.255.255.0, broadcast): they are everywhere in code.
    (IPv6 calls most unallocated space "reserved"; an address there is still an address.)"""
    if address.is_loopback or address.is_unspecified or address.is_multicast:
        return False
    return address.version == 6 or not address.is_reserved
