"""Benchmark: redaction quality per type on the planted corpus, and its cost per text.

    python -m bench.redaction [--repeat 5] [--engine flywheel|presidio|MODULE]

Prints, per planted type, the planted items, how many were covered and recall; per found type,
the redactions and precision (code snippets that must survive count as false positives when
touched; NAME_FREE is a name the source did not pass, found as a NAME); then throughput on
the corpus texts, on clean PII-free support text of ~500 characters (the common case: most
texts the feedback compiler redacts hold nothing), and on the same clean text with three
person names to look for. For scale, detect-secrets' own ad-hoc scanner (`scan_line`, secrets
only) runs on a few of the clean texts in the same run. Asserts nothing.

`--engine presidio` scores Microsoft Presidio's analyzer (`bench.redaction_presidio`: spaCy's
small English model from the package index, plus its UK NINO, Aadhaar and passport
recognizers) on the same corpus, for comparison; it is not a dependency of flywheel. Any other
MODULE with a `redact(text, names=...)` is scored the same way: an older flywheel engine, say,
renamed so that it does not shadow today's (the editable install wins over PYTHONPATH):

    git archive <commit> flywheel/redaction | tar -x -C /tmp/base
    mv /tmp/base/flywheel/redaction /tmp/base/oldredaction
    sed -i s/flywheel.redaction/oldredaction/g /tmp/base/oldredaction/*.py
    PYTHONPATH=/tmp/base python -m bench.redaction --engine oldredaction
"""

from __future__ import annotations

import argparse
import importlib
import random
import time
from collections.abc import Callable, Sequence

from detect_secrets.core.scan import scan_line
from detect_secrets.settings import default_settings

from flywheel.redaction import redact
from tests.fixtures.redaction_corpus import Found, KindScore, build_corpus, code_snippets, score

CLEAN_SENTENCES = [
    "Thanks for getting back to me so quickly.",
    "I upgraded to version 2.4.1 on 2024-03-15 and the export job still fails after 30 minutes.",
    "The dashboard shows 1,204 pending rows and the retry button does nothing.",
    "Our team of 12 relies on this report every Monday, so a workaround would help a lot.",
    "I attached the log from the last run; the key line says the worker was killed.",
    "Could you check whether the new batch size setting is respected?",
    "We pinned numpy==1.26.4 and the legacy tool still needs python@2.7.",
    "The invoice for order #48213 lists the annual plan twice.",
    "After the password reset flow the session token expired immediately.",
    "Let me know if you need anything else from our side.",
    "The assistant answered in French although the account language is English.",
    "It works on 127.0.0.1:8080 locally but not behind the load balancer.",
]


def clean_texts(count: int, length: int = 500, seed: int = 7) -> list[str]:
    """`count` PII-free texts of about `length` characters, shuffled from `CLEAN_SENTENCES`."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts: list[str] = []
        while sum(len(part) + 1 for part in parts) < length:
            parts.append(rng.choice(CLEAN_SENTENCES))
        texts.append(" ".join(parts))
    return texts


def per_text_us(run: Callable[[str], object], texts: Sequence[str], repeat: int) -> float:
    """Best of `repeat` passes over `texts`, in CPU microseconds per text: process time, not
    wall time, so that other work on a shared machine does not count against this one."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for text in texts:
            run(text)
        best = min(best, time.process_time() - start)
    return best / len(texts) * 1e6


def detect_secrets_scan(text: str) -> object:
    return list(scan_line(text))


def engine(name: str) -> Callable[[str, Sequence[str]], Found]:
    """`redact(text, names)` of the engine called `name`."""
    if name == "presidio":
        from bench.redaction_presidio import presidio_redact

        return presidio_redact
    engine_redact = redact if name == "flywheel" else importlib.import_module(name).redact
    return lambda text, names: engine_redact(text, names=names)


def print_scores(scores: dict[str, KindScore]) -> None:
    print(f"{'type':10} {'planted':>8} {'found':>6} {'recall':>7} {'redacted':>9} {'precision':>9}")
    for kind, result in scores.items():
        recall = f"{result.recall:>7.3f}" if result.planted else f"{'-':>7}"
        precision = f"{result.precision:>9.3f}" if result.redactions else f"{'-':>9}"
        print(
            f"{kind:10} {result.planted:>8} {result.covered:>6} {recall} "
            f"{result.redactions:>9} {precision}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engine", default="flywheel", help="flywheel, presidio or a module")
    args = parser.parse_args()

    run = engine(args.engine)
    samples, snippets = build_corpus(), code_snippets()
    scores = score(samples, snippets, run)
    print_scores(scores)
    planted = sum(result.planted for result in scores.values())
    print(f"{len(samples)} texts, {planted} planted items, {len(snippets)} code snippets\n")

    clean = clean_texts(200 if args.engine == "presidio" else 2000)
    names = ("Jane Doe", "Priya Okafor", "Søren Lindqvist")
    corpus_texts = [sample.text for sample in samples] + snippets
    average = sum(map(len, corpus_texts)) // len(corpus_texts)
    rows = [
        (f"planted corpus (avg {average} chars)", lambda t: run(t, ()), corpus_texts),
        ("clean text (~500 chars)", lambda t: run(t, ()), clean),
        ("clean text + 3 names", lambda t: run(t, names), clean),
    ]
    print(f"{'throughput':38} {'texts/s':>10} {'us/text':>9}")
    timings = {}
    for label, call, texts in rows:
        us = per_text_us(call, texts, 1 if args.engine == "presidio" else args.repeat)
        timings[label] = us
        print(f"{label:38} {1e6 / us:>10,.0f} {us:>9.1f}")
    with default_settings():
        us = per_text_us(detect_secrets_scan, clean[:20], 1)
    ratio = us / timings["clean text (~500 chars)"]
    print(f"{'detect-secrets scan_line, clean text':38} {1e6 / us:>10,.0f} {us:>9.1f}")
    print(f"\n{args.engine} on clean text: {ratio:,.1f}x the speed of detect-secrets' scanner")


if __name__ == "__main__":
    main()
