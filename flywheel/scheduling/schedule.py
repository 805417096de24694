"""The scheduler's tick: each domain's current schedule period is decided once, and only once.

A domain's `cycle.schedule` is a cron expression in UTC (default `0 2 * * 1`, Mondays 02:00).
At each tick, for every domain of every tenant, the period is the latest fire time of that
cron at or before the tick. If nobody has decided that period yet, the tick decides it:

- enough new training signal since the champion's dataset (`cycle.min_new_signal`):
  a `ScheduledCycle(decision='queued')`, a queued cycle run, and its job deferred, all in
  the tick's transaction;
- otherwise a `ScheduledCycle(decision='skipped')` whose reason says how much there was.

The period row is inserted first, with ON CONFLICT DO NOTHING on (domain, period): however
many workers tick at once, exactly one of them wins a period, and the others do nothing.
A period that passed while no worker ran is not caught up: only the latest one is decided.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from croniter import croniter
from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flywheel.db import utcnow
from flywheel.errors import Conflict, FlywheelError
from flywheel.registry.models import Run
from flywheel.registry.service import current_champion
from flywheel.scheduling.config import cycle_settings
from flywheel.scheduling.models import ScheduledCycle
from flywheel.scheduling.runs import new_signal_count, queue_cycle
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


def tick(session: Session, *, at: datetime, defer: Deferrer) -> list[Decision]:
    """Decide the current period of every domain that has not been decided yet."""
    decisions = []
    for domain in session.scalars(select(Domain).order_by(Domain.created_at, Domain.id)):
        decision = decide_domain(session, domain, at=at, defer=defer)
        if decision is not None:
            decisions.append(decision)
    return decisions


def decide_domain(
    session: Session, domain: Domain, *, at: datetime, defer: Deferrer
) -> Decision | None:
    """Decide `domain`'s period containing `at`; None when it was already decided (or the
    domain has no valid schedule: logged, the other domains still tick)."""
    try:
        config = cycle_settings(domain)
    except FlywheelError as error:
        log.warning("not scheduling %s: %s", domain.name, error.message)
        return None
    if not config.schedule:
        return None
    if not croniter.is_valid(config.schedule):
        log.warning("not scheduling %s: bad cycle.schedule %r", domain.name, config.schedule)
        return None
    period = period_start(config.schedule, at)
    if _is_decided(session, domain.id, period):
        return None
    count = new_signal_count(session, domain)
    if count < config.min_new_signal:
        return _skip(session, domain, period, _too_little(session, domain, count, config))
    try:
        with session.begin_nested():  # a refused queueing undoes the claim, and only it
            claimed = _claim(session, domain, period, "queued", "")
            if claimed is None:
                return None  # another worker decided this period a moment ago
            run = queue_cycle(
                session, tenant_id=domain.tenant_id, domain=domain.name, trigger="schedule"
            )
            run.job_id = defer(session, run)
            session.execute(
                update(ScheduledCycle)
                .where(ScheduledCycle.id == claimed)
                .values(training_run_id=run.id, reason=f"{count} new items")
            )
    except Conflict as error:  # a cycle of the domain is already waiting
        return _skip(session, domain, period, f"not queued: {error.message}")
    log.info("scheduled a cycle of %s", domain.name, extra={"run_id": str(run.id)})
    return Decision(domain.id, domain.name, period, "queued", f"{count} new items", run.id)


def _too_little(session: Session, domain: Domain, count: int, config: Any) -> str:
    if current_champion(session, domain.id) is None:
        return f"{count} items and no champion yet, below {config.min_new_signal}"
    return f"{count} new items since the champion's dataset, below {config.min_new_signal}"


def _skip(session: Session, domain: Domain, period: datetime, reason: str) -> Decision | None:
    if _claim(session, domain, period, "skipped", reason) is None:
        return None
    log.info("skipped the scheduled cycle of %s: %s", domain.name, reason)
    return Decision(domain.id, domain.name, period, "skipped", reason)


def _is_decided(session: Session, domain_id: uuid.UUID, period: datetime) -> bool:
    found = session.scalar(
        select(ScheduledCycle.id).where(
            ScheduledCycle.domain_id == domain_id, ScheduledCycle.period_start == period
        )
    )
    return found is not None


def _claim(
    session: Session, domain: Domain, period: datetime, decision: str, reason: str
) -> uuid.UUID | None:
    """Insert the period's row unless one exists (ON CONFLICT DO NOTHING): its id, or None
    when another transaction holds it. A concurrent inserter waits for the winner's commit."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert(ScheduledCycle)
        .values(
            id=uuid.uuid4(),
            created_at=utcnow(),
            tenant_id=domain.tenant_id,
            domain_id=domain.id,
            period_start=period,
            decision=decision,
            reason=reason,
        )
        .on_conflict_do_nothing(index_elements=["domain_id", "period_start"])
        .returning(ScheduledCycle.id)
    )
    claimed: uuid.UUID | None = session.scalar(statement)
    return claimed
