"""Benchmark: decontaminating a million train candidates against a 50k-item eval set.

    python -m bench.decontamination [--train 1000000] [--eval 50000] [--planted 0.01]
                                    [--baseline-train 20000] [--baseline-eval 10000]

Synthetic text: about 80 words (70-90) drawn from a Zipfian vocabulary of 50,000 pseudo-words,
with some punctuation and capitals for the normaliser to remove. Among the train candidates a
`--planted` share each of:

- spans: a clean text with 13-20 consecutive words of a random eval item pasted in, case and
  punctuation changed;
- edits: a random eval item with one to three word edits (substitute, delete or insert).

The train candidates are generated in chunks (a build streams them from the database the same
way) and only the checks are timed, in CPU seconds (shared machine). Measured, one core:

1. building the index: eval grams (n-gram index) and LSH buckets over eval signatures that are
   given, as the stored `minhash` column would give them (signing them is timed apart);
2. the n-gram check alone (`near_duplicate_threshold=None`), the near-duplicate check alone
   (`ngram_words=None`, train signatures given; signing them is timed apart), and both (the
   default) — items/s, and recall of each planted kind and false positives among clean items;
3. side by side on `--baseline-eval` / `--baseline-train` items: a Python set of 13-gram
   strings (lm-evaluation-harness janitor style) against the hashed index, items/s and
   index memory;
4. side by side on the same sample, both checks from texts against both from stored sketches
   (`flywheel.datasets.sketches`, made once per item: their making is timed apart);
5. resident memory (VmRSS) along the way, and the process's peak (VmHWM).

Asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import random
import string
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flywheel.datasets.decontamination import (
    NEAR_DUPLICATE,
    NGRAM_OVERLAP,
    DecontaminationConfig,
    EvalIndex,
)
from flywheel.datasets.sketches import sketch_texts
from flywheel.signals.dedup import DEFAULT_THRESHOLD, minhash_signatures, shingle_hashes

VOCABULARY = 50_000
CHUNK = 50_000
CLEAN, SPAN, EDIT = "clean", "span", "edit"
SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"] + ["th", "ch", "st", "qu"]


def make_vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
    words: dict[str, None] = {}  # insertion-ordered, so the ranks are seeded too
    while len(words) < VOCABULARY:
        words["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4)))] = None
    weights = list(itertools.accumulate(1 / rank for rank in range(1, VOCABULARY + 1)))
    return list(words), weights


@dataclass
class Generator:
    words: list[str]
    cum_weights: list[float]

    def text(self, rng: random.Random) -> str:
        tokens = rng.choices(self.words, cum_weights=self.cum_weights, k=rng.randint(70, 90))
        for position in range(0, len(tokens), rng.randint(8, 14)):
            tokens[position] = tokens[position].capitalize()
            tokens[position - 1] += rng.choice(".,;")
        return " ".join(tokens)

    def span(self, source: str, rng: random.Random) -> str:
        """13-20 words of `source` pasted into a clean text, case and punctuation changed."""
        tokens = source.split()
        width = rng.randint(13, 20)
        start = rng.randrange(len(tokens) - width + 1)
        pasted = " ".join(tokens[start : start + width]).upper().replace(",", " -")
        host = self.text(rng).split()
        cut = rng.randrange(len(host))
        return " ".join([*host[:cut], f'"{pasted}"', *host[cut:]])

    def edit(self, source: str, rng: random.Random) -> str:
        tokens = source.split()
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(1, len(tokens) - 1)
            match rng.choice(["substitute", "delete", "insert"]):
                case "substitute":
                    tokens[position] = rng.choice(self.words)
                case "delete":
                    del tokens[position]
                case "insert":
                    tokens.insert(position, rng.choice(self.words))
        return " ".join(tokens)


@dataclass
class Chunk:
    texts: list[str]
    kinds: list[str]
    sources: list[int]  # the eval item a planted text came from, -1 for clean ones


def train_chunks(
    generator: Generator, evals: list[str], total: int, planted: float, seed: int
) -> Iterator[Chunk]:
    """The train candidates, `CHUNK` at a time, the same for every pass (seeded per chunk)."""
    for first in range(0, total, CHUNK):
        rng = random.Random(seed * 1_000_003 + first)
        chunk = Chunk([], [], [])
        for _ in range(min(CHUNK, total - first)):
            draw, source = rng.random(), rng.randrange(len(evals))
            if draw < planted:
                chunk.texts.append(generator.span(evals[source], rng))
                chunk.kinds.append(SPAN)
            elif draw < 2 * planted:
                chunk.texts.append(generator.edit(evals[source], rng))
                chunk.kinds.append(EDIT)
            else:
                chunk.texts.append(generator.text(rng))
                chunk.kinds.append(CLEAN)
            chunk.sources.append(source if draw < 2 * planted else -1)
        yield chunk


def cpu_timed(action: Callable[[], Any]) -> tuple[Any, float]:
    started = time.process_time()
    result = action()
    return result, time.process_time() - started


def memory_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_note(label: str) -> None:
    print(f"  [{label}: RSS {memory_mb('VmRSS'):,.0f} MiB, peak {memory_mb('VmHWM'):,.0f} MiB]")


@dataclass
class Outcome:
    seconds: float = 0.0
    sign_seconds: float = 0.0
    items: int = 0
    planted: dict[str, int] | None = None
    caught: dict[tuple[str, str], int] | None = None  # (kind, reason) -> count

    def add(self, kinds: list[str], reasons: dict[int, str]) -> None:
        self.planted = self.planted or {}
        self.caught = self.caught or {}
        for kind in kinds:
            self.planted[kind] = self.planted.get(kind, 0) + 1
        for index, reason in reasons.items():
            key = (kinds[index], reason)
            self.caught[key] = self.caught.get(key, 0) + 1
        self.items += len(kinds)


def run_check(
    index: EvalIndex, chunks: Iterator[Chunk], *, with_signatures: bool
) -> tuple[Outcome, list[Chunk]]:
    """Check every chunk; train signatures, when used, are signed first and apart."""
    outcome = Outcome()
    edits: list[Chunk] = []
    for chunk in chunks:
        signatures: list[bytes | None] = [None] * len(chunk.texts)
        if with_signatures:
            signed, seconds = cpu_timed(lambda c=chunk: minhash_signatures([[t] for t in c.texts]))
            signatures, outcome.sign_seconds = signed, outcome.sign_seconds + seconds
        items = zip(range(len(chunk.texts)), chunk.texts, signatures, strict=True)
        reasons, seconds = cpu_timed(lambda i=items: dict(index.contaminated(i)))
        outcome.seconds += seconds
        outcome.add(chunk.kinds, reasons)
        edits.append(Chunk(*_missed_edits(chunk, reasons)))
    return outcome, edits


def _missed_edits(chunk: Chunk, reasons: dict[int, str]) -> tuple[list[str], list[str], list[int]]:
    """The planted edits and whether they were caught (kind 'caught'/'missed'), for the
    exact-Jaccard breakdown."""
    rows = [i for i, kind in enumerate(chunk.kinds) if kind == EDIT]
    return (
        [chunk.texts[i] for i in rows],
        ["caught" if i in reasons else "missed" for i in rows],
        [chunk.sources[i] for i in rows],
    )


def report(name: str, outcome: Outcome) -> None:
    planted, caught = outcome.planted or {}, outcome.caught or {}
    rate = outcome.items / outcome.seconds
    print(f"\n{name}: {outcome.items:,} items in {outcome.seconds:.1f} CPU s = {rate:,.0f}/s")
    if outcome.sign_seconds:
        sign_rate = outcome.items / outcome.sign_seconds
        print(f"  (signing the train texts, when no stored minhash: {sign_rate:,.0f}/s apart)")
    for kind in (SPAN, EDIT, CLEAN):
        by_reason = {r: caught.get((kind, r), 0) for r in (NGRAM_OVERLAP, NEAR_DUPLICATE)}
        total = sum(by_reason.values())
        share = total / max(planted.get(kind, 0), 1)
        label = "false positives" if kind == CLEAN else "recall"
        print(
            f"  {kind:6s} {planted.get(kind, 0):>9,} items, {label} {share:.4f} "
            f"(ngram_overlap {by_reason[NGRAM_OVERLAP]:,}, near_duplicate "
            f"{by_reason[NEAR_DUPLICATE]:,})"
        )


def edit_recall_by_jaccard(chunks: list[Chunk], evals: list[str]) -> None:
    """Near-duplicate recall among planted edits whose exact shingle Jaccard with their source
    reaches the threshold (below it, missing them is the specification), and among those a
    clear 0.05 above it (128 minima estimate J within about 0.03, so pairs just above the
    threshold are missed about half the time, as in `find_near_duplicates`)."""
    margins = {0.0: [0, 0], 0.05: [0, 0]}  # margin -> [edits above, caught]
    for chunk in chunks:
        for text, status, source in zip(chunk.texts, chunk.kinds, chunk.sources, strict=True):
            a, b = shingle_hashes(text), shingle_hashes(evals[source])
            for margin, counts in margins.items():
                if len(a & b) / len(a | b) >= DEFAULT_THRESHOLD + margin:
                    counts[0] += 1
                    counts[1] += status == "caught"
    for margin, (above, caught) in margins.items():
        print(
            f"  edits with exact Jaccard >= {DEFAULT_THRESHOLD + margin:.2f}: {above:,}, "
            f"near-duplicate recall among them {caught / max(above, 1):.4f}"
        )


def janitor_baseline(evals: list[str], train: list[str]) -> tuple[float, float, float, int]:
    """A set of 13-gram strings (lm-evaluation-harness janitor): build s, check s, MiB, hits."""
    table = str.maketrans(string.ascii_uppercase, string.ascii_lowercase, string.punctuation)

    def grams(text: str) -> Iterator[str]:
        tokens = text.translate(table).split()
        return (" ".join(tokens[i : i + 13]) for i in range(len(tokens) - 12))

    before = memory_mb("VmRSS")
    dirt, build_s = cpu_timed(lambda: {gram for text in evals for gram in grams(text)})
    index_mb = memory_mb("VmRSS") - before
    hits, check_s = cpu_timed(lambda: sum(any(g in dirt for g in grams(t)) for t in train))
    return build_s, check_s, index_mb, hits


def side_by_side(args: argparse.Namespace, generator: Generator, evals: list[str]) -> None:
    sample_evals = evals[: args.baseline_eval]
    chunk = next(train_chunks(generator, sample_evals, args.baseline_train, args.planted, 99))
    config = DecontaminationConfig(near_duplicate_threshold=None)
    ours, ours_build_s = cpu_timed(
        lambda: EvalIndex.build(((t, None) for t in sample_evals), config)
    )
    items = enumerate(chunk.texts)
    found, ours_check_s = cpu_timed(lambda: list(ours.contaminated((i, t, None) for i, t in items)))
    build_s, check_s, index_mb, hits = janitor_baseline(sample_evals, chunk.texts)
    n_train = len(chunk.texts)
    print(f"\nside by side, {len(sample_evals):,} eval items, {n_train:,} train items:")
    print(f"  {'':28s} {'build s':>8s} {'check/s':>9s} {'index MiB':>10s} {'caught':>7s}")
    print("  (index MiB: the set's RSS growth; the arrays' exact size for EvalIndex)")
    print(
        f"  {'set of 13-gram strings':28s} {build_s:8.2f} {n_train / check_s:9,.0f} "
        f"{index_mb:10.1f} {hits:7,}"
    )
    print(
        f"  {'hashed (EvalIndex)':28s} {ours_build_s:8.2f} {n_train / ours_check_s:9,.0f} "
        f"{ours.nbytes / 2**20:10.1f} {len(found):7,}"
    )
    print(
        f"  hashed / strings: check {check_s / ours_check_s:.1f}x faster, "
        f"index {index_mb / (ours.nbytes / 2**20):.0f}x smaller "
        "(ours is NFKC + Unicode punctuation, janitor ASCII only)"
    )


def sketched_side_by_side(args: argparse.Namespace, generator: Generator, evals: list[str]) -> None:
    """Both checks from texts (normalised, hashed and signed every time) against the same
    checks from stored sketches (`flywheel.datasets.sketches`: made once per item)."""
    sample_evals = evals[: args.baseline_eval]
    texts = next(train_chunks(generator, sample_evals, args.baseline_train, args.planted, 98)).texts
    config = DecontaminationConfig()

    def from_texts() -> list[tuple[int, str]]:
        index = EvalIndex.build(((t, None) for t in sample_evals), config)
        return list(index.contaminated((i, t, None) for i, t in enumerate(texts)))

    def from_sketches(
        evals_sketched: list[tuple[bytes, bytes]], train_sketched: list[tuple[bytes, bytes]]
    ) -> list[tuple[int, str]]:
        index = EvalIndex.from_sketches(evals_sketched, config)
        return list(index.contaminated_sketches((i, *k) for i, k in enumerate(train_sketched)))

    expected, texts_s = cpu_timed(from_texts)
    (evals_sketched, train_sketched), sketch_s = cpu_timed(
        lambda: (sketch_texts(sample_evals, 13), sketch_texts(texts, 13))
    )
    found, sketches_s = cpu_timed(lambda: from_sketches(evals_sketched, train_sketched))
    total = len(sample_evals) + len(texts)
    print(f"\nboth checks, {len(sample_evals):,} eval items, {len(texts):,} train items:")
    print(f"  from texts (index built, both sides signed): {texts_s:6.2f} CPU s")
    print(f"  sketching every item (once, stored):          {sketch_s:6.2f} CPU s")
    print(f"  from stored sketches (index built, checked):  {sketches_s:6.2f} CPU s")
    print(
        f"  texts / sketches: {texts_s / sketches_s:.1f}x; {total / sketch_s:,.0f} items "
        f"sketched/s; same verdicts: {found == expected}"
    )


def build_indexes(evals: list[str]) -> tuple[EvalIndex, EvalIndex, EvalIndex]:
    signatures, sign_s = cpu_timed(lambda: minhash_signatures([[text] for text in evals]))
    print(f"signing the eval items (setup: stored minhash): {len(evals) / sign_s:,.0f}/s")
    memory_note("eval texts and signatures in memory")
    configs = {
        "n-gram only": DecontaminationConfig(near_duplicate_threshold=None),
        "near-duplicate only": DecontaminationConfig(ngram_words=None),
        "both (default)": DecontaminationConfig(),
    }
    indexes = []
    for name, config in configs.items():
        items = zip(evals, signatures, strict=True)
        index, seconds = cpu_timed(lambda i=items, c=config: EvalIndex.build(i, c))
        print(
            f"index {name:20s} built in {seconds:5.1f} CPU s: {index.gram_count:,} grams, "
            f"{index.signature_count:,} signatures, {index.nbytes / 2**20:,.1f} MiB of arrays"
        )
        indexes.append(index)
    memory_note("three indexes built")
    return indexes[0], indexes[1], indexes[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=1_000_000)
    parser.add_argument("--eval", type=int, default=50_000)
    parser.add_argument("--planted", type=float, default=0.01, help="share of each planted kind")
    parser.add_argument("--baseline-train", type=int, default=20_000)
    parser.add_argument("--baseline-eval", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    memory_note("start")
    rng = random.Random(args.seed)
    generator = Generator(*make_vocabulary(rng))
    evals = [generator.text(rng) for _ in range(args.eval)]
    print(f"{args.eval:,} eval items, {args.train:,} train candidates, {args.planted:.1%} each")
    ngram_index, near_index, both_index = build_indexes(evals)

    def chunks() -> Iterator[Chunk]:
        return train_chunks(generator, evals, args.train, args.planted, args.seed)

    outcome, _ = run_check(ngram_index, chunks(), with_signatures=False)
    report("n-gram check (13-grams)", outcome)
    memory_note("after the n-gram check")
    outcome, edits = run_check(near_index, chunks(), with_signatures=True)
    report(f"near-duplicate check (threshold {DEFAULT_THRESHOLD}, signatures given)", outcome)
    edit_recall_by_jaccard(edits, evals)
    memory_note("after the near-duplicate check")
    outcome, _ = run_check(both_index, chunks(), with_signatures=True)
    report("both checks (the default), signatures given", outcome)
    memory_note("after both")
    side_by_side(args, generator, evals)
    sketched_side_by_side(args, generator, evals)
    memory_note("end")


if __name__ == "__main__":
    main()
