"""Redaction of PII and secrets before anything reaches a training table.

`redact(text, names=..., scope=...)` replaces each find with a realistic surrogate (see
`surrogates`: the same value is the same surrogate within one `scope`, a record such as a
ticket thread or a conversation) and reports how many of each type it replaced. The typed
placeholders (`<NAME>`, `<EMAIL>`) appear only in the report and in `Redaction.typed`, the
form used to compare texts: never in what is stored, so no model learns to write them. What
counts, and what deliberately does not:

- `<EMAIL>`: `local@domain.tld` with an alphabetic top-level domain. Not `python@2.7`,
  `lodash@4.17.21`, `@decorators`, nor scp-style remotes `git@github.com:org/repo`.
- `<PHONE>`: North American numbers with separators (`(415) 555-0132`, `+1 415.555.0132`),
  any number written `+<country code> ...` with 8 to 15 digits, and national numbers with a
  trunk 0 in the usual groupings (`020 7946 0958`, `01 23 45 67 89`). Bare digit runs are ids.
- `<CARD>`: 13-19 digits (spaced or dashed in the usual groups) with a card network's prefix
  and a valid Luhn check digit.
- `<IBAN>`: IBANs, spaced or not, of a registered country's length, mod-97 valid.
- `<SSN>`: US SSNs written `123-45-6789` outside the never-issued ranges, or 9 digits right
  after "SSN" / "social security number".
- `<IP>`: IPv4 and IPv6 addresses that can point at a host, private ranges included. Loopback
  (127.0.0.1, ::1), unspecified (0.0.0.0), multicast and reserved addresses (netmasks,
  broadcast) point at nobody and stay, in code and prose alike; so do dotted version numbers
  after `v`, `==` or `@`.
- `<SECRET>`: provider keys and tokens (AWS, GitHub, GitLab, Slack, Stripe, OpenAI,
  Anthropic, SendGrid, PyPI), JWTs, private-key blocks (to their END line, or to the end of
  the text when it is missing), the userinfo of `scheme://user:password@host`, bearer tokens,
  and values assigned to secret-looking names (`API_KEY=...`, `"password": ...`) when the
  value looks like one (see `credentials.is_secret_value`); the name and `=` stay. Hashes,
  UUIDs, git SHAs and identifiers are not secrets unless assigned to such a name; template
  stand-ins (`${DB_PASSWORD}`, `{password}`, `user:pass` in docs) are not secrets at all.
- `<NAME>`: the person names the caller passes (the source's requester, assignee,
  commenters), as whole words; a lower-case hit counts only if spelled exactly as given. And
  names in free text that their context or faker's name lists show (see `people`).
- `<ADDRESS>`: street addresses with a street type (see `addresses`).
- `<NI_NUMBER>`, `<AADHAAR>`, `<PASSPORT>`, `<DOB>`: UK National Insurance numbers, Aadhaar
  numbers (Verhoeff check), labelled passport numbers and labelled dates of birth (see `ids`).

Overlapping finds resolve to the most specific type, then the longest span (see `spans`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flywheel.redaction.addresses import find_addresses
from flywheel.redaction.credentials import find_secrets
from flywheel.redaction.ids import find_ids
from flywheel.redaction.keys import redaction_key
from flywheel.redaction.names import find_names
from flywheel.redaction.people import find_people, first_name_words
from flywheel.redaction.pii import find_pii
from flywheel.redaction.spans import KINDS, Span, lower_keeping_offsets, resolve
from flywheel.redaction.surrogates import Surrogates

__all__ = [
    "KINDS",
    "Redaction",
    "Span",
    "Surrogates",
    "apply",
    "find_spans",
    "redact",
    "warm",
]


@dataclass(frozen=True)
class Redaction:
    """The redacted text (surrogates in place of what was found), how many of each type it
    replaced, and where each replaced span sat in the original text (offsets only: the report
    never carries the values, nor the surrogates)."""

    text: str
    counts: dict[str, int] = field(default_factory=dict)  # placeholder type -> occurrences
    spans: tuple[Span, ...] = ()
    typed_text: str | None = None  # with `<TYPE>` placeholders; None: the same as `text`

    @property
    def typed(self) -> str:
        """The text with typed placeholders: for reports and for telling texts apart by more
        than what redaction replaced. Never stored as training text."""
        return self.text if self.typed_text is None else self.typed_text

    def report(self) -> dict[str, Any]:
        """The per-record report, as stored beside the record and printed by the CLI."""
        return {
            "total": len(self.spans),
            "counts": dict(self.counts),
            "spans": [
                {"type": kind, "start": start, "end": end} for start, end, kind in self.spans
            ],
        }


def redact(
    text: str,
    *,
    names: Sequence[str] = (),
    scope: str = "",
    key: bytes | None = None,
    people: bool = True,
) -> Redaction:
    """`text` with every PII and secret find replaced by a surrogate; `names` are the person
    names the source knows (requester, assignee, commenters), `scope` the record the text
    belongs to (values keep their surrogate within it), `key` the redaction key (default: the
    deployment's, see `keys`). Without `people`, names in free text are not looked for (code,
    whose test data names people a test expects back)."""
    spans = find_spans(text, names=names, people=people)
    if not spans:
        return Redaction(text)
    surrogates = Surrogates(redaction_key() if key is None else key, scope)
    return apply(text, spans, surrogates)


def apply(text: str, spans: Sequence[Span], surrogates: Surrogates) -> Redaction:
    """The `Redaction` of `text` whose finds are `spans` (from `find_spans`)."""
    pieces: list[str] = []
    typed: list[str] = []
    counts: dict[str, int] = {}
    position = 0
    for start, end, kind in spans:
        between = text[position:start]
        pieces += (between, surrogates(kind, text[start:end]))
        typed += (between, "<", kind, ">")
        counts[kind] = counts.get(kind, 0) + 1
        position = end
    pieces.append(text[position:])
    typed.append(text[position:])
    return Redaction("".join(pieces), counts, tuple(spans), "".join(typed))


def find_spans(text: str, *, names: Sequence[str] = (), people: bool = True) -> list[Span]:
    """The non-overlapping spans `redact` replaces, in text order."""
    lowered = lower_keeping_offsets(text)
    found = find_secrets(text, lowered)
    found += find_pii(text, lowered)
    found += find_ids(text, lowered)
    found += find_addresses(text, lowered)
    if people:
        found += find_people(text, lowered)
    if names:
        found += find_names(text, lowered, tuple(names))
    return resolve(found)


def warm() -> None:
    """Load what redaction reads on first use (faker's name lists, about 0.4 s), e.g. in a
    thread while a query runs, so that the first text redacted does not wait for it."""
    first_name_words()
