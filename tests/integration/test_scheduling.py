"""Scheduled and queued cycles: the tick's decision per domain and period, deferring and
cancelling jobs, and real `flywheel worker` processes on PostgreSQL — two workers and one
schedule period give one cycle; a worker killed mid-training has its job retried elsewhere,
resuming at the interrupted step; a second cycle of a running domain waits for the first."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
import pytest
from pydantic import ValidationError
from sqlalchemy import select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from flywheel import migrate
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import make_engine, make_session_factory, unit_of_work, utcnow
from flywheel.errors import Conflict, InvalidState
from flywheel.models import (
    Domain,
    ModelVersion,
    PromotionEvent,
    Run,
    ScheduledCycle,
)
from flywheel.scheduling import jobs, schedule
from flywheel.scheduling.runs import queue_cycle
from flywheel.settings import Settings
from flywheel.signals.candidates import Provenance, SftCandidate
from flywheel.signals.store import store_candidates
from flywheel.tenancy import service as tenancy
from tests.conftest import (
    Caller,
    create_postgres_database,
    drop_postgres_database,
    make_caller,
    run_cli,
)

T = TypeVar("T")
MONDAY_2AM = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
WEEKLY = "0 2 * * 1"
NEVER = "0 0 1 1 *"  # the schedule's tick, in tests that are not about the schedule
FINISHED = ("succeeded", "failed", "cancelled", "skipped")
QUICK_CYCLE: dict[str, Any] = {
    "overrides": {
        "sft": ["max_steps=2", "per_device_train_batch_size=4", "logging_steps=1", "save_steps=1"]
    },
    "eval": {"max_new_tokens": 4, "k": 2},
    "recipe": {"eval_fraction": 0.3},  # the split hashes (domain, group): 24 groups, some eval
}


class RecordingDeferrer:
    """Stands in for the job queue in the tick's tests: remembers what it was handed."""

    def __init__(self) -> None:
        self.run_ids: list[uuid.UUID] = []

    def __call__(self, session: Session, run: Run) -> int:
        self.run_ids.append(run.id)
        return 1000 + len(self.run_ids)


def add_items(sessions: sessionmaker[Session], caller: Caller, count: int, tag: str = "") -> None:
    """`count` distinct SFT examples in the caller's domain."""
    candidates = [
        SftCandidate(
            Provenance("task_file", f"item-{tag}{i}", f"group-{tag}{i}"),
            [{"role": "user", "content": f"What is {tag}{i} plus {i}?"}],
            f"answer {tag}{i}",
        )
        for i in range(count)
    ]
    _store(sessions, caller, candidates)


def _store(sessions: sessionmaker[Session], caller: Caller, candidates: list[Any]) -> None:
    with unit_of_work(sessions) as session:
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=_domain(session, caller).id,
            candidates=candidates,
            ingestor_version="test",
        )


def configure(sessions: sessionmaker[Session], caller: Caller, config: dict[str, Any]) -> None:
    with unit_of_work(sessions) as session:
        session.execute(
            update(Domain).where(Domain.tenant_id == caller.tenant_id).values(config=config)
        )


def _domain(session: Session, caller: Caller) -> Domain:
    return session.scalars(select(Domain).where(Domain.tenant_id == caller.tenant_id)).one()


def tick(sessions: sessionmaker[Session], at: datetime, defer: Any) -> list[schedule.Decision]:
    with unit_of_work(sessions) as session:
        return schedule.tick(session, at=at, defer=defer)


def scheduled(sessions: sessionmaker[Session]) -> list[ScheduledCycle]:
    with sessions() as session:
        return list(session.scalars(select(ScheduledCycle).order_by(ScheduledCycle.created_at)))


def cycles(sessions: sessionmaker[Session]) -> list[Run]:
    with sessions() as session:
        query = select(Run).where(Run.method == "cycle")
        return list(session.scalars(query.order_by(Run.created_at)))


# -- the tick's decision (no worker) -------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "at", "expected"),
    [
        (WEEKLY, MONDAY_2AM + timedelta(days=2, hours=5), MONDAY_2AM),
        (WEEKLY, MONDAY_2AM, MONDAY_2AM),
        (WEEKLY, MONDAY_2AM - timedelta(seconds=1), MONDAY_2AM - timedelta(days=7)),
        (WEEKLY, MONDAY_2AM + timedelta(seconds=30), MONDAY_2AM),
        (
            "* * * * * */10",
            MONDAY_2AM + timedelta(seconds=15.7),
            MONDAY_2AM + timedelta(seconds=10),
        ),
    ],
)
def test_the_period_is_the_latest_fire_time_at_or_before_the_tick(
    cron: str, at: datetime, expected: datetime
) -> None:
    assert schedule.period_start(cron, at) == expected


def test_a_period_is_decided_once_and_a_second_tick_does_nothing(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    configure(sessions, acme, {"cycle": {"min_new_signal": 3}})
    add_items(sessions, acme, 5)
    deferrer = RecordingDeferrer()

    first = tick(sessions, MONDAY_2AM + timedelta(hours=3), deferrer)
    second = tick(sessions, MONDAY_2AM + timedelta(days=1), deferrer)

    assert [(d.domain, d.decision, d.period_start) for d in first] == [
        ("billing", "queued", MONDAY_2AM)
    ]
    assert second == []
    [run] = cycles(sessions)
    assert (run.status, run.config["trigger"], run.job_id) == ("queued", "schedule", 1001)
    assert deferrer.run_ids == [run.id]
    [row] = scheduled(sessions)
    assert (row.decision, row.period_start, row.training_run_id) == ("queued", MONDAY_2AM, run.id)
    assert row.reason == "5 new items"


def test_too_little_new_signal_is_skipped_with_the_reason(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    add_items(sessions, acme, 12)
    deferrer = RecordingDeferrer()

    decisions = tick(sessions, MONDAY_2AM, deferrer)

    assert [(d.decision, d.reason) for d in decisions] == [
        ("skipped", "12 items and no champion yet, below 50")
    ]
    [row] = scheduled(sessions)
    assert (row.decision, row.reason, row.training_run_id) == (
        "skipped",
        "12 items and no champion yet, below 50",
        None,
    )
    assert deferrer.run_ids == []
    assert cycles(sessions) == []


def test_signal_is_counted_from_the_champions_dataset(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    add_items(sessions, acme, 20)
    make_champion(sessions, acme)
    add_items(sessions, acme, 3, tag="new")

    decisions = tick(sessions, MONDAY_2AM, RecordingDeferrer())

    assert [d.reason for d in decisions] == ["3 new items since the champion's dataset, below 50"]


def make_champion(sessions: sessionmaker[Session], caller: Caller) -> None:
    """A champion trained on a dataset version built now (rows only, no MLflow)."""
    with unit_of_work(sessions) as session:
        domain = _domain(session, caller)
        built = build_dataset_version(
            session=session, tenant_id=caller.tenant_id, domain_id=domain.id, recipe=DatasetRecipe()
        )
        run = Run(
            tenant_id=caller.tenant_id,
            domain_id=domain.id,
            dataset_version_id=built.version.id,
            method="sft",
            config_sha256="0" * 64,
            status="succeeded",
        )
        session.add(run)
        session.flush()
        version = ModelVersion(
            tenant_id=caller.tenant_id,
            domain_id=domain.id,
            training_run_id=run.id,
            registered_model="acme.billing",
            version="1",
            adapter_uri="runs:/x/adapter",
            base_model="/models/tiny",
        )
        session.add(version)
        session.flush()
        session.add(
            PromotionEvent(
                tenant_id=caller.tenant_id,
                domain_id=domain.id,
                alias="champion",
                action="promote",
                to_model_version_id=version.id,
                actor="test",
            )
        )


def test_a_period_whose_cycle_is_still_queued_is_skipped_and_says_why(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    configure(sessions, acme, {"cycle": {"min_new_signal": 1}})
    add_items(sessions, acme, 2)
    deferrer = RecordingDeferrer()

    tick(sessions, MONDAY_2AM, deferrer)
    next_week = tick(sessions, MONDAY_2AM + timedelta(days=7), deferrer)

    [queued] = cycles(sessions)
    assert [(d.decision, d.reason) for d in next_week] == [
        ("skipped", f"not queued: a cycle of billing is already queued (run {queued.id})")
    ]
    assert [row.decision for row in scheduled(sessions)] == ["queued", "skipped"]
    assert deferrer.run_ids == [queued.id]


def test_a_domain_with_a_bad_schedule_does_not_stop_the_others(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    configure(sessions, acme, {"cycle": {"schedule": "every monday", "min_new_signal": 0}})
    with unit_of_work(sessions) as session:
        tenant = tenancy.get_tenant(session=session, name="acme")
        other = tenancy.create_domain(session=session, tenant=tenant, name="support")
        other.config = {"cycle": {"min_new_signal": 0}}

    decisions = tick(sessions, MONDAY_2AM, RecordingDeferrer())

    assert [(d.domain, d.decision) for d in decisions] == [("support", "queued")]


def test_postgres_is_required_with_a_clear_message() -> None:
    with pytest.raises(InvalidState) as refused:
        jobs.job_conninfo("sqlite:////tmp/flywheel.db")
    assert refused.value.message == jobs.POSTGRES_ONLY
    assert "run `flywheel cycle` inline" in jobs.POSTGRES_ONLY


def test_a_sqlalchemy_url_becomes_a_libpq_conninfo() -> None:
    url = "postgresql+psycopg://fly:p%40ss%20word@db.internal:6543/flywheel?sslmode=require"

    parsed = psycopg.conninfo.conninfo_to_dict(jobs.job_conninfo(url))

    assert parsed == {
        "host": "db.internal",
        "port": "6543",
        "dbname": "flywheel",
        "user": "fly",
        "password": "p@ss word",
        "sslmode": "require",
    }


def test_a_bad_scheduler_cron_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_SCHEDULER_TICK_CRON", "every minute")
    with pytest.raises(ValidationError, match="not a cron expression"):
        Settings()
    monkeypatch.setenv("FLYWHEEL_SCHEDULER_TICK_CRON", "* * * * * */2")  # seconds: allowed
    assert Settings().scheduler_tick_cron == "* * * * * */2"


def interrupted_run(sessions: sessionmaker[Session], caller: Caller, beat_s_ago: float) -> Run:
    """A cycle run left `running` by a worker that died `beat_s_ago` seconds after the run's
    last heartbeat (what a retried job finds)."""
    with unit_of_work(sessions) as session:
        run = queue_cycle(session, tenant_id=caller.tenant_id, domain="billing", trigger="api")
        run.status, run.started_at = "running", utcnow() - timedelta(seconds=10)
        run.heartbeat_at = utcnow() - timedelta(seconds=beat_s_ago)
    return run


def run_row(sessions: sessionmaker[Session], run_id: uuid.UUID) -> Run:
    with sessions() as session:
        return session.get_one(Run, run_id)


@pytest.mark.commits("carry_out works in its own transactions, as a worker does")
def test_a_retried_cycle_whose_worker_died_just_after_a_heartbeat_is_resumed(
    sessions: sessionmaker[Session], acme: Caller, settings: Settings
) -> None:
    # The sweep found the worker stalled by procrastinate's heartbeat, a separate clock from
    # the run's own: the run's last beat can still be fresh when the retried job claims it.
    quick = settings.model_copy(update={"cycle_stale_after_s": 1.5, "cycle_heartbeat_s": 0.2})
    run = interrupted_run(sessions, acme, beat_s_ago=0.2)
    assert run.heartbeat_at is not None

    outcome = jobs.carry_out(sessions, quick, run.id)

    after = run_row(sessions, run.id)
    assert after.status in FINISHED, (after.status, outcome)  # not left running for ever
    assert outcome["run_id"] == str(run.id)
    assert "running elsewhere" not in str(outcome.get("error"))
    compiled = after.steps["compile"]
    assert compiled["status"] == "succeeded"  # carried out, not given up
    taken_over = datetime.fromisoformat(compiled["started_at"])
    assert taken_over > run.heartbeat_at + timedelta(seconds=1.5)  # once silent long enough


@pytest.mark.commits("carry_out works in its own transactions, and a thread beats the run")
def test_a_retried_cycle_whose_run_still_beats_is_left_to_its_process(
    sessions: sessionmaker[Session], acme: Caller, settings: Settings
) -> None:
    quick = settings.model_copy(update={"cycle_stale_after_s": 1.0, "cycle_heartbeat_s": 0.2})
    run = interrupted_run(sessions, acme, beat_s_ago=0.0)
    alive = threading.Event()

    def beat() -> None:  # the run's process is alive (only its worker's heartbeat was late)
        while not alive.wait(0.1):
            with unit_of_work(sessions) as session:
                session.get_one(Run, run.id).heartbeat_at = utcnow()

    beater = threading.Thread(target=beat)
    beater.start()
    try:
        started = time.monotonic()
        outcome = jobs.carry_out(sessions, quick, run.id)
        waited = time.monotonic() - started
    finally:
        alive.set()
        beater.join(timeout=10)

    assert outcome["status"] == "skipped"
    assert "is running elsewhere (its heartbeat is fresh)" in outcome["error"]
    after = run_row(sessions, run.id)
    assert (after.status, after.steps) == ("running", {})  # untouched: its process goes on
    assert waited < 1.0 + 5.0  # about one stale period, never for ever


def test_runs_list_show_and_cancel_from_the_cli(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    with unit_of_work(on_test_database) as session:
        run = queue_cycle(session, tenant_id=acme.tenant_id, domain="billing", trigger="manual")

    listed = run_cli(capsys, "runs", "list", "--domain", "billing", "--json")
    shown = run_cli(capsys, "runs", "show", str(run.id), "--json")
    cancelled = run_cli(capsys, "runs", "cancel", str(run.id), "--json")
    again = run_cli(capsys, "runs", "cancel", str(run.id))
    unknown = run_cli(capsys, "runs", "list", "--domain", "nope")
    bad_status = run_cli(capsys, "runs", "list", "--status", "done")

    assert listed[0] == 0, listed[2]
    assert [(r["id"], r["status"], r["trigger"]) for r in json.loads(listed[1])] == [
        (str(run.id), "queued", "manual")
    ]
    assert json.loads(shown[1])["domain"] == "billing"
    assert cancelled[0] == 0
    assert json.loads(cancelled[1])["status"] == "cancelled"
    assert (again[0], again[2].strip()) == (
        1,
        f"error: run {run.id} has already finished (cancelled)",
    )
    assert unknown[0] == 2
    assert "domain 'nope' not found" in unknown[2]
    assert bad_status[0] == 2
    assert "unknown status 'done'" in bad_status[2]


def test_the_embedded_database_refuses_workers_and_triggers_in_one_line(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "init")[0] == 0
    assert run_cli(capsys, "tenants", "create", "acme")[0] == 0
    assert run_cli(capsys, "domains", "create", "billing", "--tenant", "acme")[0] == 0

    trigger = run_cli(capsys, "runs", "trigger", "--domain", "billing")
    worker = run_cli(capsys, "worker")
    bad_queue = run_cli(capsys, "worker", "--queue", "tpu")

    assert (trigger[0], trigger[2]) == (1, f"error: {jobs.POSTGRES_ONLY}\n")
    assert (worker[0], worker[2]) == (1, f"error: {jobs.POSTGRES_ONLY}\n")
    assert (bad_queue[0], bad_queue[2]) == (2, "error: unknown queue 'tpu': use gpu or cpu\n")


# -- PostgreSQL: real jobs -----------------------------------------------------------------


@pytest.fixture
def job_tables(settings: Settings, engine: Engine) -> Iterator[None]:
    """procrastinate's tables in the test database, emptied after the test."""
    jobs.apply_schema(settings)
    yield
    with engine.begin() as connection:
        connection.execute(
            text(
                "TRUNCATE procrastinate_jobs, procrastinate_events, "
                "procrastinate_periodic_defers, procrastinate_workers CASCADE"
            )
        )


def job_rows(sessions: sessionmaker[Session], task: str | None = None) -> list[Any]:
    with sessions() as session:
        rows = session.execute(
            text(
                "SELECT id, status, task_name, lock, queueing_lock, queue_name, args, attempts "
                "FROM procrastinate_jobs WHERE CAST(:task AS text) IS NULL OR task_name = :task "
                "ORDER BY id"
            ),
            {"task": task},
        )
        return list(rows)


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_applying_the_job_schema_twice_is_harmless(settings: Settings, tmp_path: Path) -> None:
    assert jobs.apply_schema(settings) is False
    assert jobs.ensure_schema(settings) is False
    assert jobs.has_schema(settings)
    embedded = Settings(database_url=f"sqlite:///{tmp_path / 'f.db'}", home=tmp_path)
    assert jobs.ensure_schema(embedded) is False  # SQLite: nothing to do, no error


@pytest.mark.postgres_only
def test_without_the_job_tables_deferring_says_what_to_run(tmp_path: Path) -> None:
    url = create_postgres_database()
    settings = Settings(database_url=url, home=tmp_path)
    engine = make_engine(settings)
    try:
        migrate.upgrade(url)
        sessions = make_session_factory(engine)
        caller = make_caller(sessions)
        with pytest.raises(InvalidState) as refused:
            jobs.defer_cycle(
                sessions, settings, tenant_id=caller.tenant_id, domain="billing", trigger="api"
            )
        assert refused.value.message == jobs.NO_JOB_TABLES
        assert cycles(sessions) == []
        assert not jobs.has_schema(settings)
        assert jobs.apply_schema(settings) is True
    finally:
        engine.dispose()
        drop_postgres_database(url)


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_a_deferred_cycle_commits_with_its_job_and_cancels_with_it(
    sessions: sessionmaker[Session], acme: Caller, settings: Settings
) -> None:
    run = jobs.defer_cycle(
        sessions, settings, tenant_id=acme.tenant_id, domain="billing", trigger="api"
    )
    with pytest.raises(Conflict, match="already queued"):
        jobs.defer_cycle(
            sessions, settings, tenant_id=acme.tenant_id, domain="billing", trigger="api"
        )

    [job] = job_rows(sessions)
    assert run.job_id == job.id
    assert (job.status, job.task_name, job.queue_name, job.args) == (
        "todo",
        jobs.CYCLE_TASK,
        "gpu",
        {"run_id": str(run.id)},
    )
    assert (job.lock, job.queueing_lock) == (f"domain:{run.domain_id}", f"cycle:{run.domain_id}")
    assert len(cycles(sessions)) == 1

    with unit_of_work(sessions) as session:
        jobs.cancel_run(session, tenant_id=acme.tenant_id, run_id=run.id)
    assert [row.status for row in job_rows(sessions)] == ["cancelled"]
    assert [c.status for c in cycles(sessions)] == ["cancelled"]


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_a_job_already_waiting_for_the_domain_refuses_another_and_writes_nothing(
    sessions: sessionmaker[Session], acme: Caller, settings: Settings
) -> None:
    run = jobs.defer_cycle(
        sessions, settings, tenant_id=acme.tenant_id, domain="billing", trigger="api"
    )
    with unit_of_work(sessions) as session:  # the run ends, its job somehow still waits
        session.execute(update(Run).values(status="failed"))

    with pytest.raises(Conflict, match="a cycle job of this domain is already waiting"):
        jobs.defer_cycle(
            sessions, settings, tenant_id=acme.tenant_id, domain="billing", trigger="api"
        )

    assert [c.id for c in cycles(sessions)] == [run.id]
    assert len(job_rows(sessions)) == 1


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
@pytest.mark.commits("two ticks race from threads, each in its own transaction")
def test_racing_ticks_decide_a_period_once(sessions: sessionmaker[Session], acme: Caller) -> None:
    configure(sessions, acme, {"cycle": {"min_new_signal": 1}})
    add_items(sessions, acme, 3)
    start = threading.Barrier(2)
    results: list[list[schedule.Decision]] = []

    def slow_defer(session: Session, run: Run) -> int:
        time.sleep(0.5)  # hold the period's row while the other tick tries to insert it
        return jobs.defer_cycle_job(session, run)

    def ticker() -> None:
        start.wait()
        results.append(tick(sessions, MONDAY_2AM, slow_defer))

    threads = [threading.Thread(target=ticker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(len(decisions) for decisions in results) == [0, 1]
    [run] = cycles(sessions)
    [row] = scheduled(sessions)
    assert (row.decision, row.training_run_id) == ("queued", run.id)
    [job] = job_rows(sessions)
    assert job.id == run.job_id


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_runs_trigger_and_cancel_from_the_cli(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "runs", "trigger", "--domain", "billing", "--json")
    assert code == 0, err
    queued = json.loads(out)
    again = run_cli(capsys, "runs", "trigger", "--domain", "billing")
    cancelled = run_cli(capsys, "runs", "cancel", queued["id"], "--json")

    assert (queued["status"], queued["trigger"]) == ("queued", "manual")
    [job] = job_rows(on_test_database)
    assert queued["job_id"] == job.id
    assert again[0] == 1
    assert "already queued" in again[2]
    assert json.loads(cancelled[1])["status"] == "cancelled"
    assert [row.status for row in job_rows(on_test_database)] == ["cancelled"]


# -- PostgreSQL: real workers --------------------------------------------------------------


class Workers:
    """`flywheel worker` processes on the test database, each in its own process group (a
    kill takes its training subprocess too, as losing the machine would)."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = self.directory / f"worker-{len(self.processes)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "flywheel", "worker", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.directory.glob("worker-*.log"))
        )

    def trainer_of(self) -> subprocess.Popen[bytes] | None:
        """The worker whose child process is training right now."""
        for process in self.processes:
            if process.poll() is not None:
                continue
            for child in psutil.Process(process.pid).children(recursive=True):
                try:
                    if "finetune" in child.cmdline():
                        return process
                except psutil.NoSuchProcess:
                    continue
        return None

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny model with the synthetic domain's tokenizer (as in tests/finetune)."""
    from finetune import synthetic, tiny

    directory = tmp_path_factory.mktemp("tiny-base")
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts(), vocab_size=128)
    model = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    tiny.save_base(directory, model, tokenizer)
    return directory


@pytest.fixture
def quick_domain(sessions: sessionmaker[Session], acme: Caller, tiny_base: Path) -> Caller:
    """acme/billing with synthetic training signal and a cycle that trains in seconds."""
    from tests.finetune.test_train_cli import synthetic_candidates  # imports torch: here

    _store(sessions, acme, synthetic_candidates())
    configure(
        sessions,
        acme,
        {
            "base_model": str(tiny_base),
            "cycle": {**QUICK_CYCLE, "min_new_signal": 10},
            "gate": {"min_items": 2},
        },
    )
    return acme


@pytest.fixture
def workers(
    database_url: str, tmp_path: Path, job_tables: None
) -> Iterator[Callable[..., Workers]]:
    made: list[Workers] = []

    def make(*, tick_cron: str = NEVER) -> Workers:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
        env |= {
            "FLYWHEEL_DATABASE_URL": database_url,
            "FLYWHEEL_HOME": str(home),
            "FLYWHEEL_SCHEDULER_TICK_CRON": tick_cron,
            "FLYWHEEL_STALLED_RETRY_CRON": "* * * * * *",
            "FLYWHEEL_WORKER_HEARTBEAT_S": "0.5",
            "FLYWHEEL_STALLED_AFTER_S": "2",
            "FLYWHEEL_CYCLE_HEARTBEAT_S": "0.5",
            "FLYWHEEL_CYCLE_STALE_AFTER_S": "2",
        }
        made.append(Workers(tmp_path, env))
        return made[-1]

    yield make
    for group in made:
        group.stop_all()


def wait_for(check: Callable[[], T | None], *, timeout_s: float, what: str, workers: Workers) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{workers.logs()}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def succeeded_cycles_metric(port: int) -> float:
    """`flywheel_cycles_total{event="succeeded"}` from a worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    prefix = 'flywheel_cycles_total{event="succeeded"} '
    return sum(float(line.removeprefix(prefix)) for line in lines if line.startswith(prefix))


def live_workers(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        return int(session.scalar(text("SELECT count(*) FROM procrastinate_workers")) or 0)


def finished_cycles(sessions: sessionmaker[Session], count: int = 1) -> list[Run] | None:
    found = [run for run in cycles(sessions) if run.status in FINISHED]
    return found if len(found) >= count else None


def succeeded_ticks(sessions: sessionmaker[Session]) -> int:
    return sum(1 for job in job_rows(sessions, jobs.TICK_TASK) if job.status == "succeeded")


@pytest.mark.postgres_only
@pytest.mark.commits("real flywheel worker processes read and write the rows")
def test_two_workers_and_one_schedule_period_give_exactly_one_cycle(
    sessions: sessionmaker[Session], quick_domain: Caller, workers: Callable[..., Workers]
) -> None:
    group = workers(tick_cron="* * * * * */2")  # a tick every 2 seconds
    ports = [free_port(), free_port()]
    first, second = (group.start("--metrics-port", str(port)) for port in ports)
    wait_for(lambda: live_workers(sessions) == 2, timeout_s=60, what="2 workers", workers=group)

    [run] = wait_for(
        lambda: finished_cycles(sessions), timeout_s=240, what="the cycle", workers=group
    )
    ticks_then = succeeded_ticks(sessions)
    wait_for(
        lambda: succeeded_ticks(sessions) >= ticks_then + 2,
        timeout_s=30,
        what="two more ticks in the same period",
        workers=group,
    )

    assert run.status == "succeeded", (run.error, run.steps, group.logs())
    assert run.config["trigger"] == "schedule"
    steps = ("compile", "build", "train_sft", "evaluate", "promote")
    statuses = {name: step["status"] for name, step in run.steps.items()}
    assert statuses == dict.fromkeys(steps, "succeeded")
    [row] = scheduled(sessions)
    assert (row.decision, row.training_run_id) == ("queued", run.id)
    assert row.period_start == schedule.period_start(WEEKLY, utcnow())
    [job] = job_rows(sessions, jobs.CYCLE_TASK)
    assert (job.id, job.status, job.attempts) == (run.job_id, "succeeded", 1)  # ran once
    assert [c.id for c in cycles(sessions)] == [run.id]
    assert sum(succeeded_cycles_metric(port) for port in ports) == 1
    # SIGTERM stops an idle worker cleanly
    for process in (first, second):
        process.send_signal(signal.SIGTERM)
    assert [process.wait(timeout=30) for process in (first, second)] == [0, 0]
    assert live_workers(sessions) == 0


def died_just_after_beating_its_run(sessions: sessionmaker[Session], job_id: int) -> None:
    """Make certain the worst moment of a kill, which happens by chance (it made this test
    flaky): the worker beat its run just before it died, while its own heartbeat (procrastinate's,
    a separate clock) was late, so the sweep finds it stalled while the run still looks alive.
    Only the dead worker's rows change; nothing can write them any more."""
    with unit_of_work(sessions) as session:
        session.execute(update(Run).where(Run.method == "cycle").values(heartbeat_at=utcnow()))
        session.execute(
            text(
                "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1.9 seconds' "
                "WHERE id = (SELECT worker_id FROM procrastinate_jobs WHERE id = :job)"
            ),
            {"job": job_id},
        )


def resumed_since(sessions: sessionmaker[Session], moment: datetime) -> bool:
    [run] = cycles(sessions)
    started = run.steps.get("train_sft", {}).get("started_at")
    return started is not None and datetime.fromisoformat(started) > moment


@pytest.mark.postgres_only
@pytest.mark.commits("real flywheel worker processes read and write the rows")
def test_a_worker_killed_mid_training_has_its_cycle_resumed_by_another(
    sessions: sessionmaker[Session],
    quick_domain: Caller,
    settings: Settings,
    workers: Callable[..., Workers],
) -> None:
    group = workers()
    group.start()
    group.start()
    wait_for(lambda: live_workers(sessions) == 2, timeout_s=60, what="2 workers", workers=group)
    run = jobs.defer_cycle(
        sessions, settings, tenant_id=quick_domain.tenant_id, domain="billing", trigger="api"
    )

    victim = wait_for(group.trainer_of, timeout_s=120, what="training to start", workers=group)
    [before] = cycles(sessions)
    [taken] = job_rows(sessions, jobs.CYCLE_TASK)
    killed_at = utcnow()
    group.kill(victim)
    died_just_after_beating_its_run(sessions, taken.id)

    wait_for(
        lambda: resumed_since(sessions, killed_at),
        timeout_s=60,
        what="the survivor to resume the training step",
        workers=group,
    )
    [after] = wait_for(
        lambda: finished_cycles(sessions), timeout_s=240, what="the resumed cycle", workers=group
    )

    assert after.id == run.id
    assert after.status == "succeeded", (after.error, after.steps, group.logs())
    assert before.steps["train_sft"]["status"] == "running"
    for step in ("compile", "build"):  # done before the kill: not redone
        assert after.steps[step] == before.steps[step]
    resumed = datetime.fromisoformat(after.steps["train_sft"]["started_at"])
    assert resumed > killed_at
    [job] = job_rows(sessions, jobs.CYCLE_TASK)
    assert (job.id, job.status, job.attempts) == (run.job_id, "succeeded", 2)  # retried once
    assert any(p.poll() is None for p in group.processes)  # the survivor carried it out


@pytest.mark.postgres_only
@pytest.mark.commits("real flywheel worker processes read and write the rows")
def test_a_second_cycle_of_a_running_domain_waits_for_the_first(
    sessions: sessionmaker[Session],
    quick_domain: Caller,
    settings: Settings,
    workers: Callable[..., Workers],
) -> None:
    group = workers()
    group.start()
    group.start()
    wait_for(lambda: live_workers(sessions) == 2, timeout_s=60, what="2 workers", workers=group)

    def defer() -> Run:
        return jobs.defer_cycle(
            sessions, settings, tenant_id=quick_domain.tenant_id, domain="billing", trigger="api"
        )

    first = defer()
    wait_for(
        lambda: cycles(sessions)[0].status == "running",
        timeout_s=60,
        what="the first to run",
        workers=group,
    )
    second = defer()  # a running cycle does not refuse another: it queues behind the lock
    with pytest.raises(Conflict, match="already queued"):
        defer()  # but only one may wait
    time.sleep(2)  # a worker is free, yet the second job waits for the domain's lock
    states = {job.id: job.status for job in job_rows(sessions, jobs.CYCLE_TASK)}
    with sessions() as session:  # read after the jobs: the first still ran when they were read
        first_now = session.get_one(Run, first.id).status
    assert first_now == "running"
    assert states == {first.job_id: "doing", second.job_id: "todo"}

    done = wait_for(
        lambda: finished_cycles(sessions, 2), timeout_s=300, what="both cycles", workers=group
    )

    by_id = {run.id: run for run in done}
    earlier, later = by_id[first.id], by_id[second.id]
    assert earlier.status == "succeeded", group.logs()
    assert earlier.finished_at is not None
    assert later.started_at is not None
    assert later.started_at >= earlier.finished_at
    assert later.status == "skipped"  # nothing new since the first: same dataset version
    assert "already cycled" in (later.error or "")
