"""Person names the source itself knows (requester, assignee, commenters), wherever they appear.

A name is redacted as the full name and as each of its parts ("Jane Doe" also hides "Jane"
and "Doe"), as whole words only, so "Ann" never touches "Annual". Matching ignores case, but a
case-insensitive hit must start with a capital letter: "Will", "Mark" and "Rose" are names,
"will", "mark" and "rose" are words. Scripts written without spaces (Chinese, Japanese,
Thai) have no word boundaries to check, so their names match anywhere.
"""

from __future__ import annotations

import re
from functools import lru_cache

from flywheel.redaction.spans import Span, lower_keeping_offsets

_TITLES = frozenset({"mr", "mrs", "ms", "mx", "dr", "prof", "sir", "jr", "sr", "ii", "iii"})
# Particles: part of a full name, never a name on their own ("the van arrived").
_NOT_ALONE = frozenset(
    {
        *("van", "von", "de", "der", "den", "da", "das", "dos", "del", "di", "du", "la", "le"),
        *("bin", "bint", "al", "el", "ibn", "st"),
    }
)
_EDGE_PUNCTUATION = ".,;:()[]\"'"
# Hiragana, Katakana, CJK ideographs and extensions, Thai, Lao, Khmer: no spaces between words.
_UNSPACED = re.compile(
    "[\u0e00-\u0eff\u1780-\u17ff\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\U00020000-\U0003134f]"
)


class _Matcher:
    """One set of names: each form (full name and parts) lower-cased, longest first, with
    whether it needs word boundaries, and the exact spellings allowed to match in lower case."""

    __slots__ = ("exact", "forms")

    def __init__(self, forms: set[str]) -> None:
        self.exact = frozenset(forms)
        ordered = sorted(forms, key=len, reverse=True)
        self.forms = tuple(
            (lower_keeping_offsets(form), _UNSPACED.search(form) is None) for form in ordered
        )


def find_names(text: str, lowered: str, names: tuple[str, ...]) -> list[Span]:
    """Occurrences in `text` of the given person names; `lowered` is `text` lower-cased by
    `lower_keeping_offsets`. Found with `str.find`, far cheaper than a case-insensitive regex."""
    matcher = _matcher(names)
    if matcher is None:
        return []
    found = []
    for form, is_bounded in matcher.forms:
        at = lowered.find(form)
        while at >= 0:
            end = at + len(form)
            if (not is_bounded or _is_whole_word(text, at, end)) and _is_name_case(
                text[at:end], matcher.exact
            ):
                found.append(Span(at, end, "NAME"))
            at = lowered.find(form, end)
    return found


def _is_whole_word(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not (before.isalnum() or before == "_" or after.isalnum() or after == "_")


def _is_name_case(found: str, exact: frozenset[str]) -> bool:
    return found[0].isupper() or found in exact


@lru_cache(maxsize=4096)
def _matcher(names: tuple[str, ...]) -> _Matcher | None:
    """Cached: a ticket thread's messages share their names, so most calls build nothing."""
    forms: set[str] = set()
    for name in names:
        parts = [part.strip(_EDGE_PUNCTUATION) for part in name.split()]
        parts = [part for part in parts if len(part) >= 2 and part.lower() not in _TITLES]
        if parts:
            forms.add(" ".join(parts))
            forms.update(part for part in parts if part.lower() not in _NOT_ALONE)
    return _Matcher(forms) if forms else None
