"""Benchmark: a week in numbers. A domain growing by --growth a week for --weeks weeks on top of
--items items: per week the compile, the build and the export, the rows each wrote, and the raw
COPY baselines they are measured against, side by side in one run.

In a scratch PostgreSQL database (created and dropped here), week 0 writes --events feedback
events with COPY (bench.compile's realistic mix) and compiles them (the full compile), then adds
--items SFT examples (bench.dataset_build's ticket-style rows), builds the domain's first dataset
version (the full build) and exports it. Each later week adds --growth of the events and of the
items written so far: new conversations with their feedback and late ratings on old
interactions, half each, then new SFT examples; and runs the incremental compile, build
(`build_dataset_version`, the public service) and export. Events carry a simulated clock: week 0's
span the 180 days before it, and each later week's are spread over its 7 days, so a compile's
revisit window (minutes before its last watermark) holds what it would in a real week.

Goals (issue 21): full build <= 5x a raw COPY of the rows it reads; a build after +1% new items
<= 5% of the full build; full compile <= 2x (COPY export of the events + write floor, as
bench.compile measures them). The export runs as `flywheel dataset export` in a child process
whose peak RSS is sampled from outside (goal: flat with size). --tick then runs
bench.scheduler_tick in a child process.

    python -m bench.week [--items 1000000] [--events N] [--weeks 4] [--growth 0.01] [--tick]

Needs PostgreSQL (FLYWHEEL_TEST_POSTGRES_URL, as the tests). Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from bench import compile as compile_bench
from bench import dataset_build
from flywheel.datasets.items import KINDS
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import unit_of_work
from flywheel.signals.compile import compile_feedback

DOMAIN = "support"
INTERACTION_COLUMNS = (
    "id, created_at, tenant_id, domain_id, messages, response, metadata, request_sha256"
)
ITEM_TABLES = tuple(str(kind.model.__tablename__) for kind in KINDS)
T = TypeVar("T")
WEEK = timedelta(days=7)
WRITES = ("inserted", "updated", "deleted")


class WeekMix(compile_bench.Mix):
    """A week's new conversations: bench.compile's mix, with prompts and responses numbered
    after the world's and every event stamped in the 7 days up to `ends_at`."""

    def __init__(
        self, events: int, seed: int, first_prompt: int, first_interaction: int, ends_at: datetime
    ) -> None:
        super().__init__(events, seed)
        self.first_prompt = first_prompt
        self.first_interaction = first_interaction
        self.now = ends_at

    def messages(self, prompt: int) -> list[dict[str, str]]:
        return super().messages(prompt + self.first_prompt)

    def response(self, interaction: int) -> str:
        return super().response(interaction + self.first_interaction)

    def created_at(self) -> datetime:
        return self.now - WEEK * self.rng.random()


@dataclass
class World:
    """The scratch database and what has been written to it so far."""

    url: str
    plain: str  # the same database, as psycopg spells it
    engine: Engine
    sessions: sessionmaker[Session]
    tenant_id: uuid.UUID
    domain_id: uuid.UUID
    week_0_ends: datetime = field(default_factory=lambda: datetime.now(UTC))
    mix: compile_bench.Mix | None = None
    events: int = 0
    items: int = 0  # SFT examples numbered 1..items
    interactions: int = 0  # interactions with ids UUID(int=1..interactions)
    prompts: int = 0


@dataclass
class Week:
    number: int
    new_events: int
    new_items: int
    compile_s: float
    build_s: float
    export_s: float
    export_peak_mb: float
    exported_rows: int
    copy_items_s: float  # COPY of every row of the item tables the build reads
    copy_events_s: float  # COPY of every feedback event
    version: int
    is_new_version: bool
    compile_counts: dict[str, int]
    # step -> table -> rows inserted, updated, deleted
    rows: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    write_floor_s: float | None = None  # week 0 only


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def write_counts(world: World) -> dict[str, tuple[int, int, int]]:
    """Rows inserted, updated and deleted so far in each table (PostgreSQL's table statistics).
    A backend sends its statistics when it exits at the latest, before it leaves
    pg_stat_activity: so the engine's connections are closed and their backends waited for."""
    world.engine.dispose()
    query = "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
    with psycopg.connect(world.plain, autocommit=True) as connection:
        _wait_for_other_backends(connection)
        rows = connection.execute(f"{query} WHERE schemaname = 'public'").fetchall()
    return {str(name): (int(ins), int(upd), int(dele)) for name, ins, upd, dele in rows}


def _wait_for_other_backends(connection: psycopg.Connection[Any], timeout_s: float = 60) -> None:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )
    deadline = time.monotonic() + timeout_s
    while (row := connection.execute(query).fetchone()) and row[0]:
        if time.monotonic() > deadline:
            raise SystemExit(f"{row[0]} other connections still open: rows written unknown")
        time.sleep(0.05)


def written(
    before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]
) -> dict[str, dict[str, int]]:
    """table -> rows inserted, updated, deleted between two `write_counts`, where any were."""
    found = {}
    for table, counts in after.items():
        old = before.get(table, (0, 0, 0))
        delta = {kind: a - b for kind, a, b in zip(WRITES, counts, old, strict=True)}
        if any(delta.values()):
            found[table] = delta
    return found


def copy_s(plain: str, tables: tuple[str, ...], rounds: int) -> float:
    """Best of `rounds`: `COPY table TO STDOUT` of each table in turn, into a null sink."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        with psycopg.connect(plain) as connection, connection.cursor() as cursor:
            for table in tables:
                with cursor.copy(f"COPY (SELECT * FROM {table}) TO STDOUT") as copy:
                    for _block in copy:
                        pass
        best = min(best, time.perf_counter() - started)
    return best


def _shifted(value: uuid.UUID | None, offset: int) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(int=value.int + offset)


def add_conversations(world: World, mix: compile_bench.Mix) -> None:
    """The mix's interactions and events, their interaction ids after the world's."""
    offset, ids = world.interactions, (world.tenant_id, world.domain_id)
    with psycopg.connect(world.plain) as connection, connection.cursor() as cursor:
        with cursor.copy(f"COPY interactions ({INTERACTION_COLUMNS}) FROM STDIN") as copy:
            for row in compile_bench.interaction_rows(mix, *ids):
                copy.write_row((_shifted(row[0], offset), *row[1:6], Jsonb(row[6]), row[7]))
        events = compile_bench.event_rows(mix, *ids)
        _copy_events(cursor, ((*row[:4], _shifted(row[4], offset), *row[5:]) for row in events))
        connection.commit()
    world.interactions += mix.interactions
    world.prompts += mix.prompts
    world.events += mix.events


def _copy_events(cursor: psycopg.Cursor[Any], rows: Iterator[tuple[Any, ...]]) -> None:
    with cursor.copy(f"COPY feedback_events ({compile_bench.EVENT_COLUMNS}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def add_late(world: World, mix: compile_bench.Mix, count: int, ends_at: datetime) -> None:
    """bench.compile's late ratings on old interactions, stamped in the week up to `ends_at`."""
    rows = compile_bench.late_rows(mix, world.tenant_id, world.domain_id, count)
    stamped = ((row[0], ends_at - WEEK * mix.rng.random(), *row[2:]) for row in rows)
    with psycopg.connect(world.plain) as connection, connection.cursor() as cursor:
        _copy_events(cursor, stamped)
        connection.commit()
    world.events += count


def add_events(world: World, number: int, count: int) -> None:
    """Week 0: the whole mix, in the 180 days before it. Later: half late ratings on old
    interactions, half new conversations with their feedback, in that week's 7 days."""
    ends_at = world.week_0_ends + number * WEEK
    if world.mix is None:
        world.mix = compile_bench.Mix(count)
        world.mix.now = ends_at
        add_conversations(world, world.mix)
    else:
        late = count // 2
        add_late(world, world.mix, late, ends_at)
        fresh = WeekMix(count - late, number, world.prompts, world.interactions, ends_at)
        add_conversations(world, fresh)
    _vacuum(world.plain, "interactions, feedback_events")


def add_items(world: World, count: int) -> None:
    ids = {"tenant": world.tenant_id, "domain": world.domain_id}
    with psycopg.connect(world.plain, autocommit=True) as connection:
        bounds = {"start": world.items + 1, "items": world.items + count}
        connection.execute(dataset_build.LOAD_SQL, ids | bounds)  # rows numbered start..items
    world.items += count
    _vacuum(world.plain, "sft_examples")


def _vacuum(plain: str, tables: str) -> None:
    with psycopg.connect(plain, autocommit=True) as connection:
        connection.execute(f"VACUUM ANALYZE {tables}")


def compile_domain(world: World, is_linking: bool) -> tuple[dict[str, int], float]:
    def run() -> dict[str, int]:
        report = compile_feedback(
            world.sessions, tenant_id=world.tenant_id, domain_id=world.domain_id, link=is_linking
        )
        return asdict(report.totals)

    return timed(run)


def build_version(world: World) -> tuple[tuple[int, bool], float]:
    def run() -> tuple[int, bool]:
        with unit_of_work(world.sessions) as session:
            built = build_dataset_version(
                session=session,
                tenant_id=world.tenant_id,
                domain_id=world.domain_id,
                recipe=DatasetRecipe(),
            )
            return built.version.version, built.is_new

    return timed(run)


def export_version(url: str, version: int) -> tuple[float, float, int]:
    """Seconds, peak RSS (MB) and rows of `flywheel dataset export` in a child process. The
    peak is sampled from outside: a child's own ru_maxrss starts at its parent's high-water
    mark (Linux keeps it across fork and exec)."""
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile() as output:
        command = [sys.executable, "-m", "flywheel", "dataset", "export", str(version)]
        command += ["--domain", DOMAIN, "--out", str(Path(scratch) / "out"), "--json"]
        started = time.perf_counter()
        env = os.environ | {"FLYWHEEL_DATABASE_URL": url}
        child = subprocess.Popen(command, env=env, stdout=output)
        peak_bytes = _peak_rss(child)
        elapsed_s = time.perf_counter() - started
        if child.returncode:
            raise SystemExit(f"export of v{version} failed with exit code {child.returncode}")
        output.seek(0)
        files = json.loads(output.read())["files"]
    return elapsed_s, peak_bytes / 1e6, sum(files.values())


def _peak_rss(child: subprocess.Popen[bytes]) -> int:
    peak_bytes = 0
    watched = psutil.Process(child.pid)
    while child.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak_bytes = max(peak_bytes, watched.memory_info().rss)
        time.sleep(0.02)
    return peak_bytes


def grown(total: int, growth: float) -> int:
    return max(1, round(total * growth))


def run_week(world: World, number: int, args: argparse.Namespace) -> Week:
    """One week: new events, the compile (with the write floor in week 0), new items, the
    build, the export and the COPY baselines, in that order."""
    new_events = args.events if number == 0 else grown(world.events, args.growth)
    new_items = args.items if number == 0 else grown(world.items, args.growth)
    add_events(world, number, new_events)
    loaded = write_counts(world)
    counts, compile_s = compile_domain(world, args.link)
    compiled = write_counts(world)
    floor_s = compile_bench.write_floor_s(world.plain) if number == 0 else None
    add_items(world, new_items)
    ingested = write_counts(world)
    (version, is_new), build_s = build_version(world)
    built = write_counts(world)
    export_s, peak_mb, exported = export_version(world.url, version)
    return Week(
        number=number,
        new_events=new_events,
        new_items=new_items,
        compile_s=compile_s,
        build_s=build_s,
        export_s=export_s,
        export_peak_mb=peak_mb,
        exported_rows=exported,
        copy_items_s=copy_s(world.plain, ITEM_TABLES, args.copy_rounds),
        copy_events_s=copy_s(world.plain, ("feedback_events",), args.copy_rounds),
        version=version,
        is_new_version=is_new,
        compile_counts=counts,
        rows={"compile": written(loaded, compiled), "build": written(ingested, built)},
        write_floor_s=floor_s,
    )


def ratios(weeks: list[Week]) -> dict[str, Any]:
    full = weeks[0]
    floor_s = full.write_floor_s or 0.0
    return {
        "full_build_over_copy": full.build_s / full.copy_items_s,
        "full_compile_over_export_plus_floor": full.compile_s / (full.copy_events_s + floor_s),
        "build_over_full_build": [week.build_s / full.build_s for week in weeks[1:]],
        "compile_over_full_compile": [week.compile_s / full.compile_s for week in weeks[1:]],
    }


HEADER = (
    f"{'week':>4} {'+events':>9} {'+items':>9} {'compile s':>10} {'build s':>9} "
    f"{'/full':>6} {'export s':>9} {'RSS MB':>7} {'rows out':>9} {'COPY items s':>13} "
    f"{'COPY events s':>14} {'version':>8}"
)


def print_week(week: Week, full_build_s: float) -> None:
    """The week's line of the table (under HEADER), as soon as the week is done."""
    print(
        f"{week.number:>4} {week.new_events:>9,} {week.new_items:>9,} {week.compile_s:>10.2f} "
        f"{week.build_s:>9.2f} {week.build_s / full_build_s:>6.3f} {week.export_s:>9.2f} "
        f"{week.export_peak_mb:>7.0f} {week.exported_rows:>9,} {week.copy_items_s:>13.2f} "
        f"{week.copy_events_s:>14.2f} {'v' + str(week.version):>8}"
        + ("" if week.is_new_version else " (unchanged)"),
        flush=True,
    )
    if week.write_floor_s is not None:
        print(f"  (week 0 write floor of the compile: {week.write_floor_s:.2f} s)", flush=True)


def print_report(weeks: list[Week], found: dict[str, Any]) -> None:
    for week in weeks:
        for step, tables in week.rows.items():
            rows = ", ".join(f"{table} {_rows(counts)}" for table, counts in sorted(tables.items()))
            print(f"week {week.number} rows written by {step}: {rows or 'none'}")
        counts = week.compile_counts
        print(
            f"week {week.number} compile: {counts['events_read']:,} events read, "
            f"{counts['inserted']:,} inserted, {counts['updated']:,} updated, "
            f"{counts['retracted']:,} retracted"
        )
    _print_ratios(weeks, found)


def _rows(counts: dict[str, int]) -> str:
    signs = {"inserted": "+", "updated": "~", "deleted": "-"}
    return " ".join(f"{signs[kind]}{rows:,}" for kind, rows in counts.items() if rows)


def _print_ratios(weeks: list[Week], found: dict[str, Any]) -> None:
    full = weeks[0]
    print("rows written: +inserted ~updated -deleted (PostgreSQL's table statistics)")
    print(
        f"write floor of the full compile (its output COPY-ed into indexed tables): "
        f"{full.write_floor_s or 0.0:.2f} s"
    )
    print(f"ratio full build / COPY items: {found['full_build_over_copy']:.2f} (goal <= 5)")
    print(
        "ratio full compile / (COPY events + write floor): "
        f"{found['full_compile_over_export_plus_floor']:.2f} (goal <= 2)"
    )
    for week, build, compiled in zip(
        weeks[1:], found["build_over_full_build"], found["compile_over_full_compile"], strict=True
    ):
        print(
            f"week {week.number}: build / full build {build:.3f} (goal <= 0.05); "
            f"compile / full compile {compiled:.3f}"
        )
    peaks = ", ".join(f"{week.export_peak_mb:.0f}" for week in weeks)
    print(f"export peak RSS by week (MB): {peaks} (goal: flat with size)")


def run_tick(extra: str) -> None:
    command = [sys.executable, "-m", "bench.scheduler_tick", *shlex.split(extra)]
    print(f"tick: python {shlex.join(command[1:])}", flush=True)
    finished = subprocess.run(command, check=False)
    if finished.returncode:
        print(f"tick: bench.scheduler_tick exited with {finished.returncode}")


@contextlib.contextmanager
def scratch_world() -> Iterator[World]:
    with dataset_build.scratch_domain(DOMAIN) as parts:
        yield World(*parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=1_000_000, help="SFT examples at week 0")
    parser.add_argument("--events", type=int, help="feedback events at week 0 (default: --items)")
    parser.add_argument("--weeks", type=int, default=4, help="weeks after week 0")
    parser.add_argument("--growth", type=float, default=0.01, help="weekly growth (0.01: 1%%)")
    parser.add_argument("--copy-rounds", type=int, default=2, help="COPY baselines: best of")
    parser.add_argument("--link", action="store_true", help="compile with near-duplicate linking")
    parser.add_argument("--tick", action="store_true", help="then run bench.scheduler_tick")
    parser.add_argument("--tick-args", default="", help="arguments for bench.scheduler_tick")
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    args.events = args.items if args.events is None else args.events
    if args.items < 1 or args.events < 1 or args.weeks < 0 or args.copy_rounds < 1:
        parser.error("--items and --events must be >= 1, --weeks >= 0, --copy-rounds >= 1")
    if not 0 < args.growth <= 1:
        parser.error("--growth must be in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    weeks: list[Week] = []
    with scratch_world() as world:
        print(
            f"PostgreSQL database {make_url(world.url).database}; {os.cpu_count()} CPUs; "
            f"{args.items:,} items and {args.events:,} events at week 0, "
            f"+{args.growth:.1%} a week for {args.weeks} weeks",
            flush=True,
        )
        world.week_0_ends = datetime.now(UTC) - args.weeks * WEEK  # the last week ends now
        print(HEADER, flush=True)
        for number in range(args.weeks + 1):
            weeks.append(run_week(world, number, args))
            print_week(weeks[-1], weeks[0].build_s)
    found = ratios(weeks)
    print_report(weeks, found)
    if args.json:
        document = {
            "args": {**vars(args), "json": str(args.json)},
            "ratios": found,
            "weeks": [asdict(week) for week in weeks],
        }
        args.json.write_text(json.dumps(document, indent=2))
    if args.tick:
        run_tick(args.tick_args)


if __name__ == "__main__":
    main()
