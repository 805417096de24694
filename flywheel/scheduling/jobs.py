"""Cycles on procrastinate workers (PostgreSQL only): the job app, deferring and cancelling.

Queues: `gpu` carries cycles (training), `cpu` the scheduler's housekeeping. Tasks:

- `flywheel.cycle(run_id)` (gpu): carries out one queued cycle run with `run_cycle`. Its job
  has `lock=domain:<id>`, so two cycles of a domain never run at once, whichever workers
  hold them (a second one waits for the first), and `queueing_lock=cycle:<id>`, so at most
  one waits. Its priority is its rank among its tenant's waiting and running cycles, so
  tenants take turns on the GPUs (`flywheel.scheduling.fairness`): re-ranked whenever cycles
  are queued.
- `flywheel.tick` (cpu, periodic, `scheduler_tick_cron`): decides each domain's schedule
  period once (`flywheel.scheduling.schedule`).
- `flywheel.retry_stalled_jobs` (cpu, periodic, `stalled_retry_cron`): the jobs of workers
  that stopped heart-beating for `stalled_after_s` (killed, machine lost) go back in the queue;
  the retried cycle resumes its run at the step that was interrupted. The worker's heartbeat
  (procrastinate's) and the run's (the cycle's own thread) are separate clocks: a worker found
  stalled may have beaten its run a moment before it died, so a retried job whose run still
  looks alive waits until the run has been silent for `cycle_stale_after_s`. If the run beats
  again meanwhile, its process is alive after all, and the job leaves the run to it.
- `flywheel.prune_jobs` (cpu, daily): finished housekeeping jobs older than a week go.
- `flywheel.retention` (cpu, daily): raw feedback events and interactions past their
  retention (`retention_raw_event_weeks`, a domain's `retention.raw_event_weeks`) go
  (`flywheel.feedback.retention`); nothing goes when neither is set.
- `flywheel.deliver_webhooks` (cpu, every minute): the champion moves' webhooks that are due
  (`flywheel.registry.webhooks`: retries, and the moves of cycles run on workers).
- `flywheel.watch` (cpu, every 15 minutes): the live watch of each domain with a `release`
  config or `auto_rollback` (`flywheel.registry.canary.watch_domains`): a worse champion rolled
  back, a canary's challenger promoted or retired; its moves' webhooks go with the next delivery.

A cycle's job is deferred on the caller's own database connection, in its transaction: the
queued run, its job and the run's `job_id` are committed together or not at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import procrastinate
import psycopg
from procrastinate import exceptions as job_errors
from procrastinate.jobs import Job, Status
from procrastinate.schema import SchemaManager
from sqlalchemy import make_url, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import (
    make_engine,
    make_session_factory,
    psycopg_connection,
    unit_of_work,
    utcnow,
)
from flywheel.errors import Conflict, FlywheelError, InvalidState
from flywheel.feedback import retention
from flywheel.registry import canary, webhooks
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.models import Run
from flywheel.scheduling import fairness, schedule
from flywheel.scheduling.cycle import CycleRequest, run_cycle
from flywheel.scheduling.runs import last_beat, queue_cycle, request_cancel
from flywheel.settings import Settings
from flywheel.tenancy.models import Domain

log = logging.getLogger(__name__)

GPU, CPU = "gpu", "cpu"
QUEUES = (GPU, CPU)
CYCLE_TASK = "flywheel.cycle"
TICK_TASK = "flywheel.tick"
RETRY_TASK = "flywheel.retry_stalled_jobs"
PRUNE_TASK = "flywheel.prune_jobs"
WEBHOOKS_TASK = "flywheel.deliver_webhooks"
WATCH_TASK = "flywheel.watch"
RETENTION_TASK = "flywheel.retention"
WEBHOOKS_BUDGET_S = 45.0  # within its minute: the next run does not queue behind it
KEEP_FINISHED_JOBS_H = 7 * 24
SILENCE_MARGIN_S = 0.1  # past the stale threshold, so that `claim_run` finds the run stale
SCHEMA_LOCK = 0x666C7977  # pg_advisory_xact_lock key: one schema install at a time
MISSING_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedObject,
)
NO_JOB_TABLES = "the job tables are missing: run `flywheel db upgrade`"
POSTGRES_ONLY = (
    "workers and scheduled cycles need PostgreSQL (FLYWHEEL_DATABASE_URL); "
    "run `flywheel cycle` inline"
)


def job_conninfo(database_url: str) -> str:
    """The libpq conninfo of a `postgresql+psycopg://` SQLAlchemy URL; InvalidState otherwise."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        raise InvalidState(POSTGRES_ONLY)
    params: dict[str, Any] = {
        "host": url.host,
        "port": url.port,
        "dbname": url.database,
        "user": url.username,
        "password": url.password,
    }
    for key, value in url.query.items():
        params[key] = value if isinstance(value, str) else value[-1]
    return psycopg.conninfo.make_conninfo(
        **{key: str(value) for key, value in params.items() if value is not None}
    )


def make_job_app(
    settings: Settings,
    sessions: sessionmaker[Session] | None = None,
) -> procrastinate.App:
    """The procrastinate app a worker runs: its connector, tasks and periodic tasks."""
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=job_conninfo(settings.resolved_database_url), min_size=1, max_size=4
        ),
        worker_defaults={
            "update_heartbeat_interval": settings.worker_heartbeat_s,
            "stalled_worker_timeout": settings.stalled_after_s,
        },
    )
    factory = sessions or make_session_factory(make_engine(settings))

    @app.task(name=CYCLE_TASK, queue=GPU)
    def cycle(run_id: str) -> dict[str, Any]:
        return carry_out(factory, settings, uuid.UUID(run_id))

    @app.periodic(cron=settings.scheduler_tick_cron, periodic_id="schedule")
    @app.task(name=TICK_TASK, queue=CPU, queueing_lock=TICK_TASK)
    def tick(timestamp: int) -> list[dict[str, Any]]:
        with unit_of_work(factory) as session:
            at = datetime.fromtimestamp(timestamp, UTC)
            decisions = schedule.tick(session, at=at, defer=defer_cycle_job)
            if any(decision.decision == "queued" for decision in decisions):
                share_gpu(session)
        return [decision.as_json() for decision in decisions]

    @app.periodic(cron=settings.stalled_retry_cron, periodic_id="stalled")
    @app.task(name=RETRY_TASK, queue=CPU, queueing_lock=RETRY_TASK)
    async def retry_stalled_jobs(timestamp: int) -> list[int]:
        return await retry_stalled(app, factory, settings)

    @app.periodic(cron="17 3 * * *", periodic_id="prune")
    @app.task(name=PRUNE_TASK, queue=CPU, queueing_lock=PRUNE_TASK)
    async def prune_jobs(timestamp: int) -> None:
        await app.job_manager.delete_old_jobs(nb_hours=KEEP_FINISHED_JOBS_H, queue=CPU)

    @app.periodic(cron="43 3 * * *", periodic_id="retention")
    @app.task(name=RETENTION_TASK, queue=CPU, queueing_lock=RETENTION_TASK)
    def purge_raw_events(timestamp: int) -> dict[str, Any]:
        return retention.purge_raw_events(
            factory, weeks=settings.retention_raw_event_weeks, now=utcnow()
        ).as_json()

    @app.periodic(cron="* * * * *", periodic_id="webhooks")
    @app.task(name=WEBHOOKS_TASK, queue=CPU, queueing_lock=WEBHOOKS_TASK)
    def deliver_webhooks(timestamp: int) -> dict[str, Any]:
        if settings.webhook_secret is None:
            return {"skipped": "FLYWHEEL_WEBHOOK_SECRET is not set"}
        return webhooks.deliver_due(
            factory, budget_s=WEBHOOKS_BUDGET_S, settings=settings
        ).as_json()

    @app.periodic(cron="*/15 * * * *", periodic_id="watch")
    @app.task(name=WATCH_TASK, queue=CPU, queueing_lock=WATCH_TASK)
    def watch_releases(timestamp: int) -> list[dict[str, Any]]:
        registry = MlflowRegistry(settings.resolved_mlflow_tracking_uri)
        return canary.watch_domains(factory, registry)

    return app


def run_worker(
    settings: Settings,
    *,
    queues: Sequence[str] = QUEUES,
    concurrency: int = 1,
    name: str | None = None,
) -> None:
    """Work the queues until SIGINT/SIGTERM. The first signal stops taking jobs and lets the
    running ones finish; a second one exits at once (the stalled-job sweep retries them)."""
    if not has_schema(settings):
        raise InvalidState(NO_JOB_TABLES)
    app = make_job_app(settings)
    app.run_worker(queues=list(queues), concurrency=concurrency, name=name or "flywheel")


# -- deferring, cancelling ----------------------------------------------------------------


def defer_cycle(
    sessions: sessionmaker[Session],
    settings: Settings,
    *,
    tenant_id: uuid.UUID,
    domain: str,
    trigger: str,
) -> Run:
    """Queue a cycle of `domain` and its job, in one transaction (see `queue_and_defer`)."""
    job_conninfo(settings.resolved_database_url)  # refuse SQLite before anything is written
    with unit_of_work(sessions) as session:
        return queue_and_defer(session, tenant_id=tenant_id, domain=domain, trigger=trigger)


def queue_and_defer(session: Session, *, tenant_id: uuid.UUID, domain: str, trigger: str) -> Run:
    """A queued cycle run with its job deferred and `job_id` set, in the session's transaction.
    Conflict when one already waits; InvalidState on SQLite (no workers there)."""
    _psycopg_connection(session)
    run = queue_cycle(session, tenant_id=tenant_id, domain=domain, trigger=trigger)
    run.job_id = defer_cycle_job(session, run)
    session.flush()
    share_gpu(session)
    return run


def share_gpu(session: Session) -> int:
    """Re-rank the waiting cycle jobs round-robin by tenant (`flywheel.scheduling.fairness`)."""
    return fairness.share_gpu(session, queue=GPU, task=CYCLE_TASK)


def defer_cycle_job(session: Session, run: Run) -> int:
    """Defer `run`'s job on the session's own connection: it commits or rolls back with it."""
    deferrer = _sync_jobs().configure_task(
        CYCLE_TASK,
        queue=GPU,
        lock=f"domain:{run.domain_id}",
        queueing_lock=f"cycle:{run.domain_id}",
        connection=_psycopg_connection(session),
    )
    try:
        return deferrer.defer(run_id=str(run.id))
    except job_errors.AlreadyEnqueued as error:
        raise Conflict("a cycle job of this domain is already waiting") from error
    except job_errors.ConnectorException as error:
        if isinstance(error.__cause__, MISSING_SCHEMA):
            raise InvalidState(NO_JOB_TABLES) from error
        raise


def cancel_run(session: Session, *, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run:
    """Cancel a run (`request_cancel`); a queued cycle's job is cancelled too if no worker has
    taken it yet (a taken one finds its run cancelled and ends at once)."""
    run = request_cancel(session, tenant_id=tenant_id, run_id=run_id)
    if run.status == "cancelled" and run.job_id is not None:
        _sync_jobs().job_manager.cancel_job_by_id(
            run.job_id, connection=_psycopg_connection(session)
        )
    return run


def _sync_jobs() -> procrastinate.App:
    """An app that only defers and cancels, always on a connection it is given (never its own
    pool, which is never opened)."""
    return procrastinate.App(connector=procrastinate.SyncPsycopgConnector())


def _psycopg_connection(session: Session) -> psycopg.Connection[Any]:
    if session.get_bind().dialect.name != "postgresql":
        raise InvalidState(POSTGRES_ONLY)
    return psycopg_connection(session)


# -- the schema ----------------------------------------------------------------------------


def has_schema(settings: Settings) -> bool:
    with psycopg.connect(job_conninfo(settings.resolved_database_url)) as connection:
        row = connection.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    return row is not None and row[0] is not None


def ensure_schema(settings: Settings) -> bool:
    """`apply_schema` on PostgreSQL; nothing on SQLite (no workers there). What
    `flywheel db upgrade` calls."""
    if make_url(settings.resolved_database_url).get_backend_name() != "postgresql":
        return False
    return apply_schema(settings)


def apply_schema(settings: Settings) -> bool:
    """Install procrastinate's tables and functions unless they are there; True if it did.
    Safe to run from several processes at once (an advisory lock serialises them)."""
    with psycopg.connect(job_conninfo(settings.resolved_database_url)) as connection:
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        row = connection.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
        if row is not None and row[0] is not None:
            return False
        connection.execute(SchemaManager.get_schema())
    return True


# -- what the tasks do ---------------------------------------------------------------------


def carry_out(
    sessions: sessionmaker[Session], settings: Settings, run_id: uuid.UUID
) -> dict[str, Any]:
    """Run (or resume) the queued cycle `run_id`. If it cannot start because another cycle of
    the domain runs outside the workers (`flywheel cycle`), it ends `skipped`; on any other
    error before it started, `failed`: a run never stays queued with no job behind it. (A run
    that started and then crashed stays `running` until stale, and is resumed: a job that
    finds its run `running` first waits for it to go stale, `wait_for_silence`.)"""
    with sessions() as session:
        run = session.get(Run, run_id)
        if run is None:
            log.warning("cycle job for a run that does not exist", extra={"run_id": str(run_id)})
            return {"run_id": str(run_id), "status": "missing"}
        domain = session.get_one(Domain, run.domain_id)
        trigger = str((run.config or {}).get("trigger", "schedule"))
        request = CycleRequest(run.tenant_id, domain.name, trigger, run_id=run.id)
        beat = last_beat(run) if run.status == "running" else None
    if beat is not None:  # a retried job: its dead worker may have beaten the run just now
        wait_for_silence(run_id, beat, settings.cycle_stale_after_s)
    try:
        return run_cycle(sessions, request, settings).as_json()
    except Conflict as error:
        end_run(sessions, run_id, "skipped", f"not run: {error.message}", unless_started=True)
        return {"run_id": str(run_id), "status": "skipped", "error": error.message}
    except Exception as error:
        message = error.message if isinstance(error, FlywheelError) else repr(error)
        end_run(sessions, run_id, "failed", message, unless_started=True)
        raise


def wait_for_silence(run_id: uuid.UUID, beat: datetime, stale_after_s: float) -> None:
    """Sleep until a run that last beat at `beat` has been silent for `stale_after_s` (then
    `claim_run` takes it over, unless it beat again meanwhile: then its process is alive).
    Never longer than one stale period, whatever the writer's clock said."""
    remaining = (beat - utcnow()).total_seconds() + stale_after_s + SILENCE_MARGIN_S
    wait_s = min(max(remaining, 0.0), stale_after_s + SILENCE_MARGIN_S)
    if wait_s > 0:
        log.info("run %s beat %.1f s ago: waiting %.1f s for it to go silent",
                 run_id, (utcnow() - beat).total_seconds(), wait_s)  # fmt: skip
        time.sleep(wait_s)


def end_run(
    sessions: sessionmaker[Session],
    run_id: uuid.UUID,
    status: str,
    error: str,
    *,
    unless_started: bool = False,
) -> None:
    """End a run that is still queued (or running, unless `unless_started`); a finished one
    is left as it is."""
    open_statuses = ("queued",) if unless_started else ("queued", "running")
    with unit_of_work(sessions) as session:
        session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status.in_(open_statuses))
            .values(status=status, error=error, finished_at=utcnow())
        )


async def retry_stalled(
    app: procrastinate.App, sessions: sessionmaker[Session], settings: Settings
) -> list[int]:
    """Put the jobs of dead workers back in the queue; the ids retried. A stalled cycle is
    retried up to `stalled_max_retries` times; a stalled housekeeping job just ends (the next
    period brings another)."""
    manager = app.job_manager
    retried = []
    for job in await manager.get_stalled_jobs(seconds_since_heartbeat=settings.stalled_after_s):
        assert job.id is not None
        if job.task_name != CYCLE_TASK:
            await _finish_failed(app, job)
        elif job.attempts >= settings.stalled_max_retries:
            await _give_up(app, sessions, job, f"its worker was lost {job.attempts + 1} times")
        elif await _retry(app, sessions, job):
            retried.append(job.id)
    return retried


async def _retry(app: procrastinate.App, sessions: sessionmaker[Session], job: Job) -> bool:
    try:
        await app.job_manager.retry_job(job)
    except job_errors.UniqueViolation:
        # Another cycle of the domain waits (one may wait per domain): that one goes ahead.
        await _give_up(app, sessions, job, "its worker was lost and a newer cycle is queued")
        return False
    except job_errors.ConnectorException as error:  # a concurrent sweep retried it first
        log.info("stalled job %s not retried: %s", job.id, error)
        return False
    log.warning("retrying job %s: its worker stopped heart-beating", job.id)
    return True


async def _give_up(
    app: procrastinate.App, sessions: sessionmaker[Session], job: Job, reason: str
) -> None:
    await _finish_failed(app, job)
    run_id = job.task_kwargs.get("run_id")
    if isinstance(run_id, str):
        await asyncio.to_thread(end_run, sessions, uuid.UUID(run_id), "failed", reason)
    log.error("cycle job %s failed: %s", job.id, reason, extra={"run_id": run_id})


async def _finish_failed(app: procrastinate.App, job: Job) -> None:
    assert job.id is not None
    try:
        await app.job_manager.finish_job_by_id_async(job.id, Status.FAILED, delete_job=False)
    except job_errors.ConnectorException as error:  # already finished or retried
        log.info("stalled job %s not ended: %s", job.id, error)
