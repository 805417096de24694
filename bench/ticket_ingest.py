"""Benchmark: ticket ingest into PostgreSQL, records/s, beside the parse-only rate.

Writes a synthetic Zendesk export (bench/ticket_corpus.py: solved, reopened, rated and open
tickets with HTML, quoted replies, signatures and planted PII), then in one run measures

  (a) reading and parsing the export alone (the ingestor's `records()`),
  (b) read + convert (HTML to text, quote stripping, candidates), no database,
  (c) the full `flywheel ingest tickets` path: convert, redact, hash, COPY into a scratch
      PostgreSQL database (created and dropped here), checkpoint every batch,
  (d) the same export again: the idempotent no-op pass,

and prints records/s for each. Asserts nothing: machines here are shared and noisy.

    python -m bench.ticket_ingest [--tickets 100000] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.ticket_corpus import write_zendesk_export
from flywheel import migrate
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.settings import Settings
from flywheel.tenancy import service as tenancy
from ingest.framework import Ingestor, Rejected
from ingest.runner import RunResult, run_ingest
from ingest.tickets import make_ticket_ingestor
from tests.conftest import create_postgres_database, drop_postgres_database


def timed(label: str, records: int, work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    elapsed_s = time.perf_counter() - started
    print(f"{label:<44} {elapsed_s:8.1f} s  {records / elapsed_s:10,.0f} records/s")
    return elapsed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=100_000)
    parser.add_argument("--keep", action="store_true", help="Keep the scratch database.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        export = Path(scratch) / "zendesk.json"
        write_zendesk_export(export, args.tickets)
        size_mb = export.stat().st_size / 1e6
        print(f"{args.tickets:,} synthetic Zendesk tickets, {size_mb:,.0f} MB\n")
        ingestor = make_ticket_ingestor("zendesk", export)
        timed("(a) read + parse", args.tickets, lambda: sum(1 for _ in ingestor.records()))
        timed("(b) read + convert (no database)", args.tickets, lambda: _convert_all(ingestor))
        _into_postgres(ingestor, args.tickets, args.keep)


def _convert_all(ingestor: Ingestor) -> int:
    candidates = 0
    for record in ingestor.records():
        with contextlib.suppress(Rejected):
            candidates += len(ingestor.convert(record))
    return candidates


def _into_postgres(ingestor: Ingestor, tickets: int, keep: bool) -> None:
    url = create_postgres_database()
    try:
        migrate.upgrade(url)
        engine = make_engine(Settings(database_url=url))
        sessions = make_session_factory(engine)
        with unit_of_work(sessions) as session:
            tenant = tenancy.create_tenant(session=session, name="bench")
            domain = tenancy.create_domain(session=session, tenant=tenant, name="support")
            tenant_id, domain_id = tenant.id, domain.id
        results: list[RunResult] = []

        def ingest() -> None:
            results.append(run_ingest(sessions, ingestor, tenant_id=tenant_id, domain_id=domain_id))

        timed("(c) ingest into PostgreSQL", tickets, ingest)
        timed("(d) the same export again (adds nothing)", tickets, ingest)
        first, again = results
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\npeak RSS of this process: {peak_mb:,.0f} MB")
        print(f"first:  {first.counts.as_json()}")
        print(
            f"again:  accepted {dict(+again.counts.accepted)}, duplicate {again.counts.duplicate}"
        )
        engine.dispose()
    finally:
        if keep:
            print(f"kept {url}")
        else:
            drop_postgres_database(url)


if __name__ == "__main__":
    main()
