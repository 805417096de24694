"""Check digits that separate real payment cards and IBANs from numbers that merely look like them.

A regex alone would redact every 16-digit order number and every upper-case code; the checksums
are what keep precision high on code and logs, where long digit runs are common.
"""

from __future__ import annotations

# ISO 13616 lengths, per country code, of the IBAN registry (SWIFT, 2024). A country outside the
# table is not an IBAN country, which rejects most upper-case codes before any arithmetic.
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32,
    "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
    "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31,
    "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28, "TL": 23,
    "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check every payment card number carries; `digits` holds digits only."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def has_card_prefix(digits: str) -> bool:
    """Whether `digits` starts like a number the card networks issue (Visa, Mastercard, Amex,
    Discover, JCB, Diners, UnionPay): rules out millisecond timestamps and most ids that
    happen to pass Luhn, one in ten of any random digit string."""
    if digits[0] == "4":
        return True
    two, three, four = int(digits[:2]), int(digits[:3]), int(digits[:4])
    return (
        51 <= two <= 55  # Mastercard
        or 2221 <= four <= 2720  # Mastercard 2-series
        or two in (34, 37)  # Amex
        or two in (36, 38) or 300 <= three <= 305  # Diners
        or 3528 <= four <= 3589  # JCB
        or four == 6011 or 644 <= three <= 649 or two == 65  # Discover
        or two == 62  # UnionPay
    )  # fmt: skip


def is_card_number(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and has_card_prefix(digits) and luhn_valid(digits)


def iban_valid(iban: str) -> bool:
    """ISO 13616: the registered length for the country, then mod 97 of the rearranged number
    (letters as 10..35) equals 1. `iban` is upper case without spaces."""
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban.isalnum() or not iban.isascii():
        return False
    remainder = 0
    for char in iban[4:] + iban[:4]:
        value = int(char, 36)
        remainder = (remainder * (100 if value > 9 else 10) + value) % 97
    return remainder == 1


def iban_check_digits(country: str, bban: str) -> str:
    """The two check digits that make `country + digits + bban` a valid IBAN (for building
    examples and test data)."""
    remainder = 0
    for char in bban + country + "00":
        value = int(char, 36)
        remainder = (remainder * (100 if value > 9 else 10) + value) % 97
    return f"{98 - remainder:02d}"


def luhn_complete(partial: str) -> str:
    """`partial` plus the check digit that makes it pass Luhn (for building test numbers)."""
    for check in "0123456789":
        if luhn_valid(partial + check):
            return partial + check
    raise AssertionError("unreachable: one of ten check digits always fits")
