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
import re
import time
from collections.abc import Callable, Sequence

from detect_secrets.core.scan import scan_line
from detect_secrets.settings import default_settings

from flywheel.redaction import redact
from tests.fixtures.redaction_corpus import (
    Found,
    KindScore,
    Planted,
    Sample,
    build_corpus,
    code_snippets,
    score,
)

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


# Held out: written after both engines, tuned on neither (`--corpus held-out`). Names and
# addresses in shapes the planted corpus lacks (lower case, particles, hyphens, initials,
# apostrophes, mid-sentence, after "from"/"per"/"cc:", Irish, Nigerian, Polish, Japanese and
# Indian names; UK flats, US suites and PO boxes, French, Spanish, Australian and Indian
# addresses), a few emails, phones and dates of birth, and capitalised words that are no one:
# products, places, teams. `[KIND|value]` plants a value; names the source passes are none.
HELD_OUT = [
    "thanks [NAME_FREE|aoife], that fixed it",
    "Per [NAME_FREE|Rahul Mehta] the refund went out Tuesday via Apple Pay.",
    "My colleague [NAME_FREE|Anne-Marie Okonkwo-Smith] will call you from the London office.",
    "cc: [NAME_FREE|Fatima Al-Sayed]; [NAME_FREE|Tomasz Wiśniewski]",
    "— [NAME_FREE|Siobhán O'Connor], Support Lead, Data Studio team",
    "Customer: [NAME_FREE|Olusegun Adeyemi]\nPlan: Enterprise\nRegion: EU West",
    "Forwarding from [NAME_FREE|J. R. Hartley] who reported the Export Wizard crash.",
    "Name: [NAME_FREE|Maria de la Cruz]\nDOB: [DOB|14/02/1987]",
    "Please ask [NAME_FREE|Kenji Watanabe] to approve the Windows Server 2019 licence.",
    "Hi team, [NAME_FREE|Priyanka Chaudhary] here: the Jordan and Georgia invoices are wrong.",
    "Signed, [NAME_FREE|Dr Helen Marchetti]",
    "I am writing on behalf of my father, [NAME_FREE|Gustavo Ferreira], date of birth "
    "[DOB|3 March 1951].",
    "Deliver to [ADDRESS|Flat 3, 27 Kingsway, Manchester M1 4AB] before Friday.",
    "Our billing address is [ADDRESS|Suite 300, 500 Market Street, San Francisco, CA 94105].",
    "Send the cheque to [ADDRESS|PO Box 4412, Boise, ID 83701] please.",
    "Office moved to [ADDRESS|14 rue de Rivoli, 75004 Paris].",
    "Dirección: [ADDRESS|Calle Mayor 5, 28013 Madrid]",
    "Ship it to [ADDRESS|Unit 5/18 George St, Sydney NSW 2000] — thanks!",
    "Registered office: [ADDRESS|45 Chowringhee Road, Kolkata 700071]",
    "she lives at [ADDRESS|88 windsor crescent], so the courier can leave it there",
    "Return label for [ADDRESS|1600 Amphitheatre Pkwy, Mountain View, CA 94043] attached.",
    "The parcel for [NAME_FREE|Chen Wei] at [ADDRESS|9 Harbour View Road, Cork T12 X2Y3] "
    "came back.",
    "Reach [NAME_FREE|Kwame Asante] at [EMAIL|kwame.asante@northwind-logistics.io] or "
    "[PHONE|+233 24 412 7788].",
    "Call me on [PHONE|07700 900461] after 5pm, [NAME_FREE|Gareth].",
    "Escalation owner: [NAME_FREE|Ingrid Halvorsen] ([EMAIL|ingrid.h@fjord-analytics.no])",
    # Nothing to find: capitalised words that name no one, nowhere.
    "The Export Wizard in Data Studio fails on Windows Server 2019 since the March update.",
    "Our Customer Success team in New York escalated ticket 48213 to Platform Engineering.",
    "Grace period ends on Monday; Amazon Web Services bills us in US dollars.",
]
HELD_OUT_PLANT = re.compile(r"\[([A-Z_]+)\|([^\]]+)\]")


def held_out_corpus() -> list[Sample]:
    """`HELD_OUT` as samples: each `[KIND|value]` a planted value at its offset."""
    samples = []
    for marked in HELD_OUT:
        text, planted, at = "", [], 0
        for match in HELD_OUT_PLANT.finditer(marked):
            text += marked[at : match.start()]
            planted.append(Planted(len(text), len(text) + len(match[2]), match[1]))
            text += match[2]
            at = match.end()
        samples.append(Sample(text + marked[at:], (), tuple(planted)))
    return samples


def overlap_recall(
    samples: Sequence[Sample], run: Callable[[str, Sequence[str]], Found]
) -> dict[str, float]:
    """Per planted type, the share of items that a redaction of their type at least touches
    (recall counts only those covered whole: a city kept beside a redacted street misses)."""
    touched: dict[str, list[bool]] = {}
    for sample in samples:
        spans = run(sample.text, sample.names).spans
        for item in sample.planted:
            hit = any(
                span.kind == item.kind and span.start < item.end and item.start < span.end
                for span in spans
            )
            touched.setdefault(item.label, []).append(hit)
    return {label: sum(hits) / len(hits) for label, hits in touched.items()}


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


def print_scores(scores: dict[str, KindScore], overlap: dict[str, float]) -> None:
    print(
        f"{'type':10} {'planted':>8} {'found':>6} {'recall':>7} {'touched':>8} {'redacted':>9} "
        f"{'precision':>9}"
    )
    for kind, result in scores.items():
        if not (result.planted or result.redactions):
            continue
        recall = f"{result.recall:>7.3f}" if result.planted else f"{'-':>7}"
        touched = f"{overlap[kind]:>8.3f}" if kind in overlap else f"{'-':>8}"
        precision = f"{result.precision:>9.3f}" if result.redactions else f"{'-':>9}"
        print(
            f"{kind:10} {result.planted:>8} {result.covered:>6} {recall} {touched} "
            f"{result.redactions:>9} {precision}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engine", default="flywheel", help="flywheel, presidio or a module")
    parser.add_argument(
        "--corpus",
        choices=("planted", "held-out"),
        default="planted",
        help="the planted corpus (written beside the flywheel engine), or HELD_OUT's texts "
        "(written after it, tuned on by neither engine; scores only)",
    )
    args = parser.parse_args()

    run = engine(args.engine)
    held_out = args.corpus == "held-out"
    samples, snippets = (held_out_corpus(), []) if held_out else (build_corpus(), code_snippets())
    scores = score(samples, snippets, run)
    print_scores(scores, overlap_recall(samples, run))
    planted = sum(result.planted for result in scores.values())
    print(f"{len(samples)} texts, {planted} planted items, {len(snippets)} code snippets\n")
    if held_out:
        return

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
