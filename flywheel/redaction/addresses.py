"""Street addresses: a house number, a capitalised street name and a street type, with the
unit, town, state and postcode that follow it when present.

- English-speaking countries: "1234 Elm Street", "221B Baker St., London NW1 6XE",
  "500 W 5th Ave, Suite 200, Austin, TX 78701", "PO Box 4411".
- German-speaking: "Hauptstraße 5", "Am Lindenweg 12a, 10115 Berlin".
- French, Spanish, Portuguese, Italian: "12 rue de la Paix", "Calle Mayor 5",
  "Rua Augusta 120", "Via Roma 10".

The street type is what makes it an address: "12 seats", "3 of 5" and "version 2.4.1" have
none. The street type and the name before it must be capitalised ("the 3 main roads" is prose).
"""

from __future__ import annotations

import re

from flywheel.redaction.spans import Span

_SUFFIXES = (
    "Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Place|Pl"
    "|Terrace|Ter|Circle|Cir|Highway|Hwy|Parkway|Pkwy|Square|Sq|Close|Crescent|Cres|Row|Mews"
    "|Gardens|Grove|Walk|Trail|Alley|Plaza|Broadway|Park|Rise|Hill|Green|Parade|Wharf|Quay"
)
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'\u2019.\-]*"
_UNIT = (
    r"(?:,?[ \t]+(?:Apt|Apartment|Suite|Ste|Unit|Flat|Floor|Fl|Room|Rm|#)\.?[ \t]?#?[\w\-]{1,6})"
)
_US_STATE_ZIP = r"[A-Z]{2}[ \t]+\d{5}(?:-\d{4})?"
_UK_POSTCODE = r"[A-Z]{1,2}\d[A-Z\d]?[ \t]?\d[A-Z]{2}"
_CA_POSTCODE = r"[A-Z]\d[A-Z][ \t]?\d[A-Z]\d"
_TOWN_WORD = r"[A-ZÀ-ÖØ-Þ][^\W\d_]*(?:['\u2019.\-][^\W\d_]+)*(?!\d)"
_TOWN = rf"(?:,[ \t]*{_TOWN_WORD}(?:[ \t]+{_TOWN_WORD}){{0,2}})"
_REGION = rf"(?:,?[ \t]*(?:{_US_STATE_ZIP}|{_UK_POSTCODE}|{_CA_POSTCODE}|[A-Z]{{2}}(?![\w])))"

# No pattern starts with a look-behind (that makes the regex engine try every position);
# what may stand before a match is checked in Python instead.
_ENGLISH = re.compile(
    r"\d{1,6}[A-Za-z]?(?:[\-/]\d{1,4})?[ \t]+"
    r"(?:(?:[NSEW]|N[EW]|S[EW]|North|South|East|West)\.?[ \t]+)?"
    rf"(?:{_CAP}|\d{{1,3}}(?:st|nd|rd|th))(?:[ \t]+{_CAP}){{0,3}}?[ \t]+(?:{_SUFFIXES})\.?"
    rf"(?![\w]){_UNIT}?(?:{_TOWN}{_REGION}?)?"
)
# Hints: cheap patterns that every address of a kind matches, tried before the full ones.
# (Digits are spelled 0-9: a bitmap test, where `\d` looks each character up in Unicode's
# tables, several times slower on text full of version numbers and dates.)
_NUMBER_HINT = re.compile(
    r"[0-9][A-Za-z]?(?:[\-/][0-9]{1,4})?,?[ \t]+(?:[NSEW]\.?[ \t]+)?"
    r"(?:[A-Z0-9]|(?:rue|avenue|boulevard|bd|place|allée|impasse|chemin|quai)[ \t])"
)  # what English and French addresses start with: a number, then a name or a street type
_PO_BOX = re.compile(r"p\.?[ \t]?o\.?[ \t]box[ \t]+\d{1,6}(?![\w])")  # in lower case
_GERMAN = re.compile(
    r"(?:(?:Am|An der|Im|In der|Auf der|Zum|Zur)[ \t]+)?"
    r"[A-ZÄÖÜ][\wäöüß\-]*(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer)"
    r"[ \t]+\d{1,4}[a-z]?(?:,[ \t]*\d{5}[ \t]+[A-ZÄÖÜ][\wäöüß\-]+)?"
)
_GERMAN_HINT = re.compile(
    r"(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer)[ \t]+[0-9]"
)
_FRENCH = re.compile(
    r"\d{1,4}(?:[ \t]?(?:bis|ter))?,?[ \t]+"
    r"(?:rue|avenue|boulevard|bd|place|allée|impasse|chemin|quai|Rue|Avenue|Boulevard|Place)"
    r"[ \t]+(?:(?:de|du|des|la|le|l'|d')[ \t]*)*"
    rf"{_CAP}(?:[ \t]+{_CAP}){{0,2}}"
)
# Every `_SOUTHERN` match starts with one of these: `in` tests before the pattern.
_SOUTHERN_STARTS = (
    *("Calle", "C/", "Av", "Plaza", "Paseo", "Carrer", "Rua", "Via", "Piazza", "Corso"),
    "Largo",
)
_SOUTHERN = re.compile(
    r"(?:Calle|C/|Avenida|Av\.|Plaza|Paseo|Carrer|Rua|Via|Viale|Piazza|Corso|Largo)[ \t]+"
    r"(?:(?:de|del|la|los|las|dos|das|da|do|della|di)[ \t]+)*"
    rf"{_CAP}(?:[ \t]+{_CAP}){{0,2}},?[ \t]+\d{{1,4}}[a-z]?(?![\w])"
)


def find_addresses(text: str, lowered: str) -> list[Span]:
    """Every street address in `text`; `lowered` is `text` lower-cased keeping offsets."""
    found: list[Span] = []
    if _NUMBER_HINT.search(text) is not None:
        found += _matches(_ENGLISH, text, "._-")
        found += _matches(_FRENCH, text, "._-")
    if "box" in lowered:
        found += _matches(_PO_BOX, lowered, "")
    if _GERMAN_HINT.search(lowered) is not None:
        found += _matches(_GERMAN, text, "")
    if any(start in text for start in _SOUTHERN_STARTS):
        found += _matches(_SOUTHERN, text, "")
    return found


def _matches(pattern: re.Pattern[str], text: str, not_after: str) -> list[Span]:
    """The pattern's matches that start a word (not after a letter, digit or `not_after`)."""
    spans = []
    for match in pattern.finditer(text):
        at = match.start()
        if at and (text[at - 1].isalnum() or text[at - 1] in not_after or text[at - 1] == "_"):
            continue
        spans.append(Span(at, match.end(), "ADDRESS"))
    return spans
