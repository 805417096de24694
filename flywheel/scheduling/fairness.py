"""GPU jobs shared fairly between tenants: round-robin by procrastinate's own job priority.

procrastinate's workers take the waiting job with the highest `priority`, then the oldest
(`ORDER BY priority DESC, id ASC`, skipping a job whose `lock` another job holds). Left at the
default priority, a tenant that queues 500 domains' cycles first makes a tenant with 5 wait
behind all 500. `share_gpu` re-ranks the waiting cycle jobs instead: a tenant's n-th waiting
job (oldest first) gets priority -(n + the tenant's cycles running now), so each worker takes
the next job of the tenant with the fewest running and queued ahead of it, ties going to the
oldest job: a tenant's second job waits for every other tenant's first.

It runs in the deferring transaction after cycles are queued (the tick defers them all, then
re-ranks once; a single trigger re-ranks after its one job). Starting a job needs no
re-ranking: its tenant has one more running and each of its waiting jobs one fewer ahead, so
their priorities stand. A finished job's tenant keeps the ranks it had while it ran until the
next re-ranking, so it does not win the next GPU back by having the oldest jobs: the tenants
keep taking turns in the order the ranks set. One UPDATE, touching only the jobs whose rank
moved; an advisory lock makes concurrent re-rankings take turns (no deadlock between them).
The tenant comes from the job's run (`args.run_id`), so the job's arguments stay what they
were.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

FAIRNESS_LOCK = 0x66616972  # pg_advisory_xact_lock key: one re-ranking at a time

RANK_SQL = text(
    """
    WITH cycles AS (
      SELECT jobs.id, jobs.status, jobs.priority, runs.tenant_id
        FROM procrastinate_jobs AS jobs
        JOIN runs ON runs.id = CAST(jobs.args ->> 'run_id' AS uuid)
       WHERE jobs.queue_name = :queue AND jobs.task_name = :task
         AND jobs.status IN ('todo', 'doing')
    ),
    running AS (
      SELECT tenant_id, count(*) AS n FROM cycles WHERE status = 'doing' GROUP BY tenant_id
    ),
    ranked AS (
      SELECT cycles.id,
             1 - COALESCE(running.n, 0)
               - row_number() OVER (PARTITION BY cycles.tenant_id ORDER BY cycles.id)
               AS priority
        FROM cycles LEFT JOIN running ON running.tenant_id = cycles.tenant_id
       WHERE cycles.status = 'todo'
    )
    UPDATE procrastinate_jobs AS jobs SET priority = ranked.priority
      FROM ranked
     WHERE jobs.id = ranked.id AND jobs.priority <> ranked.priority
    """
)


def share_gpu(session: Session, *, queue: str, task: str) -> int:
    """Re-rank the waiting `task` jobs of `queue` round-robin by tenant, in the session's
    transaction (PostgreSQL); how many jobs moved."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": FAIRNESS_LOCK})
    moved = session.execute(RANK_SQL, {"queue": queue, "task": task})
    return int(moved.rowcount)  # type: ignore[attr-defined]  # an UPDATE's CursorResult
