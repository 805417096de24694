"""The scheduler's tick over many domains: set-based, so a domain with too little new signal
costs no statements of its own (counted with a `before_cursor_execute` listener, not timed)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from bench.scheduler_tick import (
    MONDAY_2AM,
    CountingDeferrer,
    QueryCounter,
    make_fleet,
)
from flywheel.db import unit_of_work
from flywheel.models import Domain, Run, ScheduledCycle, Tenant
from flywheel.scheduling import jobs, schedule
from tests.integration.test_scheduling import job_tables

__all__ = ["job_tables"]  # the fixture, shared with the scheduling tests

NO_SIGNAL = 0  # `signal_every`: no domain gets enough for a cycle


def tick_statements(sessions: sessionmaker[Session], engine: Engine, week: int) -> int:
    counter = QueryCounter(engine)
    with unit_of_work(sessions) as session, counter.counting():
        decisions = schedule.tick(
            session, at=MONDAY_2AM + timedelta(weeks=week), defer=CountingDeferrer()
        )
    assert {d.decision for d in decisions} == {"skipped"}
    return len(counter.statements)


def test_a_tick_costs_the_same_statements_for_10_and_100_quiet_domains(
    sessions: sessionmaker[Session], engine: Engine
) -> None:
    with unit_of_work(sessions) as session:
        make_fleet(session, {"big": 8, "small": 2}, signal_every=NO_SIGNAL)
    at_10 = tick_statements(sessions, engine, week=0)
    with unit_of_work(sessions) as session:
        make_fleet(session, {"bigger": 85, "smaller": 5}, signal_every=NO_SIGNAL)

    at_100 = tick_statements(sessions, engine, week=1)

    assert at_10 == at_100
    assert at_100 <= 7  # domains, decided periods, counts, champions; the skipped: 3 at most
    with sessions() as session:
        assert session.query(ScheduledCycle).count() == 10 + 100


def test_a_decided_period_costs_two_statements_however_many_domains(
    sessions: sessionmaker[Session], engine: Engine
) -> None:
    with unit_of_work(sessions) as session:
        make_fleet(session, {"big": 95, "small": 5}, signal_every=NO_SIGNAL)
    tick_statements(sessions, engine, week=0)
    counter = QueryCounter(engine)

    with unit_of_work(sessions) as session, counter.counting():
        again = schedule.tick(session, at=MONDAY_2AM, defer=CountingDeferrer())

    assert again == []
    assert len(counter.statements) == 2  # the domains and the decided periods


def test_only_the_domains_with_enough_signal_are_queued_in_domain_order(
    sessions: sessionmaker[Session],
) -> None:
    with unit_of_work(sessions) as session:
        ids = make_fleet(session, {"big": 45, "small": 5}, signal_every=10)
    deferrer = CountingDeferrer()

    with unit_of_work(sessions) as session:
        decisions = schedule.tick(session, at=MONDAY_2AM, defer=deferrer)

    assert [d.domain_id for d in decisions] == ids
    queued = [d.domain_id for d in decisions if d.decision == "queued"]
    assert queued == ids[::10]
    skipped = {d.reason for d in decisions if d.decision == "skipped"}
    assert skipped == {"3 items and no champion yet, below 20"}
    with sessions() as session:
        runs = session.scalars(select(Run).where(Run.method == "cycle")).all()
        assert sorted(run.id for run in runs) == sorted(deferrer.runs)
        assert {run.domain_id for run in runs} == set(queued)
        assert session.query(Domain).count() == 50


# -- GPU jobs shared between tenants (PostgreSQL: procrastinate's queue) -------------------


def fetch_order(session: Session, count: int) -> list[uuid.UUID]:
    """The tenants of the next `count` cycle jobs, in the order procrastinate's workers take
    them (its own fetch function, each taken job finished before the next is fetched)."""
    worker = session.execute(text("SELECT procrastinate_register_worker_v1()")).scalar_one()
    order = []
    for _ in range(count):
        job_id = session.execute(
            text("SELECT id FROM procrastinate_fetch_job_v2(ARRAY['gpu'], :worker)"),
            {"worker": worker},
        ).scalar_one()
        tenant = session.execute(
            text(
                "SELECT runs.tenant_id FROM procrastinate_jobs AS jobs JOIN runs "
                "ON runs.id = CAST(jobs.args ->> 'run_id' AS uuid) WHERE jobs.id = :id"
            ),
            {"id": job_id},
        ).scalar_one()
        order.append(tenant)
        session.execute(
            text("SELECT procrastinate_finish_job_v1(:id, 'succeeded', false)"), {"id": job_id}
        )
    return order


def tenant_ids(session: Session) -> dict[str, uuid.UUID]:
    return {tenant.name: tenant.id for tenant in session.scalars(select(Tenant))}


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_a_tenant_with_5_domains_does_not_wait_behind_one_with_500(
    sessions: sessionmaker[Session],
) -> None:
    with unit_of_work(sessions) as session:  # A's domains are older: first in every list
        make_fleet(session, {"a": 500}, signal_every=1)
        make_fleet(session, {"b": 5}, signal_every=1)
    with unit_of_work(sessions) as session:
        decisions = schedule.tick(session, at=MONDAY_2AM, defer=jobs.defer_cycle_job)
        jobs.share_gpu(session)
    assert sum(d.decision == "queued" for d in decisions) == 505

    with unit_of_work(sessions) as session:
        tenant = tenant_ids(session)
        order = fetch_order(session, 12)

    a, b = tenant["a"], tenant["b"]
    assert order == [a, b] * 5 + [a, a]  # round-robin while both wait, then A alone


@pytest.mark.postgres_only
@pytest.mark.usefixtures("job_tables")
def test_a_tenant_whose_cycle_runs_yields_the_next_gpu_to_the_others(
    sessions: sessionmaker[Session],
) -> None:
    with unit_of_work(sessions) as session:
        make_fleet(session, {"a": 3}, signal_every=1)
        make_fleet(session, {"b": 3}, signal_every=1)
    with unit_of_work(sessions) as session:
        schedule.tick(session, at=MONDAY_2AM, defer=jobs.defer_cycle_job)
        jobs.share_gpu(session)
        tenant = tenant_ids(session)
        worker = session.execute(text("SELECT procrastinate_register_worker_v1()")).scalar_one()
        session.execute(  # a worker takes A's first cycle, and keeps it running
            text("SELECT id FROM procrastinate_fetch_job_v2(ARRAY['gpu'], :worker)"),
            {"worker": worker},
        )
        assert jobs.share_gpu(session) == 0  # a start moves no rank: it needs no re-ranking

        order = fetch_order(session, 5)

    a, b = tenant["a"], tenant["b"]
    assert order == [b, a, b, a, b]
