"""The scheduler's tick: each domain's current schedule period is decided once, and only once.

A domain's `cycle.schedule` is a cron expression in UTC (default `0 2 * * 1`, Mondays 02:00).
At each tick, for every domain of every tenant, the period is the latest fire time of that
cron at or before the tick. If nobody has decided that period yet, the tick decides it:

- enough new training signal since the champion's dataset (`cycle.min_new_signal`):
  a `ScheduledCycle(decision='queued')`, a queued cycle run, and its job deferred, all in
  the tick's transaction;
- otherwise a `ScheduledCycle(decision='skipped')` whose reason says how much there was.

The period row is inserted with ON CONFLICT DO NOTHING on (domain, period): however many
workers tick at once, exactly one of them wins a period, and the others do nothing (a queued
domain's run is made first, in a savepoint that a lost claim rolls back). A period that
passed while no worker ran is not caught up: only the latest one is decided.

Set-based, for hundreds of domains: one query reads the domains, one the decided periods,
one every domain's new-signal count (`champions.new_signal_counts`), one the champions, and one
bulk insert claims every skipped period; a domain with too little new signal costs no query
of its own, and a tick whose periods are all decided (every minute but one a week) costs
two. Only a domain that gets a cycle costs its own few (its run, its claim, its job).
`bench/scheduler_tick.py` measures it at 100, 500 and 1,000 domains.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

from croniter import croniter
from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flywheel.bulk import insert_ignoring_conflicts
from flywheel.db import utcnow
from flywheel.errors import Conflict, FlywheelError
from flywheel.registry.models import Run
from flywheel.scheduling.champions import Champion, champions, new_signal_counts
from flywheel.scheduling.config import CycleSettings, cycle_settings
from flywheel.scheduling.models import ScheduledCycle
from flywheel.scheduling.runs import queue_domain_cycle
from flywheel.tenancy.models import Domain

log = logging.getLogger(__name__)


class Deferrer(Protocol):
    """Hands a queued cycle run to the job queue inside the caller's transaction; the job id."""

    def __call__(self, session: Session, run: Run) -> int: ...


@dataclass(frozen=True)
class Decision:
    """What one tick decided for one domain's period."""

    domain_id: uuid.UUID
    domain: str
    period_start: datetime
    decision: str  # queued | skipped
    reason: str
    training_run_id: uuid.UUID | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "domain_id": str(self.domain_id),
            "domain": self.domain,
            "period_start": self.period_start.isoformat(),
            "decision": self.decision,
            "reason": self.reason,
            "training_run_id": str(self.training_run_id) if self.training_run_id else None,
        }


def period_start(schedule: str, at: datetime) -> datetime:
    """The latest fire time of `schedule` (UTC cron, optional 6th field for seconds) at or
    before `at`, to the second."""
    at = at.astimezone(UTC).replace(microsecond=0)
    fired: datetime = croniter(schedule, at + timedelta(seconds=1)).get_prev(datetime)
    return fired.astimezone(UTC)


@dataclass(frozen=True)
class _Due:
    """A domain whose current period nobody has decided yet."""

    domain: Domain
    config: CycleSettings
    period: datetime


def tick(session: Session, *, at: datetime, defer: Deferrer) -> list[Decision]:
    """Decide the current period of every domain that has not been decided yet, in domain
    order. Set-based: a handful of queries decide every domain with too little new signal
    (the domains, the decided periods, the champions, the new-signal counts, one insert of
    the skipped periods), however many there are; only a domain that gets a cycle costs
    queries of its own (its run and its job)."""
    due = _due(session, at)
    if not due:
        return []
    counts = new_signal_counts(session)
    champion_of = champions(session)
    decided: dict[uuid.UUID, Decision] = {}
    skipped: list[tuple[_Due, str]] = []
    for each in due:
        count = counts.get(each.domain.id, 0)
        if count < each.config.min_new_signal:
            skipped.append((each, _too_little(champion_of.get(each.domain.id), count, each.config)))
            continue
        decision = _queue(session, each, count, defer)
        if isinstance(decision, str):
            skipped.append((each, decision))
        elif decision is not None:
            decided[each.domain.id] = decision
    for decision in _skip_all(session, skipped):
        decided[decision.domain_id] = decision
    return [decided[each.domain.id] for each in due if each.domain.id in decided]


def _due(session: Session, at: datetime) -> list[_Due]:
    """The domains (in creation order) with a valid schedule whose period containing `at`
    is undecided: two queries. A domain with a bad config is logged and left out."""
    periods: dict[str, datetime] = {}
    candidates = []
    for domain in session.scalars(select(Domain).order_by(Domain.created_at, Domain.id)):
        config = _schedulable(domain)
        if config is None or config.schedule is None:
            continue
        if config.schedule not in periods:
            periods[config.schedule] = period_start(config.schedule, at)
        candidates.append(_Due(domain, config, periods[config.schedule]))
    if not candidates:
        return []
    taken = {
        (domain_id, period)
        for domain_id, period in session.execute(
            select(ScheduledCycle.domain_id, ScheduledCycle.period_start).where(
                ScheduledCycle.period_start.in_(sorted(set(periods.values())))
            )
        )
    }
    return [each for each in candidates if (each.domain.id, each.period) not in taken]


def _schedulable(domain: Domain) -> CycleSettings | None:
    try:
        return cycle_settings(domain)
    except FlywheelError as error:
        log.warning("not scheduling %s: %s", domain.name, error.message)
        return None


class _Taken(Exception):
    """Another worker decided the period a moment ago (undoes this tick's run of it)."""


def _queue(session: Session, due: _Due, count: int, defer: Deferrer) -> Decision | str | None:
    """Queue a cycle, claim the period as queued with it and defer its job: the decision; the
    reason to skip instead when a cycle already waits; None when another worker claimed it."""
    domain, reason = due.domain, f"{count} new items"
    try:
        with session.begin_nested():  # a refused queueing or a lost claim undoes only this
            run = queue_domain_cycle(session, domain, trigger="schedule")
            if _claim(session, domain, due.period, "queued", reason, run.id) is None:
                raise _Taken
            run.job_id = defer(session, run)
    except _Taken:
        return None
    except Conflict as error:  # a cycle of the domain is already waiting
        return f"not queued: {error.message}"
    log.info("scheduled a cycle of %s", domain.name, extra={"run_id": str(run.id)})
    return Decision(domain.id, domain.name, due.period, "queued", reason, run.id)


def _too_little(champion: Champion | None, count: int, config: CycleSettings) -> str:
    if champion is None or not champion.has_champion:
        return f"{count} items and no champion yet, below {config.min_new_signal}"
    return f"{count} new items since the champion's dataset, below {config.min_new_signal}"


def _skip_all(session: Session, skipped: list[tuple[_Due, str]]) -> list[Decision]:
    """Claim the periods as skipped in one bulk insert (COPY on PostgreSQL) that leaves out
    the periods another worker holds; the decisions of those this tick won."""
    rows = [_period_row(due.domain, due.period, "skipped", reason) for due, reason in skipped]
    won = insert_ignoring_conflicts(session, cast(Table, ScheduledCycle.__table__), rows)
    decisions = [
        Decision(due.domain.id, due.domain.name, due.period, "skipped", reason)
        for (due, reason), row in zip(skipped, rows, strict=True)
        if row["id"] in won
    ]
    if decisions:
        log.info("skipped the scheduled cycles of %d domains", len(decisions))
    for decision in decisions:
        log.debug("skipped the scheduled cycle of %s: %s", decision.domain, decision.reason)
    return decisions


def _period_row(
    domain: Domain,
    period: datetime,
    decision: str,
    reason: str,
    run_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "created_at": utcnow(),
        "tenant_id": domain.tenant_id,
        "domain_id": domain.id,
        "period_start": period,
        "decision": decision,
        "reason": reason,
        "training_run_id": run_id,
    }


def _claim(
    session: Session,
    domain: Domain,
    period: datetime,
    decision: str,
    reason: str,
    run_id: uuid.UUID | None,
) -> uuid.UUID | None:
    """Insert the period's row unless one exists (ON CONFLICT DO NOTHING): its domain's id,
    or None when another transaction holds it. A concurrent inserter waits for the winner's
    commit."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert(ScheduledCycle)
        .values(_period_row(domain, period, decision, reason, run_id))
        .on_conflict_do_nothing(index_elements=["domain_id", "period_start"])
        .returning(ScheduledCycle.domain_id)
    )
    claimed: uuid.UUID | None = session.scalar(statement)
    return claimed
