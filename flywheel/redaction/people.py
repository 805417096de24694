"""Person names nobody told us about, found in free text.

A capitalised word is a name when its context says so, not because it could be one:

- a greeting or an address: "Hi Maria Lopez,", "Dear Mr. Okafor", "Dr. Haddad";
- an introduction: "my name is ...", "I'm ..." (these two only for a known first name);
- a sign-off: "Regards,\\nMaria Lopez" (the name alone on the line after it);
- a known first name followed by a known surname, or by a capitalised word that is no common
  word ("Priya Okafor" and "Maria Lopez" anywhere; "Grant Access" never, since "Grant" is
  also a word).

The first names and surnames are faker's person lists for Latin-script locales (a maintained
package; about 10,000 first names and 14,000 surnames), read once on first use. Names found
in a text are then looked for again in that text as known names are (`names.find_names`), so
"Maria" later in the same text is caught too. Text in capitals only is not searched this way:
a heading shouts, it does not name.
"""

from __future__ import annotations

import importlib
import re
from functools import lru_cache

from flywheel.redaction.names import find_names
from flywheel.redaction.spans import Span

# faker's person providers whose names are written in Latin script.
_LOCALES = (
    *("en_US", "en_GB", "en_IE", "en_IN", "en_NG", "en_KE", "en_PK", "en_NZ", "ga_IE"),
    *("es_ES", "es_MX", "es_CO", "es_AR", "pt_BR", "pt_PT", "fr_FR", "de_DE", "it_IT"),
    *("nl_NL", "pl_PL", "cs_CZ", "sk_SK", "sv_SE", "da_DK", "no_NO", "fi_FI", "is_IS"),
    *("tr_TR", "ro_RO", "hu_HU", "hr_HR", "sl_SI", "lt_LT", "lv_LV", "et_EE", "yo_NG"),
    *("ig_NG", "ha_NG", "zu_ZA", "sw", "tw_GH", "id_ID", "vi_VN", "fil_PH", "tl_PH"),
)
# First names that are as often ordinary words, months or places: names only in context.
_AMBIGUOUS = frozenset(
    """will may june april august mark rose bill grant chase hope faith joy grace amber ruby
    summer autumn dawn crystal jack frank gene guy art sue pat ray rich drew hunter lane wade
    carter mason page paris victoria china georgia austin dallas jordan florence eve iris
    ivy holly lily daisy violet jasmine sky star angel precious honey sunny rusty max sam
    per bo so ka an in on or and to do la le li lo ma mo no ok us we be al el tan ben
    don jean may new best love young long king white black brown green gray grey price
    hill case key bank mercy unity liberty justice patience hazel sandy misty cash sage
    harmony melody destiny trinity lincoln kent york ashley shelby kelly taylor tyler
    parker cooper porter baker miller fisher turner archer walker""".split()
)
# Capitalised words that end a name candidate: where a second word is one of these, the
# first alone is no name either (without context).
_NOT_NAMES = frozenset(
    """the a an and or but for to of in on at by with from as is are was were be been this
    that these those it its we you he she they i my our your their his her team all there
    everyone folks guys support customer customers client user users admin thanks thank
    please hello hi hey dear sir madam regards best cheers sincerely yours team's again
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december today tomorrow yesterday
    street road avenue lane drive court way place plan plans order orders account invoice
    ticket issue bug error report service services api app apps inc ltd llc corp company
    group bank university hospital school office department manager director engineer
    north south east west new old good great happy annual support. note notes update
    upgrade export import team. contact reference logs ok okay sure yes no not""".split()
)
_WORD = r"[^\W\d_](?:[^\W\d_]|['’\-](?=[^\W\d_]))*"
_NAME_WORD = re.compile(_WORD)
# Overlapping pairs: the second word is read in a lookahead, so "Hello Maria Lopez" yields
# both "Hello Maria" and "Maria Lopez".
_CAPITALISED_PAIR = re.compile(rf"(?<![\w'’\-])({_WORD})(?=[ \t]+({_WORD})(?![\w'’\-]))")
# One to three capitalised words starting right at a position.
_NAME_AT = re.compile(rf"({_WORD})(?:[ \t]+({_WORD}))?(?:[ \t]+({_WORD}))?")
_TITLES = r"(?:Mr|Mrs|Ms|Mx|Miss|Dr|Prof|Sir|Dame|Madam|Mme|Mlle|Herr|Frau|Sr|Sra|Srta)"
_GREETING = re.compile(
    r"(?<![\w])(?:(?i:hi|hello|hey|hiya|dear|greetings|good (?:morning|afternoon|evening))"
    rf"[ \t]*,?[ \t]+(?:{_TITLES}\.?[ \t]+)?|{_TITLES}\.?[ \t]+)"
)
_INTRODUCTION = re.compile(
    r"(?<![\w])(?:(?i:my name is|my name's|name:|signed:?)[ \t]+"
    r"|(?P<weak>(?i:i am|i'm|i’m|this is|thanks|thank you|cheers|ask|cc|with)[ \t,]+))"
)
_SIGN_OFF = re.compile(
    r"(?im:^[ \t]*(?:thanks|thank you|many thanks|regards|best regards|kind regards|warm "
    r"regards|best wishes|best|cheers|sincerely|yours(?: truly| sincerely)?|respectfully|"
    r"all the best)[ \t]*[,.!]?[ \t]*\r?\n[ \t]*)"
)
_SIGN_OFF_END = re.compile(r"[ \t]*[,.]?[ \t]*(?:\r?\n|\Z)")
_HINT = re.compile(r"[A-ZÀ-ÖØ-ÞĀ-ž]")
_COMMON_FIRST_NAMES = 300  # per sex, of faker's en_US list


@lru_cache(maxsize=1)
def gazetteer() -> tuple[frozenset[str], frozenset[str]]:
    """Lower-cased (first names, surnames) of faker's Latin-script person providers."""
    first: set[str] = set()
    last: set[str] = set()
    for locale in _LOCALES:
        try:
            provider = importlib.import_module(f"faker.providers.person.{locale}").Provider
        except ModuleNotFoundError:  # a locale an older faker lacks
            continue
        for attribute in ("first_names", "first_names_male", "first_names_female"):
            first.update(name.lower() for name in getattr(provider, attribute, ()))
        last.update(name.lower() for name in getattr(provider, "last_names", ()))
    return frozenset(first), frozenset(last)


@lru_cache(maxsize=1)
def first_name_words() -> frozenset[str]:
    """Lower-cased words that are first names more than surnames: first names no locale has
    as a surname, and the most common US first names ("john", "james"; faker weighs them by
    frequency), which are surnames too but rarely."""
    first, last = gazetteer()
    provider = importlib.import_module("faker.providers.person.en_US").Provider
    common: set[str] = set()
    for attribute in ("first_names_male", "first_names_female"):
        names = getattr(provider, attribute, {})
        ranked = sorted(names, key=names.get, reverse=True) if isinstance(names, dict) else []
        common.update(name.lower() for name in ranked[:_COMMON_FIRST_NAMES])
    return frozenset((first - last) | common)


def find_people(text: str) -> list[Span]:
    """Spans of person names in `text` that context or the gazetteer show to be names, and
    every later whole-word occurrence of them in the same text."""
    if _HINT.search(text) is None or text.isupper():
        return []
    found = _in_context(text) + _full_names(text)
    if not found:
        return []
    names = tuple(sorted({text[span.start : span.end] for span in found}))
    return found + find_names(text, text.lower(), names)


def _in_context(text: str) -> list[Span]:
    found = []
    for match in _GREETING.finditer(text):
        found += _names_at(text, match.end(), needs_known=False)
    for match in _INTRODUCTION.finditer(text):
        found += _names_at(text, match.end(), needs_known=match.group("weak") is not None)
    for match in _SIGN_OFF.finditer(text):
        spans = _names_at(text, match.end(), needs_known=False)
        if spans and _SIGN_OFF_END.match(text, spans[-1].end):
            found += spans
    return found


def _names_at(text: str, at: int, *, needs_known: bool) -> list[Span]:
    """The capitalised words (up to three) starting at `at` that make a name."""
    match = _NAME_AT.match(text, at)
    if match is None:
        return []
    words = [match.span(group) for group in (1, 2, 3) if match.group(group) is not None]
    kept: list[tuple[int, int]] = []
    for start, end in words:
        word = text[start:end]
        if not _is_name_word(word):
            break
        kept.append((start, end))
    if not kept:
        return []
    first, _ = gazetteer()
    if needs_known and text[kept[0][0] : kept[0][1]].lower() not in first:
        return []
    return [Span(kept[0][0], kept[-1][1], "NAME")]


def _is_name_word(word: str) -> bool:
    return (
        word[0].isupper()
        and not (len(word) > 1 and word.isupper())
        and word.lower() not in _NOT_NAMES
    )


def _full_names(text: str) -> list[Span]:
    """A known first name followed by a surname: "Maria Lopez", "Priya Okafor"."""
    first, last = gazetteer()
    found = []
    for match in _CAPITALISED_PAIR.finditer(text):
        given, family = match.group(1), match.group(2)
        if not (_is_name_word(given) and _is_name_word(family)):
            continue
        given_lower, family_lower = given.lower(), family.lower()
        if given_lower not in first:
            continue
        if family_lower in last or given_lower not in _AMBIGUOUS:
            found.append(Span(match.start(1), match.end(2), "NAME"))
    return found
