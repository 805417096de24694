"""`refresh_statistics`: a table bulk-written since its last ANALYZE is analyzed before a build
plans on it (the CI server runs without autovacuum, and a build's own writes are counted
nowhere before it commits), and never waits long for another transaction's ANALYZE.
PostgreSQL only: SQLite has no planner statistics to refresh."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.models import ItemSketch
from flywheel.db import refresh_statistics
from tests.conftest import Caller
from tests.integration.test_dataset_build import build, sft, store

pytestmark = pytest.mark.postgres_only


def counted(session: Session, table: str) -> float:
    """The rows the planner believes `table` holds (-1: never analyzed)."""
    return float(
        session.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = CAST(:table AS regclass)"),
            {"table": table},
        ).scalar_one()
    )


def test_a_build_analyzes_the_sketches_it_wrote(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """Before: the first build wrote 120 sketches and planned its reads as if there were none."""
    with sessions() as session:
        session.execute(text("ANALYZE item_sketches"))  # empty: the planner counts 0
        assert counted(session, "item_sketches") == 0
        session.commit()
    store(
        sessions, acme, [sft(f"g-{n}", f"question number {n} about invoices") for n in range(120)]
    )
    assert build(sessions, acme).is_new
    with sessions() as session:
        sketches = session.scalar(select(func.count()).select_from(ItemSketch))
        assert sketches == 120
        assert counted(session, "item_sketches") == sketches


@pytest.fixture
def probe(engine: Engine) -> Iterator[str]:
    """A committed scratch table of 1,000 rows that was analyzed when it had none."""
    name = f"stats_probe_{uuid.uuid4().hex[:8]}"
    with Session(engine) as session, session.begin():
        session.execute(text(f"CREATE TABLE {name} (n int)"))
        session.execute(text(f"ANALYZE {name}"))
        session.execute(text(f"INSERT INTO {name} SELECT generate_series(1, 1000)"))
    _wait_for_counters(engine, name, 1000)
    try:
        yield name
    finally:
        with Session(engine) as session, session.begin():
            session.execute(text(f"DROP TABLE {name}"))


def _wait_for_counters(engine: Engine, table: str, rows: int, *, at_most: bool = False) -> None:
    """Until the server's activity counters show the committed rows (a backend reports them
    within about a second of committing), or at most `rows` of them."""
    query = text("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = :table")
    for _ in range(100):
        with Session(engine) as session:
            shown = session.execute(query, {"table": table}).scalar_one()
            if (shown <= rows) if at_most else (shown >= rows):
                return
        time.sleep(0.05)
    raise AssertionError(f"the counters of {table} never showed {rows} changed rows")


def test_committed_changes_make_statistics_stale_and_one_analyze_refreshes_them(
    engine: Engine, probe: str
) -> None:
    with Session(engine) as session, session.begin():
        assert counted(session, probe) == 0
        assert refresh_statistics(session, probe)
        assert counted(session, probe) == 1000
    _wait_for_counters(engine, probe, 0)
    with Session(engine) as session, session.begin():
        assert not refresh_statistics(session, probe)  # fresh now
        assert not refresh_statistics(session, probe, written=100)  # under 50 + 10% of 1,000
        assert refresh_statistics(session, probe, written=151)


def test_a_table_never_analyzed_is_analyzed_whatever_its_counters_say(engine: Engine) -> None:
    """Before: its counters reset (a database made from a template, a restore), a table of
    1,000 rows never analyzed was left for the planner to count as empty."""
    name = f"stats_probe_{uuid.uuid4().hex[:8]}"
    with Session(engine) as session, session.begin():
        session.execute(text(f"CREATE TABLE {name} (n int)"))
        session.execute(text(f"INSERT INTO {name} SELECT generate_series(1, 1000)"))
    _wait_for_counters(engine, name, 1000)
    try:
        with Session(engine) as session, session.begin():
            session.execute(
                text("SELECT pg_stat_reset_single_table_counters(CAST(:table AS regclass))"),
                {"table": name},
            )
        _wait_for_counters(engine, name, 0, at_most=True)
        with Session(engine) as session, session.begin():
            assert counted(session, name) == -1
            assert refresh_statistics(session, name)
            assert counted(session, name) == 1000
    finally:
        with Session(engine) as session, session.begin():
            session.execute(text(f"DROP TABLE {name}"))


def test_another_transactions_analyze_makes_it_go_on_without(engine: Engine, probe: str) -> None:
    with Session(engine) as holder, holder.begin():
        holder.execute(text(f"ANALYZE {probe}"))  # its lock is held until this commits
        with Session(engine) as session, session.begin():
            started = time.perf_counter()
            assert not refresh_statistics(session, probe, written=10_000)
            assert time.perf_counter() - started < 5
            assert session.execute(text("SELECT current_setting('lock_timeout')")).scalar() == "0"
            assert session.execute(text("SELECT 1")).scalar() == 1  # the transaction goes on
