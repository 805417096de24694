"""Benchmark: building a dataset version, beside a raw `COPY` of the same rows, in one run;
and the export's peak memory as the version grows.

In a scratch PostgreSQL database (created and dropped here) it writes N SFT examples with
set-based SQL (varied synthetic support text, five items per group), then measures

  (a) `COPY (SELECT * FROM sft_examples) TO STDOUT` into a null sink (best of 3),
  (b) `build_dataset_version` of the domain (split, decontamination, manifest, members),
  (c) `flywheel dataset export` of that version (a child process: its peak RSS),

and prints the times, the ratio (b)/(a) (goal <= 2) and the export's peak RSS. Run it at two
sizes to see whether export memory stays flat:

    python -m bench.dataset_build --items 100000
    python -m bench.dataset_build --items 1000000

Needs PostgreSQL (FLYWHEEL_TEST_POSTGRES_URL, as the tests). Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
from sqlalchemy import make_url

from flywheel import migrate
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.settings import Settings
from flywheel.tenancy import service as tenancy
from tests.conftest import create_postgres_database, drop_postgres_database

# Word pools combined by the row number, with the row's own number every few words: no two
# items share a 13-gram (so decontamination has work to do but excludes only what it should).
LOAD_SQL = """
WITH words AS (
  SELECT ARRAY['invoice','refund','password','account','billing','address','charge','plan',
               'upgrade','cancel','renewal','discount','receipt','payment','card','bank',
               'transfer','tax','vat','export','login','email','team','seat','license',
               'trial','quota','limit','report','dashboard','api','token'] AS pool
)
INSERT INTO sft_examples (id, created_at, tenant_id, domain_id, source_kind, source_ref,
  group_key, content_sha256, ingestor_version, redaction_report, weight, messages, completion)
SELECT gen_random_uuid(), now(), %(tenant)s, %(domain)s, 'ticket', 'bench:' || n,
  'thread:' || (n / 5), md5(n::text) || md5((n * 7)::text), 'bench', '{}'::jsonb, 1.0,
  jsonb_build_array(jsonb_build_object('role', 'user', 'content',
    'ticket ' || n || ': my ' || pool[1 + n %% 32] || ' and ' || pool[1 + (n / 32) %% 32]
    || ' broke (case ' || n || ') after the ' || pool[1 + (n / 1024) %% 32] || ' change; the '
    || pool[1 + (n * 7) %% 32] || ' page (ref ' || n || ') shows ' || pool[1 + (n * 13) %% 32]
    || ' errors')),
  'About ' || pool[1 + n %% 32] || ' issue ' || n || ': open settings, choose '
    || pool[1 + (n * 3) %% 32] || ' (step ' || n || ') then ' || pool[1 + (n * 5) %% 32]
    || ' and confirm; your ' || pool[1 + (n * 11) %% 32] || ' (id ' || n
    || ') updates within the hour.'
FROM generate_series(1, %(items)s) AS n, words
"""


def export_s(url: str) -> float:
    started = time.perf_counter()
    with (
        psycopg.connect(url) as connection,
        connection.cursor() as cursor,
        cursor.copy("COPY (SELECT * FROM sft_examples) TO STDOUT") as copy,
    ):
        for _block in copy:
            pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    args = parser.parse_args()
    url = create_postgres_database()
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        engine = make_engine(Settings(database_url=url))
        sessions = make_session_factory(engine)
        with unit_of_work(sessions) as session:
            tenant = tenancy.create_tenant(session=session, name="bench")
            domain = tenancy.create_domain(session=session, tenant=tenant, name="support")
            ids = {"tenant": tenant.id, "domain": domain.id}
        with psycopg.connect(plain, autocommit=True) as connection:
            connection.execute(LOAD_SQL, ids | {"items": args.items})
            connection.execute("VACUUM ANALYZE sft_examples")
        export_s(plain)  # warm the cache
        copy_s = min(export_s(plain) for _ in range(3))
        started = time.perf_counter()
        with unit_of_work(sessions) as session:
            built = build_dataset_version(
                session=session,
                tenant_id=ids["tenant"],
                domain_id=ids["domain"],
                recipe=DatasetRecipe(),
            )
            stats = built.stats
        build_s = time.perf_counter() - started
        engine.dispose()
        export_seconds, peak_mb = _export(url)
        print(f"{args.items:,} SFT examples; {os.cpu_count()} CPUs; stats: {stats}")
        print(f"{'COPY sft_examples TO STDOUT (best of 3)':<44}{copy_s:>9.2f} s")
        print(f"{'build_dataset_version':<44}{build_s:>9.2f} s")
        print(f"{'dataset export (trl), child process':<44}{export_seconds:>9.2f} s")
        print(f"ratio build/COPY: {build_s / copy_s:.2f} (goal <= 2)")
        print(f"export peak RSS: {peak_mb:,.0f} MB")
    finally:
        drop_postgres_database(url)


def _export(url: str) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of `flywheel dataset export` in a child process. The peak is
    sampled from outside: a child's own ru_maxrss starts at its parent's high-water mark (Linux
    keeps it across fork and exec), which here is the build's."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable,
            "-m",
            "flywheel",
            "dataset",
            "export",
            "1",
            "--domain",
            "support",
            "--out",
            str(Path(scratch) / "v1"),
        ]
        started = time.perf_counter()
        child = subprocess.Popen(
            command, env=os.environ | {"FLYWHEEL_DATABASE_URL": url}, stdout=subprocess.DEVNULL
        )
        peak_bytes = 0
        watched = psutil.Process(child.pid)
        while child.poll() is None:
            with contextlib.suppress(psutil.Error):
                peak_bytes = max(peak_bytes, watched.memory_info().rss)
            time.sleep(0.02)
        elapsed_s = time.perf_counter() - started
        if child.returncode:
            raise SystemExit(f"export failed with exit code {child.returncode}")
    return elapsed_s, peak_bytes / 1e6


if __name__ == "__main__":
    main()
