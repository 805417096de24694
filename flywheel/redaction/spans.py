"""Found spans, the choice among overlapping ones (no character is replaced twice), and the
lower-casing that keeps offsets."""

from __future__ import annotations

from typing import NamedTuple

# Placeholder types, most specific first. When two finds overlap, the more specific type wins
# (a URL's credentials over the `pass@host.com` an e-mail pattern sees inside them, an IBAN
# over the Luhn-valid 16 digits inside its account number, a checksummed card over a
# phone-shaped digit run), then the longer span.
KINDS = (
    *("SECRET", "IBAN", "CARD", "SSN", "AADHAAR", "NI_NUMBER", "PASSPORT", "DOB"),
    *("EMAIL", "IP", "PHONE", "ADDRESS", "NAME"),
)
_RANK = {kind: rank for rank, kind in enumerate(KINDS)}


class Span(NamedTuple):
    """`text[start:end]` is PII or a secret of type `kind` (one of `KINDS`)."""

    start: int
    end: int
    kind: str


def resolve(found: list[Span]) -> list[Span]:
    """The non-overlapping spans to replace, in text order. Overlapping finds form clusters;
    in each, the most specific type wins, then the longest span, then the leftmost. Sorting
    once and settling clusters apart keeps a text with many finds O(n log n)."""
    if len(found) < 2:
        return found
    ordered = sorted(found)
    chosen: list[Span] = []
    cluster = [ordered[0]]
    cluster_end = ordered[0].end
    for span in ordered[1:]:
        if span.start < cluster_end:
            cluster.append(span)
            cluster_end = max(cluster_end, span.end)
            continue
        chosen += _settle(cluster)
        cluster, cluster_end = [span], span.end
    chosen += _settle(cluster)
    return chosen


def _settle(cluster: list[Span]) -> list[Span]:
    if len(cluster) == 1:
        return cluster
    kept: list[Span] = []
    for span in sorted(cluster, key=_preference):
        if all(span.end <= other.start or other.end <= span.start for other in kept):
            kept.append(span)
    return sorted(kept)


def _preference(span: Span) -> tuple[int, int, int]:
    return _RANK[span.kind], span.start - span.end, span.start


def lower_keeping_offsets(text: str) -> str:
    """`text.lower()`, with the few characters whose lower case is longer (`İ`) kept as they
    are, so that offsets found in the lower-cased text hold in the original."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(char if len(char.lower()) != 1 else char.lower() for char in text)
