"""Benchmark: one scheduler tick over 100, 500 and 1,000 domains.

In a scratch PostgreSQL database (created and dropped here; `--sqlite` for the embedded one)
it writes a fleet per size: several tenants (one with most of the domains, as a large
customer has), weekly schedules (`0 2 * * 1`), most domains with too little new signal and
every 20th with enough for a cycle. Then one tick decides every domain's period, with a
deferrer that only counts (the job queue is not what is measured), and it prints per size:
the tick's seconds, the SQL statements it ran (a `before_cursor_execute` listener), the
statements per domain, and the per-domain constant (seconds per domain). A second tick of
the same period (everything decided: what workers do every minute) is printed beside it.
Then, with every domain queued and real procrastinate jobs: the tick, the re-ranking of the
GPU queue between tenants (`jobs.share_gpu`), and a worker's fetch of the next job (its
per-domain lock check included) with that many jobs waiting.

    python -m bench.scheduler_tick                 # 100, 500, 1000
    python -m bench.scheduler_tick --sizes 100

Goal: a tick over 1,000 domains <= 5 s here, statements not growing per skipped domain.
Needs PostgreSQL (FLYWHEEL_TEST_POSTGRES_URL, as the tests). Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, insert, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from flywheel import migrate
from flywheel.db import make_engine, make_session_factory, unit_of_work, utcnow
from flywheel.models import Domain, Run, SftExample, Tenant
from flywheel.scheduling import schedule
from flywheel.settings import Settings

MONDAY_2AM = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
WEEKLY = "0 2 * * 1"
MIN_NEW_SIGNAL = 20


@dataclass
class QueryCounter:
    """Counts the SQL statements an engine runs while it is attached (savepoints aside: the
    tests' harness wraps each unit of work in one)."""

    engine: Engine
    statements: list[str] = field(default_factory=list)

    def _count(self, *args: Any, **kwargs: Any) -> None:
        statement = str(args[2])
        if not statement.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO")):
            self.statements.append(statement)

    @contextlib.contextmanager
    def counting(self) -> Iterator[QueryCounter]:
        self.statements.clear()
        event.listen(self.engine, "before_cursor_execute", self._count)
        try:
            yield self
        finally:
            event.remove(self.engine, "before_cursor_execute", self._count)


class CountingDeferrer:
    """Stands in for the job queue: a job id per run, nothing else."""

    def __init__(self) -> None:
        self.runs: list[uuid.UUID] = []

    def __call__(self, session: Session, run: Run) -> int:
        self.runs.append(run.id)
        return len(self.runs)


def make_fleet(
    session: Session, tenants: dict[str, int], *, signal_every: int = 20, items: int = 3
) -> list[uuid.UUID]:
    """`tenants` (name -> domain count), weekly schedules; every `signal_every`-th domain gets
    MIN_NEW_SIGNAL items (a cycle; none when 0), the others `items` (skipped). Their ids."""
    config = {"cycle": {"schedule": WEEKLY, "min_new_signal": MIN_NEW_SIGNAL}}
    domain_rows: list[dict[str, Any]] = []
    for name, count in tenants.items():
        tenant_id = uuid.uuid4()
        session.execute(insert(Tenant), [{"id": tenant_id, "name": name, "created_at": utcnow()}])
        domain_rows += [
            {"id": uuid.uuid4(), "tenant_id": tenant_id, "name": f"d{i}", "config": config}
            for i in range(count)
        ]
    for position, row in enumerate(domain_rows):
        row["created_at"] = utcnow() + timedelta(microseconds=position)
    session.execute(insert(Domain), domain_rows)
    signal = []
    for position, row in enumerate(domain_rows):
        count = MIN_NEW_SIGNAL if signal_every and position % signal_every == 0 else items
        signal += [_item(row, i) for i in range(count)]
    if signal:
        session.execute(insert(SftExample), signal)
    session.flush()
    return [row["id"] for row in domain_rows]


def _item(domain: dict[str, Any], i: int) -> dict[str, Any]:
    text = f"{domain['id']} question {i}"
    return {
        "id": uuid.uuid4(),
        "created_at": utcnow(),
        "tenant_id": domain["tenant_id"],
        "domain_id": domain["id"],
        "source_kind": "task_file",
        "source_ref": f"bench:{i}",
        "group_key": f"g{i}",
        "content_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "ingestor_version": "bench",
        "redaction_report": {},
        "weight": 1.0,
        "messages": [{"role": "user", "content": text}],
        "completion": f"answer {i}",
    }


def fleet_shape(size: int) -> dict[str, int]:
    """Several tenants: one holding most domains, a few middling, a few small."""
    small = {f"small{i}": 5 for i in range(4)}
    middling = {f"mid{i}": size // 10 for i in range(2)}
    return {"big": size - sum(small.values()) - sum(middling.values()), **middling, **small}


def measure(url: str, size: int) -> dict[str, float]:
    settings = Settings(database_url=url, home=Path(tempfile.mkdtemp()))
    engine = make_engine(settings)
    sessions = make_session_factory(engine)
    counter = QueryCounter(engine)
    try:
        with unit_of_work(sessions) as session:
            make_fleet(session, fleet_shape(size))
        deferrer = CountingDeferrer()
        results = {}
        for label in ("first", "again"):
            with unit_of_work(sessions) as session, counter.counting():
                start = time.perf_counter()
                decisions = schedule.tick(session, at=MONDAY_2AM, defer=deferrer)
                elapsed = time.perf_counter() - start
            results[f"{label}_s"] = elapsed
            results[f"{label}_statements"] = len(counter.statements)
            results[f"{label}_decided"] = len(decisions)
        results["queued"] = len(deferrer.runs)
        return results
    finally:
        engine.dispose()


def measure_queue(url: str, size: int, fetches: int = 20) -> dict[str, float]:
    """Every domain queued, with real procrastinate jobs: the tick, the re-ranking of the GPU
    queue across tenants, and the mean time a worker's fetch of the next job takes (its
    per-domain lock check included) with `size` jobs waiting."""
    from flywheel.scheduling import jobs

    settings = Settings(database_url=url, home=Path(tempfile.mkdtemp()))
    jobs.apply_schema(settings)
    engine = make_engine(settings)
    sessions = make_session_factory(engine)
    results: dict[str, float] = {}
    try:
        with unit_of_work(sessions) as session:
            make_fleet(session, fleet_shape(size), signal_every=1)
        with unit_of_work(sessions) as session:
            start = time.perf_counter()
            decisions = schedule.tick(session, at=MONDAY_2AM, defer=jobs.defer_cycle_job)
            results["tick_s"] = time.perf_counter() - start
            start = time.perf_counter()
            results["moved"] = jobs.share_gpu(session)
            results["share_s"] = time.perf_counter() - start
        results["queued"] = sum(d.decision == "queued" for d in decisions)
        with unit_of_work(sessions) as session:
            worker = session.execute(text("SELECT procrastinate_register_worker_v1()")).scalar()
            start = time.perf_counter()
            for _ in range(fetches):
                job = session.execute(
                    text("SELECT id FROM procrastinate_fetch_job_v2(ARRAY['gpu'], :w)"),
                    {"w": worker},
                ).scalar()
                session.execute(
                    text("SELECT procrastinate_finish_job_v1(:id, 'succeeded', false)"),
                    {"id": job},
                )
            results["fetch_ms"] = 1000 * (time.perf_counter() - start) / fetches
        return results
    finally:
        engine.dispose()


@contextlib.contextmanager
def scratch_database(use_sqlite: bool) -> Iterator[str]:
    if use_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            migrate.upgrade(url)
            yield url
        return
    from tests.conftest import create_postgres_database, drop_postgres_database

    url = create_postgres_database()
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_postgres_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--sqlite", action="store_true", help="the embedded database")
    args = parser.parse_args()
    print(
        "domains  tick_s  statements  per_domain  queued  ms_per_domain  "
        "decided_tick_s  decided_statements"
    )
    for size in args.sizes:
        with scratch_database(args.sqlite) as url:
            r = measure(url, size)
        print(
            f"{size:7d}  {r['first_s']:6.3f}  {r['first_statements']:10.0f}  "
            f"{r['first_statements'] / size:10.3f}  {r['queued']:6.0f}  "
            f"{1000 * r['first_s'] / size:13.3f}  {r['again_s']:14.3f}  "
            f"{r['again_statements']:18.0f}"
        )
    if args.sqlite:
        return
    print("\nevery domain queued, real jobs (PostgreSQL):")
    print("domains  tick_s  ms_per_queued  share_gpu_s  jobs_reranked  fetch_next_ms")
    for size in args.sizes:
        with scratch_database(False) as url:
            q = measure_queue(url, size)
        print(
            f"{size:7d}  {q['tick_s']:6.3f}  {1000 * q['tick_s'] / q['queued']:13.3f}  "
            f"{q['share_s']:11.3f}  {q['moved']:13.0f}  {q['fetch_ms']:13.2f}"
        )


if __name__ == "__main__":
    main()
