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


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# faker's person providers whose names are written in Latin script.
_LOCALES = (
    *("en_US", "en_GB", "en_IE", "en_IN", "en_NG", "en_KE", "en_PK", "en_NZ", "ga_IE"),
    *("es_ES", "es_MX", "es_CO", "es_AR", "pt_BR", "pt_PT", "fr_FR", "de_DE", "it_IT"),
    *("nl_NL", "pl_PL", "cs_CZ", "sk_SK", "sv_SE", "da_DK", "no_NO", "fi_FI", "is_IS"),
    *("tr_TR", "ro_RO", "hu_HU", "hr_HR", "sl_SI", "lt_LT", "lv_LV", "et_EE", "yo_NG"),
    *("ig_NG", "ha_NG", "zu_ZA", "sw", "tw_GH", "id_ID", "vi_VN", "fil_PH", "tl_PH"),
)
# First names that are as often ordinary words, months or places: names only in context.
_AMBIGUOUS = _words(
    """will may june april august mark rose bill grant chase hope faith joy grace amber ruby
    summer autumn dawn crystal jack frank gene guy art sue pat ray rich drew hunter lane wade
    carter mason page paris victoria china georgia austin dallas jordan florence eve iris
    ivy holly lily daisy violet jasmine sky star angel precious honey sunny rusty max sam
    per bo so ka an in on or and to do la le li lo ma mo no ok us we be al el tan ben
    don jean may new best love young long king white black brown green gray grey price
    hill case key bank mercy unity liberty justice patience hazel sandy misty cash sage
    harmony melody destiny trinity lincoln kent york ashley shelby kelly taylor tyler
    parker cooper porter baker miller fisher turner archer walker"""
)
# Capitalised words that end a name candidate: where a second word is one of these, the
# first alone is no name either (without context).
_NOT_NAMES = _words(
    """mr mrs ms mx miss dr prof sir dame madam mme mlle herr frau sr sra srta
    the a an and or but for to of in on at by with from as is are was were be been this
    that these those it its we you he she they i my our your their his her team all there
    everyone folks guys support customer customers client user users admin thanks thank
    please hello hi hey dear sir madam regards best cheers sincerely yours team's again
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december today tomorrow yesterday
    street road avenue lane drive court way place plan plans order orders account invoice
    ticket issue bug error report service services api app apps inc ltd llc corp company
    group bank university hospital school office department manager director engineer
    north south east west new old good great happy annual support. note notes update
    upgrade export import team. contact reference logs ok okay sure yes no not world
    everybody anyone someone there's"""
)
_WORD = r"[^\W\d_](?:[^\W\d_]|['\u2019\-](?=[^\W\d_]))*"
# One to three capitalised words starting right at a position.
_NAME_AT = re.compile(rf"({_WORD})(?:[ \t]+({_WORD}))?(?:[ \t]+({_WORD}))?")
# What comes before a name (lower case, then spaces and maybe a comma). A `weak` context names
# only a known first name; a title must be capitalised.
_STRONG = (
    *("hi", "hello", "hey", "hiya", "dear", "greetings", "good morning", "good afternoon"),
    *("good evening", "my name is", "my name's", "name:", "signed", "signed:"),
)
_TITLE_WORDS = (
    *("mr", "mrs", "ms", "mx", "miss", "dr", "prof", "sir", "dame", "madam", "mme", "mlle"),
    *("herr", "frau", "sr", "sra", "srta"),
)
_TITLE_FORMS = (*_TITLE_WORDS, *(f"{title}." for title in _TITLE_WORDS))
_WEAK = ("i am", "i'm", "i\u2019m", "this is", "thanks", "thank you", "cheers", "ask", "cc", "with")
_CONTEXT_CHARS = 24  # the longest context, its spaces and a comma
_SIGN_OFFS = frozenset(
    (
        *("thanks", "thank you", "many thanks", "regards", "best regards", "kind regards"),
        *("warm regards", "best wishes", "best", "cheers", "sincerely", "yours"),
        *("yours truly", "yours sincerely", "respectfully", "all the best"),
    )
)
_SIGN_OFF_END = re.compile(r"[ \t]*[,.]?[ \t]*(?:\r?\n|\Z)")
# A capitalised token (to the next white space), maybe after an opening quote or bracket: the
# regex engine skips straight to capitals, and only these few tokens are looked at.
_CAPITALISED = re.compile(r"[@(\"'\[«“\u2018]?[A-ZÀ-ÖØ-ÞĀ-ž]\S*")
_HINT = re.compile(r"[A-ZÀ-ÖØ-ÞĀ-ž]")
_COMMON_FIRST_NAMES = 300  # per sex, of faker's en_US list
_OPENING = "@(\"'[«“\u2018"
_CLOSING = ".,;:!?)\"']»”\u2019"
_INNER = str.maketrans("", "", "'\u2019-")


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
        names: dict[str, float] = dict(getattr(provider, attribute, {}))
        ranked = sorted(names, key=lambda name: names[name], reverse=True)
        common.update(name.lower() for name in ranked[:_COMMON_FIRST_NAMES])
    return frozenset((first - last) | common)


def find_people(text: str, lowered: str) -> list[Span]:
    """Spans of person names in `text` that context or the gazetteer show to be names, and
    every later whole-word occurrence of them in the same text; `lowered` is `text`
    lower-cased by `lower_keeping_offsets`."""
    if _HINT.search(text) is None or text.isupper():
        return []
    found = _find(text, lowered)
    if not found:
        return []
    names = tuple(sorted({text[span.start : span.end] for span in found}))
    return found + find_names(text, lowered, names)


def _find(text: str, lowered: str) -> list[Span]:
    first, last = gazetteer()
    found: list[Span] = []
    previous: tuple[str, int, int] | None = None  # a first name that may start a full name
    for match in _CAPITALISED.finditer(text):
        token = match.group()
        start = match.start() + (len(token) - len(token.lstrip(_OPENING)))
        core = _core(text[start : match.end()])
        if core is None or not _is_name_word(core):
            previous = None
            continue
        end = start + len(core)
        lower = core.lower()
        context = _context(text, lowered, start)
        if context is not None and (context == "strong" or lower in first):
            found += _names_at(text, start)
        elif (
            previous is not None
            and _adjacent(text, previous[2], match.start())
            and (lower in last or previous[0] not in _AMBIGUOUS)
        ):
            found.append(Span(previous[1], end, "NAME"))
        if _is_sign_off(lowered, start):
            spans = _names_at(text, start)
            if spans and _SIGN_OFF_END.match(text, spans[-1].end):
                found += spans
        opens = end == match.end() and lower in first
        previous = (lower, start, end) if opens else None
    return found


def _core(word: str) -> str | None:
    """The word without closing punctuation or a possessive, if it is all letters."""
    core = word.rstrip(_CLOSING)
    if core.endswith(("'s", "\u2019s")):
        core = core[:-2]
    return core if core and core.translate(_INNER).isalpha() else None


def _context(text: str, lowered: str, at: int) -> str | None:
    """ "strong" or "weak" for a context right before `at`, else None."""
    before = lowered[max(0, at - _CONTEXT_CHARS) : at]
    stripped = before.rstrip(" \t")
    if len(stripped) == len(before):
        return None  # a context is followed by white space
    stripped = stripped.removesuffix(",").rstrip(" \t")
    for words, kind in ((_STRONG, "strong"), (_TITLE_FORMS, "title"), (_WEAK, "weak")):
        if not stripped.endswith(words):
            continue
        word = next(word for word in words if stripped.endswith(word))
        begins = len(stripped) - len(word)
        offset = at - len(before) + begins
        if (begins > 0 and stripped[begins - 1].isalnum()) or (
            offset > 0 and begins == 0 and (lowered[offset - 1].isalnum())
        ):
            continue  # inside a word: "this" ends in "hi"
        if kind == "title":
            return "strong" if text[offset].isupper() else None
        return kind
    return None


def _adjacent(text: str, end: int, start: int) -> bool:
    """Only spaces or tabs between two words."""
    return start > end and not text[end:start].strip(" \t")


def _is_sign_off(lowered: str, at: int) -> bool:
    """Whether `at` starts a line right after a sign-off line ("Kind regards,")."""
    line_start = lowered.rfind("\n", 0, at) + 1
    if line_start == 0 or lowered[line_start:at].strip(" \t"):
        return False
    previous_start = lowered.rfind("\n", 0, line_start - 1) + 1
    line = lowered[previous_start : line_start - 1].strip(" \t\r").rstrip(",.!").rstrip()
    return line in _SIGN_OFFS


def _names_at(text: str, at: int) -> list[Span]:
    """The capitalised words (up to three) starting at `at` that make a name."""
    match = _NAME_AT.match(text, at)
    if match is None:
        return []
    end = at
    for group in (1, 2, 3):
        if match.group(group) is None or not _is_name_word(match.group(group)):
            break
        end = match.end(group)
    return [Span(at, end, "NAME")] if end > at else []


def _is_name_word(word: str) -> bool:
    return (
        word[0].isupper()
        and not (len(word) > 1 and word.isupper())
        and word.lower() not in _NOT_NAMES
    )
