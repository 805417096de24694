"""The judgement rules: all the evidence about one prompt in, weighted pairs, SFT examples and
labels out. Pure functions of their input, no database: the same evidence always gives the
same items with the same weights, which is what makes recompiling a prompt a no-op.

Scores are in quarters (0..4): thumbs down 0, up 4; stars s -> s - 1; outcome failure 0,
success 4. A response's score is the mean of its raters' latest scores, over 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flywheel.signals.compile.turns import edit_text

HALF_LIFE_DAYS = 90.0
US_PER_DAY = 86_400_000_000
MAX_SCORED_RESPONSES = 32  # responses of one prompt paired by score: at most 496 pairs
RATING_BIT, OUTCOME_BIT = 1, 2
KIND_NAMES = ((RATING_BIT, "rating"), (OUTCOME_BIT, "outcome"))


@dataclass(slots=True)
class Scores:
    """The latest score of each rater of one response (ratings and outcomes alike)."""

    raters: int = 0
    total_quarters: int = 0
    newest_us: int = 0
    kind_bits: int = 0
    refs: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return self.total_quarters / (4 * self.raters)

    def add(self, raters: int, total: int, newest_us: int, kind_bits: int, refs: list[str]) -> None:
        self.raters += raters
        self.total_quarters += total
        self.newest_us = max(self.newest_us, newest_us)
        self.kind_bits |= kind_bits
        self.refs += refs

    def kinds(self) -> set[str]:
        return {name for bit, name in KIND_NAMES if self.kind_bits & bit}


@dataclass(slots=True)
class Votes:
    """Raters who said, by a comparison or a correction, that `chosen` beats `rejected`."""

    raters: int = 0
    newest_us: int = 0
    refs: list[str] = field(default_factory=list)

    def add(self, raters: int, newest_us: int, refs: list[str]) -> None:
        self.raters += raters
        self.newest_us = max(self.newest_us, newest_us)
        self.refs += refs


@dataclass
class PromptEvidence:
    """Everything said about one prompt. Texts are keyed by their normalised form, so two
    spellings of one response (trailing spaces, CRLF) are one response; `texts` keeps the
    first spelling seen of each."""

    texts: dict[str, str] = field(default_factory=dict)
    scores: dict[str, Scores] = field(default_factory=dict)
    comparisons: dict[tuple[str, str], Votes] = field(default_factory=dict)  # (chosen, rejected)
    corrections: dict[tuple[str, str], Votes] = field(default_factory=dict)  # (original, fixed)
    ties: int = 0

    @property
    def newest_us(self) -> int:
        newest = max((item.newest_us for item in self.scores.values()), default=0)
        for votes in (self.comparisons, self.corrections):
            newest = max(newest, max((item.newest_us for item in votes.values()), default=0))
        return newest


@dataclass(frozen=True, slots=True)
class PairOut:
    chosen: str
    rejected: str
    weight: float
    why: str
    refs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SftOut:
    completion: str
    weight: float
    refs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LabelOut:
    completion: str
    is_desirable: bool
    weight: float
    why: str
    refs: tuple[str, ...]


@dataclass
class Verdicts:
    """What one prompt's evidence supports (texts are the `texts` spellings)."""

    pairs: list[PairOut] = field(default_factory=list)
    sft: list[SftOut] = field(default_factory=list)
    labels: list[LabelOut] = field(default_factory=list)
    conflicts: int = 0
    conflicts_dropped: int = 0


@dataclass(slots=True)
class _Side:
    """The evidence that one response beats another, summed over kinds."""

    weight: float = 0.0
    kinds: set[str] = field(default_factory=set)
    refs: list[str] = field(default_factory=list)

    def add(self, weight: float, kinds: set[str], refs: list[str]) -> None:
        self.weight += weight
        self.kinds |= kinds
        self.refs += refs


def agreement(raters: int) -> float:
    """2n/(n+1): 1 for one rater, 1.5 for three, approaching 2: more raters, more weight."""
    return 2 * raters / (raters + 1)


def decay(age_us: int) -> float:
    """Halves every HALF_LIFE_DAYS of age (age counted from the prompt's newest event)."""
    return float(0.5 ** (age_us / (HALF_LIFE_DAYS * US_PER_DAY)))


def edit_precision(original: str, corrected: str) -> float:
    """1 - changed/2, where `changed` is the share of the longer text lying between the longest
    common prefix and suffix: 1.0 for a one-character fix, 0.5 for a full rewrite. A small edit
    points at exactly what was wrong; a rewrite says less about the original's flaw."""
    longest = max(len(original), len(corrected))
    if longest == 0:
        return 1.0
    prefix = _common_prefix(original, corrected)
    room = min(len(original), len(corrected)) - prefix
    suffix = min(_common_prefix(original[::-1], corrected[::-1]), room)
    return 1.0 - (longest - prefix - suffix) / longest / 2


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix, by bisection over slices (compared in C, not per char)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def judge(evidence: PromptEvidence) -> Verdicts:
    """Pairs (after resolving conflicts), then SFT examples from standing corrections, then
    labels for the scored responses that no standing pair covers."""
    newest = evidence.newest_us
    sides: dict[tuple[str, str], _Side] = {}
    _score_judgements(evidence, newest, sides)
    _vote_judgements(evidence, newest, sides)
    verdicts = Verdicts()
    standing = _resolve(sides, verdicts)
    verdicts.pairs = [
        PairOut(evidence.texts[chosen], evidence.texts[rejected], weight, why, refs)
        for (chosen, rejected), (weight, why, refs) in standing.items()
        # a blank response (a model that said nothing) is no side of a pair: both sides of a
        # preference need text; its correction still becomes an SFT example below
        if evidence.texts[chosen].strip() and evidence.texts[rejected].strip()
    ]
    verdicts.sft = _sft(evidence, standing)
    verdicts.labels = _labels(evidence, standing, newest)
    return verdicts


def _side(sides: dict[tuple[str, str], _Side], chosen: str, rejected: str) -> _Side:
    found = sides.get((chosen, rejected))
    if found is None:
        found = sides[chosen, rejected] = _Side()
    return found


def _score_judgements(
    evidence: PromptEvidence, newest: int, sides: dict[tuple[str, str], _Side]
) -> None:
    """Every two scored responses whose means differ: the higher beats the lower, weighted by
    the margin, by the raters of the less-rated side, and by the age of the newer evidence.
    A prompt with very many responses (a greeting) pairs only its MAX_SCORED_RESPONSES most
    rated ones; the others can still be labelled."""
    scored = sorted(evidence.scores.items(), key=lambda item: (-item[1].raters, item[0]))
    scored = sorted(scored[:MAX_SCORED_RESPONSES])
    for index, (key_a, a) in enumerate(scored):
        for key_b, b in scored[index + 1 :]:
            if a.total_quarters * b.raters == b.total_quarters * a.raters:
                continue  # equal means (compared exactly, in integers): no preference
            high, low = (key_a, key_b) if a.mean > b.mean else (key_b, key_a)
            weight = (
                abs(a.mean - b.mean)
                * agreement(min(a.raters, b.raters))
                * decay(newest - max(a.newest_us, b.newest_us))
            )
            _side(sides, high, low).add(weight, a.kinds() | b.kinds(), a.refs + b.refs)


def _vote_judgements(
    evidence: PromptEvidence, newest: int, sides: dict[tuple[str, str], _Side]
) -> None:
    for (chosen, rejected), votes in sorted(evidence.comparisons.items()):
        weight = agreement(votes.raters) * decay(newest - votes.newest_us)
        _side(sides, chosen, rejected).add(weight, {"comparison"}, votes.refs)
    for (original, fixed), votes in sorted(evidence.corrections.items()):
        precision = edit_precision(edit_text(original), edit_text(fixed))
        weight = agreement(votes.raters) * precision * decay(newest - votes.newest_us)
        _side(sides, fixed, original).add(weight, {"correction"}, votes.refs)


Standing = dict[tuple[str, str], tuple[float, str, tuple[str, ...]]]


def _resolve(sides: dict[tuple[str, str], _Side], verdicts: Verdicts) -> Standing:
    """One pair per two responses. Judged both ways (a conflict): the side with more evidence
    weight wins with the difference as its weight; equal weights drop the pair."""
    standing: Standing = {}
    for (chosen, rejected), side in sorted(sides.items()):
        if chosen == rejected:
            continue  # one response compared with itself: no signal
        other = sides.get((rejected, chosen))
        if other is None:
            standing[chosen, rejected] = (side.weight, _why(side.kinds), _refs(side.refs))
            continue
        if chosen > rejected:
            continue  # a conflict is settled once, from its lexically first side
        verdicts.conflicts += 1
        if math.isclose(side.weight, other.weight, rel_tol=1e-9, abs_tol=1e-12):
            verdicts.conflicts_dropped += 1
            continue
        win, lose, key = (
            (side, other, (chosen, rejected))
            if side.weight > other.weight
            else (other, side, (rejected, chosen))
        )
        why = f"{_why(win.kinds)}; outweighed {_why(lose.kinds)}"
        standing[key] = (win.weight - lose.weight, why, _refs(win.refs + lose.refs))
    return standing


def _sft(evidence: PromptEvidence, standing: Standing) -> list[SftOut]:
    """A corrected text is an SFT example while its correction pair stands (the strongest one,
    when several responses were corrected to the same text)."""
    best: dict[str, tuple[float, tuple[str, ...]]] = {}
    for original, fixed in sorted(evidence.corrections):
        pair = standing.get((fixed, original))
        if pair is not None and pair[0] > best.get(fixed, (0.0, ()))[0]:
            best[fixed] = (pair[0], pair[2])
    return [SftOut(evidence.texts[fixed], weight, refs) for fixed, (weight, refs) in best.items()]


def _labels(evidence: PromptEvidence, standing: Standing, newest: int) -> list[LabelOut]:
    """A scored response in no standing pair is labelled on its own (KTO-style): desirable above
    a mean of 1/2, undesirable below, none at exactly 1/2; weight |2 mean - 1| x agreement x
    recency."""
    paired = {key for pair in standing for key in pair}
    labels = []
    for key, scores in sorted(evidence.scores.items()):
        if key in paired or scores.total_quarters == 2 * scores.raters:
            continue
        weight = (
            abs(2 * scores.mean - 1) * agreement(scores.raters) * decay(newest - scores.newest_us)
        )
        labels.append(
            LabelOut(
                evidence.texts[key],
                scores.mean > 0.5,
                weight,
                _why(scores.kinds()),
                _refs(scores.refs),
            )
        )
    return labels


def _why(kinds: set[str]) -> str:
    return "+".join(sorted(kinds))


def _refs(refs: list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(refs)))
