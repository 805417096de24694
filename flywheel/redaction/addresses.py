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
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’.\-]*"
_UNIT = (
    r"(?:,?[ \t]+(?:Apt|Apartment|Suite|Ste|Unit|Flat|Floor|Fl|Room|Rm|#)\.?[ \t]?#?[\w\-]{1,6})"
)
_US_STATE_ZIP = r"[A-Z]{2}[ \t]+\d{5}(?:-\d{4})?"
_UK_POSTCODE = r"[A-Z]{1,2}\d[A-Z\d]?[ \t]?\d[A-Z]{2}"
_CA_POSTCODE = r"[A-Z]\d[A-Z][ \t]?\d[A-Z]\d"
_TOWN = rf"(?:,[ \t]*{_CAP}(?:[ \t]+{_CAP}){{0,2}})"
_REGION = rf"(?:,?[ \t]*(?:{_US_STATE_ZIP}|{_UK_POSTCODE}|{_CA_POSTCODE}|[A-Z]{{2}}(?![\w])))"

_ENGLISH = re.compile(
    r"(?<![\w.\-])\d{1,6}[A-Za-z]?(?:[\-/]\d{1,4})?[ \t]+"
    r"(?:(?:[NSEW]|N[EW]|S[EW]|North|South|East|West)\.?[ \t]+)?"
    rf"(?:{_CAP}|\d{{1,3}}(?:st|nd|rd|th))(?:[ \t]+{_CAP}){{0,3}}?[ \t]+(?:{_SUFFIXES})\.?"
    rf"(?![\w]){_UNIT}?(?:{_TOWN}{_REGION}?)?"
)
_PO_BOX = re.compile(r"(?<![\w])(?i:p\.?[ \t]?o\.?[ \t]box)[ \t]+\d{1,6}(?![\w])")
_GERMAN = re.compile(
    r"(?<![\w])(?:(?:Am|An der|Im|In der|Auf der|Zum|Zur)[ \t]+)?"
    r"[A-ZÄÖÜ][\wäöüß\-]*(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer)"
    r"[ \t]+\d{1,4}[a-z]?(?:,[ \t]*\d{5}[ \t]+[A-ZÄÖÜ][\wäöüß\-]+)?"
)
_ROMANCE = re.compile(
    r"(?<![\w])(?:\d{1,4}(?:[ \t]?(?:bis|ter))?,?[ \t]+)?"
    r"(?:rue|avenue|boulevard|bd|place|allée|impasse|chemin|quai|Rue|Avenue|Boulevard|Place"
    r"|Calle|C/|Avenida|Av\.|Plaza|Paseo|Carrer|Rua|Via|Viale|Piazza|Corso|Largo)"
    r"[ \t]+(?:(?:de|du|des|la|le|l'|del|della|di|da|do|dos|das)[ \t]*)*"
    rf"{_CAP}(?:[ \t]+{_CAP}){{0,2}}(?:,?[ \t]+\d{{1,4}}[a-z]?)?"
)
_ROMANCE_NUMBER = re.compile(r"\d")
_HINT = re.compile(
    rf"(?<![\w])(?:{_SUFFIXES})(?![\w])|straße|strasse|str\.|weg\b|gasse|platz|allee"
    r"|(?i:p\.?[ \t]?o\.?[ \t]box)|rue |Rue |Calle |Avenida |Rua |Via |Piazza |Carrer "
)


def find_addresses(text: str) -> list[Span]:
    """Every street address in `text`."""
    if _HINT.search(text) is None:
        return []
    found = [Span(m.start(), m.end(), "ADDRESS") for m in _ENGLISH.finditer(text)]
    found += [Span(m.start(), m.end(), "ADDRESS") for m in _PO_BOX.finditer(text)]
    found += [Span(m.start(), m.end(), "ADDRESS") for m in _GERMAN.finditer(text)]
    found += [
        Span(m.start(), m.end(), "ADDRESS")
        for m in _ROMANCE.finditer(text)
        if _ROMANCE_NUMBER.search(m.group()) is not None  # "Via Roma" alone is a place
    ]
    return found
