"""Benchmark: what writing a full build's member rows costs in this schema, and without
parts of it, beside a raw `COPY` of the items, in one run. A design study for the full-build
goal (<= 5x the COPY; bench.dataset_build): it shows which part of the schema the writing
pays for.

In a scratch PostgreSQL database (created and dropped here) it writes N SFT examples and one
dataset version, then COPYs one member row per item into `dataset_members` (each variant in
a transaction rolled back, best of --rounds):

  as built         random ids (uuid4), the five foreign keys (version and four item kinds)
  time-ordered ids ids that grow with time (as UUIDv7), the five foreign keys
  no foreign keys  random ids, the table's indexes only
  no foreign keys, time-ordered ids
  the version's foreign key only, time-ordered ids

and prints seconds and each against the COPY. The foreign keys are dropped in the scratch
database only, to measure; nothing here proposes that as is (forget relies on their cascade).

    python -m bench.member_write --items 1000000

Needs PostgreSQL (FLYWHEEL_TEST_POSTGRES_URL, as the tests). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

import psycopg

from bench.dataset_build import LOAD_SQL, best_export_s, scratch_domain

COLUMNS = (
    "id, dataset_version_id, split, group_key, weight, until_version, is_new, content_sha256, "
    "ease, sft_example_id"
)
FOREIGN_KEYS = (
    "SELECT conname FROM pg_constraint WHERE conrelid = 'dataset_members'::regclass "
    "AND contype = 'f' ORDER BY conname"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with scratch_domain("support") as (_url, plain, _engine, _sessions, tenant_id, domain_id):
        ids = {"tenant": tenant_id, "domain": domain_id}
        with psycopg.connect(plain, autocommit=True) as connection:
            connection.execute(LOAD_SQL, ids | {"start": 1, "items": args.items})
            connection.execute(
                "INSERT INTO dataset_versions (id, created_at, tenant_id, domain_id, version, "
                "manifest_sha256, recipe, stats) VALUES (gen_random_uuid(), now(), %(tenant)s, "
                "%(domain)s, 1, '', '{}', '{}')",
                ids,
            )
            connection.execute("VACUUM ANALYZE")
            keys = [name for (name,) in connection.execute(FOREIGN_KEYS)]
        copy_s = best_export_s(plain)
        drop_all = [f"ALTER TABLE dataset_members DROP CONSTRAINT {name}" for name in keys]
        drop_items = [
            drop for drop, name in zip(drop_all, keys, strict=True) if "version_id" not in name
        ]
        variants: list[tuple[str, list[str], bool]] = [
            ("as built (random ids, 5 foreign keys)", [], False),
            ("time-ordered ids, 5 foreign keys", [], True),
            ("random ids, no foreign keys", drop_all, False),
            ("time-ordered ids, no foreign keys", drop_all, True),
            ("time-ordered ids, the version's key only", drop_items, True),
        ]
        seconds = {label: float("inf") for label, _, _ in variants}
        for _ in range(args.rounds):  # interleaved: the machine's drift spreads over all
            for label, before, ordered in variants:
                seconds[label] = min(seconds[label], _write_s(plain, before, ordered))
        print(f"{args.items:,} SFT examples, one member row each; {os.cpu_count()} CPUs")
        print(f"{'COPY sft_examples TO STDOUT (best of 3)':<46}{copy_s:>9.2f} s")
        for label, value in seconds.items():
            print(f"{label:<46}{value:>9.2f} s  {value / copy_s:6.2f}x COPY")


def _write_s(plain: str, before: list[str], ordered: bool) -> float:
    """Seconds to COPY one member row per item into dataset_members after the `before`
    statements, rolled back (the rows are made before the clock starts)."""
    with psycopg.connect(plain) as connection:
        for statement in before:
            connection.execute(statement)
        version = connection.execute("SELECT id FROM dataset_versions").fetchone()
        items = connection.execute("SELECT id, content_sha256 FROM sft_examples").fetchall()
        rows = [
            _row(index, item, digest, version[0] if version else None, ordered)
            for index, (item, digest) in enumerate(items)
        ]
        started = time.perf_counter()
        with connection.cursor().copy(f"COPY dataset_members ({COLUMNS}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        elapsed_s = time.perf_counter() - started
        connection.rollback()
    return elapsed_s


def _row(index: int, item: Any, digest: str, version: Any, ordered: bool) -> tuple[Any, ...]:
    if ordered:  # UUIDv7's layout: 48 bits of milliseconds first, then a counter and noise
        millis = time.time_ns() // 1_000_000
        noise = int.from_bytes(os.urandom(2), "big")
        member_id = uuid.UUID(int=(millis << 80) | (index << 16) | noise)
    else:
        member_id = uuid.uuid4()
    return (member_id, version, "train", f"g{index // 5}", 1.0, None, True, digest, 0.0, item)


if __name__ == "__main__":
    main()
