"""Benchmark: the near-duplicate pass over synthetic support replies, with planted near-dups.

    python -m bench.near_duplicates [--docs 100000] [--planted 0.1] [--baseline-docs 10000]

Generates seeded support-style documents (300-800 characters) of which a known share are
copies of an earlier original with one to three small word edits, then measures, one core:

1. signatures: `minhash_signatures` docs/s (batched, and one at a time), beside datasketch
   `MinHash.bulk` (word 3-grams, its default affine32 scheme) on the first `--baseline-docs`;
2. banding + verification: `find_near_duplicates` docs/s, beside datasketch `MinHashLSH`
   (same bands, same ordered canonical-only matching) on the same signatures;
3. the full database pass, `link_near_duplicates` on PostgreSQL (a scratch database created
   and dropped, as the tests do), with the documents stored as sft_examples; then a second
   pass with nothing new;

and the recall and precision of the planted near-duplicates among the links stored. Asserts
nothing: the machines here are shared and noisy.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg
from datasketch import LeanMinHash, MinHash, MinHashLSH
from psycopg.types.json import Jsonb
from sqlalchemy import make_url, select

from flywheel import migrate
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.settings import Settings
from flywheel.signals.dedup import (
    DEFAULT_THRESHOLD,
    NUM_PERM,
    band_shape,
    find_near_duplicates,
    link_near_duplicates,
    minhash_signature,
    minhash_signatures,
    shingle_hashes,
)
from flywheel.signals.models import SftExample
from flywheel.tenancy import service as tenancy
from tests.conftest import create_postgres_database, drop_postgres_database

NAMES = ["Maria", "John", "Aisha", "Wei", "Olga", "Pedro", "Fatima", "Ken", "Lena", "Omar"]
PRODUCTS = ["Pro plan", "Team plan", "mobile app", "API", "dashboard", "export tool", "invoice"]
OPENERS = ["Hi {name},", "Hello {name},", "Dear {name},", "Thanks for writing in, {name}."]
CLOSERS = ["Best regards, {agent}", "Kind regards, {agent}", "Cheers, {agent}", "Thanks, {agent}"]
SENTENCES = [
    "I checked order {order} and the charge of {amount} dollars was taken on {date}.",
    "The {product} had an outage between {hour}:00 and {hour2}:30 UTC on {date}.",
    "Your refund of {amount} dollars is on its way and should arrive within {days} days.",
    "I have moved your account from the {product} to the {product2} as you asked.",
    "Please clear your browser cache and sign in again to see the new {product}.",
    "Our engineers traced the error {code} to a bad deploy and rolled it back.",
    "The invoice {order} lists {seats} seats because {seats2} users were added on {date}.",
    "You can export every report as CSV from the {product} under Settings, then Data.",
    "I reset the two-factor device on your account, so the next sign-in will ask for a new one.",
    "The webhook to your endpoint failed {seats} times with status {code} since {date}.",
    "Discounts apply from the next billing cycle, which starts on {date}.",
    "I escalated ticket {order} to our billing team, who answer within {days} business days.",
    "The {product} limits you to {seats} requests per second; above that you get error {code}.",
    "Your trial of the {product} ends on {date}, after which the card on file is charged.",
    "We cannot change the legal name on past invoices, but {order} onwards will show the new one.",
    "Deleting a workspace removes its {seats} projects for good after {days} days.",
    "I merged the duplicate accounts, keeping the one created on {date} with {seats} seats.",
    "The latency spike you saw at {hour}:15 came from a slow database failover.",
    "Single sign-on is available on the {product2}, not on the {product}.",
    "Your data is stored in the EU region, in line with the agreement signed on {date}.",
    "The mobile app crash on version {hour}.{seats} is fixed in the release out on {date}.",
    "If the problem comes back, reply with the request id {code}-{order} and the time it failed.",
]
QUESTIONS = [
    "Why was I charged twice for order {order}?",
    "The {product} keeps failing with {code}, can you help?",
    "How do I move from the {product} to the {product2}?",
    "When will my refund of {amount} dollars arrive?",
    "Can I get an invoice with our new company name?",
    "Our webhook stopped working on {date}, what changed?",
    "Is my data stored in the EU?",
    "I can't sign in since {date}, please help.",
]
FILLER = ["really", "also", "now", "still", "today", "again", "just", "quickly", "fully", "soon"]


def fill(template: str, rng: random.Random) -> str:
    return template.format(
        name=rng.choice(NAMES),
        agent=rng.choice(NAMES),
        product=rng.choice(PRODUCTS),
        product2=rng.choice(PRODUCTS),
        order=f"#{rng.randrange(10**5, 10**6)}",
        amount=rng.randrange(5, 2_000),
        date=f"{rng.choice(['March', 'April', 'May', 'June'])} {rng.randint(1, 28)}",
        hour=rng.randrange(24),
        hour2=rng.randrange(24),
        days=rng.randint(2, 14),
        seats=rng.randint(2, 400),
        seats2=rng.randint(2, 40),
        code=rng.choice(["E429", "E500", "E503", "E401", "E1042", "X77"]),
    )


def original(rng: random.Random) -> str:
    while True:
        body = [fill(sentence, rng) for sentence in rng.sample(SENTENCES, rng.randint(3, 8))]
        parts = [fill(rng.choice(OPENERS), rng), *body, fill(rng.choice(CLOSERS), rng)]
        text = " ".join(parts)
        if 300 <= len(text) <= 800:
            return text


def edited(text: str, rng: random.Random) -> str:
    """One to three word edits: substitute, delete or insert a word."""
    words = text.split()
    for _ in range(rng.randint(1, 3)):
        position = rng.randrange(1, len(words) - 1)
        match rng.choice(["substitute", "delete", "insert"]):
            case "substitute":
                words[position] = rng.choice(FILLER)
            case "delete":
                del words[position]
            case "insert":
                words.insert(position, rng.choice(FILLER))
    return " ".join(words)


@dataclass
class Corpus:
    """Support replies and the questions they answer; a planted copy keeps its question."""

    prompts: list[str]
    texts: list[str]
    source: dict[int, int]  # planted near-duplicate -> the original it was edited from

    def fields(self, index: int) -> tuple[str, str]:
        """What the pass signs for an sft_example: (the prompt's contents, the completion)."""
        return self.prompts[index], self.texts[index]


def make_corpus(count: int, planted: float, seed: int) -> Corpus:
    rng = random.Random(seed)
    corpus = Corpus([], [], {})
    originals: list[int] = []
    for index in range(count):
        if originals and rng.random() < planted:
            source = corpus.source[index] = rng.choice(originals)
            corpus.prompts.append(corpus.prompts[source])
            corpus.texts.append(edited(corpus.texts[source], rng))
        else:
            originals.append(index)
            corpus.prompts.append(fill(rng.choice(QUESTIONS), rng))
            corpus.texts.append(original(rng))
    return corpus


def timed(action: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = action()
    return result, time.perf_counter() - started


def datasketch_signatures(fields: list[tuple[str, str]]) -> list[MinHash]:
    """Word 3-grams of both fields, each tagged with its field, hashed by datasketch."""

    def shingles(index: int, text: str) -> list[bytes]:
        words = text.lower().split()
        grams = zip(words, words[1:], words[2:], strict=False)
        return [f"{index} {' '.join(gram)}".encode() for gram in grams]

    sets = [shingles(0, prompt) + shingles(1, text) for prompt, text in fields]
    return MinHash.bulk(sets, num_perm=NUM_PERM)


def datasketch_links(
    signatures: np.ndarray, threshold: float
) -> tuple[list[tuple[int, int]], float]:
    """The same ordered, canonical-only matching, on datasketch's index."""
    sketches = [LeanMinHash(seed=1, hashvalues=row, scheme="affine32") for row in signatures]

    def run() -> list[tuple[int, int]]:
        index = MinHashLSH(threshold=threshold, num_perm=NUM_PERM, params=band_shape(threshold))
        links = []
        for row, sketch in enumerate(sketches):
            matches = sorted(
                key for key in index.query(sketch) if sketch.jaccard(sketches[key]) >= threshold
            )
            if matches:
                links.append((row, matches[0]))
            else:
                index.insert(row, sketch, check_duplication=False)
        return links

    return timed(run)  # building the sketches is left out of datasketch's time


def insert_documents(url: str, corpus: Corpus) -> tuple[uuid.UUID, list[uuid.UUID]]:
    settings = Settings(database_url=url)
    engine = make_engine(settings)
    with unit_of_work(make_session_factory(engine)) as session:
        tenant = tenancy.create_tenant(session=session, name="bench")
        domain = tenancy.create_domain(session=session, tenant=tenant, name="support")
        tenant_id, domain_id = tenant.id, domain.id
    engine.dispose()
    ids = [uuid.uuid4() for _ in corpus.texts]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    columns = (
        "id, created_at, tenant_id, domain_id, source_kind, group_key, content_sha256, "
        "ingestor_version, redaction_report, weight, messages, completion"
    )
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with (
        psycopg.connect(dsn) as db,
        db.cursor().copy(f"COPY sft_examples ({columns}) FROM STDIN") as copy,
    ):
        for index, row_id in enumerate(ids):
            created = start + timedelta(milliseconds=index)
            provenance = ["api", f"g{index}", f"{index:064x}", "bench", Jsonb({}), 1.0]
            prompt, text = corpus.fields(index)
            messages = Jsonb([{"role": "user", "content": prompt}])
            copy.write_row([row_id, created, tenant_id, domain_id, *provenance, messages, text])
    return domain_id, ids


def database_pass(url: str, domain_id: uuid.UUID) -> tuple[dict[str, int], float]:
    engine = make_engine(Settings(database_url=url))
    sessions = make_session_factory(engine)

    def run() -> dict[str, int]:
        with unit_of_work(sessions) as session:
            return link_near_duplicates(session, domain_id=domain_id)

    counts, seconds = timed(run)
    engine.dispose()
    return counts, seconds


def stored_links(url: str, ids: list[uuid.UUID]) -> list[tuple[int, int]]:
    position = {row_id: index for index, row_id in enumerate(ids)}
    engine = make_engine(Settings(database_url=url))
    with make_session_factory(engine)() as session:
        rows = session.execute(
            select(SftExample.id, SftExample.duplicate_of_id).where(
                SftExample.duplicate_of_id.is_not(None)
            )
        ).all()
    engine.dispose()
    return sorted((position[row], position[canonical]) for row, canonical in rows)


def quality(corpus: Corpus, links: list[tuple[int, int]], threshold: float) -> dict[str, float]:
    """Recall over the planted near-duplicates (all, and those truly above the threshold);
    precision: links to the planted source (or to the source's own canonical)."""
    linked = dict(links)
    shingles: dict[int, set[int]] = {}

    def jaccard(left: int, right: int) -> float:
        for index in (left, right):
            if index not in shingles:
                shingles[index] = shingle_hashes(*corpus.fields(index))
        a, b = shingles[left], shingles[right]
        return len(a & b) / len(a | b)

    def is_right(row: int, canonical: int) -> bool:
        source = corpus.source.get(row)
        return source is not None and canonical in (source, linked.get(source))

    above = [row for row, source in corpus.source.items() if jaccard(row, source) >= threshold]
    clear = [row for row in above if jaccard(row, corpus.source[row]) >= threshold + 0.05]
    wrong = [(row, canonical) for row, canonical in links if not is_right(row, canonical)]
    return {
        "planted": len(corpus.source),
        "planted_above_threshold": len(above),
        "recall_all": sum(is_right(row, linked.get(row, -1)) for row in corpus.source)
        / max(len(corpus.source), 1),
        "recall_above_threshold": sum(is_right(row, linked.get(row, -1)) for row in above)
        / max(len(above), 1),
        "planted_above_threshold+0.05": len(clear),
        "recall_above_threshold+0.05": sum(is_right(row, linked.get(row, -1)) for row in clear)
        / max(len(clear), 1),
        "links": len(links),
        "precision_planted": 1 - len(wrong) / max(len(links), 1),
        "links_not_planted": len(wrong),
        "links_below_threshold": sum(
            jaccard(row, canonical) < threshold for row, canonical in wrong
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--planted", type=float, default=0.1, help="share of near-duplicates")
    parser.add_argument("--baseline-docs", type=int, default=10_000)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    corpus = make_corpus(args.docs, args.planted, args.seed)
    texts = corpus.texts
    fields = [corpus.fields(index) for index in range(len(texts))]
    baseline = fields[: args.baseline_docs]
    print(
        f"{len(texts)} documents, {len(corpus.source)} planted near-duplicates, "
        f"mean {np.mean([len(t) for t in texts]):.0f} chars; "
        f"bands x rows = {band_shape(args.threshold)}"
    )

    blobs, sign_s = timed(lambda: minhash_signatures(fields))
    _, ours_sample_s = timed(lambda: minhash_signatures(baseline))
    _, one_by_one_s = timed(lambda: [minhash_signature(*item) for item in baseline])
    _, datasketch_s = timed(lambda: datasketch_signatures(baseline))
    signatures = np.frombuffer(b"".join(blobs), "<u4").reshape(len(texts), NUM_PERM)

    every = np.ones(len(texts), dtype=bool)
    links, lsh_s = timed(
        lambda: find_near_duplicates(
            signatures, is_new=every, is_canonical=every, threshold=args.threshold
        )
    )
    sample = signatures[: args.baseline_docs]
    ours_sample, lsh_sample_s = timed(
        lambda: find_near_duplicates(
            sample,
            is_new=every[: len(sample)],
            is_canonical=every[: len(sample)],
            threshold=args.threshold,
        )
    )
    theirs_sample, datasketch_lsh_s = datasketch_links(sample, args.threshold)

    url = create_postgres_database()
    try:
        migrate.upgrade(url)
        (domain_id, ids), insert_s = timed(lambda: insert_documents(url, corpus))
        counts, pass_s = database_pass(url, domain_id)
        again, again_s = database_pass(url, domain_id)
        db_links = stored_links(url, ids)
    finally:
        drop_postgres_database(url)

    n, m = len(texts), len(baseline)
    rows = [
        ("signatures (minhash_signatures)", n, sign_s),
        (f"  same {m} docs, ours", m, ours_sample_s),
        (f"  same {m} docs, ours one at a time (minhash_signature)", m, one_by_one_s),
        (f"  same {m} docs, datasketch MinHash.bulk", m, datasketch_s),
        ("banding + verify (find_near_duplicates)", n, lsh_s),
        (f"  same {m} docs, ours", m, lsh_sample_s),
        (f"  same {m} docs, datasketch MinHashLSH", m, datasketch_lsh_s),
        ("COPY into sft_examples (setup, not the pass)", n, insert_s),
        ("DB pass, PostgreSQL (sign, store, band, link, commit)", n, pass_s),
        ("DB pass again, nothing new", n, again_s),
    ]
    print(f"\n{'step':58s} {'docs':>8s} {'seconds':>8s} {'docs/s':>9s}")
    for label, docs, seconds in rows:
        print(f"{label:58s} {docs:8d} {seconds:8.2f} {docs / seconds:9.0f}")
    print(f"\nsignatures: ours / datasketch = {datasketch_s / ours_sample_s:.1f}x faster")
    print(
        f"banding:    ours / datasketch = {datasketch_lsh_s / lsh_sample_s:.1f}x faster; "
        f"same links: {ours_sample == theirs_sample}"
    )
    print(
        f"DB pass linked {counts['sft_examples']} rows; second pass linked "
        f"{again['sft_examples']}; DB links == in-memory links: {db_links == links}"
    )
    print("\nstored links vs the planted near-duplicates (exact Jaccard of the shingle sets):")
    for name, value in quality(corpus, db_links, args.threshold).items():
        print(f"  {name:30s} {value:.3f}" if isinstance(value, float) else f"  {name:30s} {value}")


if __name__ == "__main__":
    main()
