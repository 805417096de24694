"""Benchmark: the database's size per domain per week, table by table.

In a scratch PostgreSQL database (created and dropped here) it writes one realistic week of
one domain through the product's own paths where it matters:

- `--interactions` model calls (default 10,000: ~1,400 a day), each a 3-turn conversation
  (system, user, assistant context) and a response of a few hundred characters, with app
  metadata, as the gateway records them;
- feedback on them as apps send it: ratings on 20% (thumbs or stars, one or two raters),
  corrections on 3%, outcomes on 5%, and comparisons (2% of calls, two responses each);
- the compiled signal (`compile_feedback`, the real compiler, with redaction), the
  near-duplicate pass, and one dataset version's membership (`build_dataset_version`).

Then `VACUUM FULL` and `pg_total_relation_size` (heap, indexes, TOAST) per table, printed as
bytes per domain per week, with the raw share (interactions + events: what
`retention_raw_event_weeks` deletes after N weeks) beside the derived one (kept), and the
steady-state size of a domain kept for a year with and without a retention of N weeks.

    python -m bench.db_size                        # 10,000 interactions
    python -m bench.db_size --interactions 2000 --retention-weeks 8

Needs PostgreSQL (FLYWHEEL_TEST_POSTGRES_URL, as the tests). Asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text

from flywheel import migrate
from flywheel.datasets.service import DatasetRecipe, build_dataset_version
from flywheel.db import make_engine, make_session_factory, unit_of_work, utcnow
from flywheel.models import Base, FeedbackEvent, Interaction
from flywheel.settings import Settings
from flywheel.signals.compile import compile_feedback
from flywheel.tenancy import service as tenancy

RAW = ("interactions", "feedback_events")
WORDS = [
    "invoice",
    "refund",
    "password",
    "account",
    "billing",
    "address",
    "charge",
    "plan",
    "upgrade",
    "cancel",
    "renewal",
    "discount",
    "receipt",
    "payment",
    "card",
    "bank",
    "transfer",
    "tax",
    "export",
    "login",
    "email",
    "team",
    "seat",
    "license",
    "trial",
    "quota",
    "limit",
    "report",
    "dashboard",
    "api",
    "token",
    "order",
    "shipping",
    "delivery",
    "warranty",
    "return",
]
SYSTEM = "You are the billing assistant of Acme. Answer briefly and cite the help centre."


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def write_week(sessions: Any, tenant_id: uuid.UUID, domain_id: uuid.UUID, calls: int) -> int:
    """`calls` interactions over the last 7 days and the feedback on them; events written."""
    rng = random.Random(7)
    start = utcnow() - timedelta(days=7)
    interactions, events = [], []
    for i in range(calls):
        at = start + timedelta(seconds=i * 7 * 86400 / calls)
        question = f"Ticket {i}: {sentence(rng, rng.randint(8, 30))}"
        interaction_id = uuid.uuid4()
        interactions.append(
            {
                "id": interaction_id,
                "created_at": at,
                "tenant_id": tenant_id,
                "domain_id": domain_id,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                "response": " ".join(sentence(rng, 12) for _ in range(rng.randint(2, 6))),
                "model_name": "acme.billing",
                "model_version": "3",
                "metadata": {"app": "helpdesk", "locale": "en", "session": f"s{i // 4}"},
                "request_sha256": f"{i:064d}",
                "release_role": "champion",
                "end_user": f"user-{rng.randint(1, 2000)}",
                "status": "ok",
                "prompt_tokens": rng.randint(60, 300),
                "completion_tokens": rng.randint(40, 250),
                "latency_ms": rng.uniform(200, 2000),
            }
        )
        events += _feedback(rng, i, interaction_id, tenant_id, domain_id, at, question)
    with unit_of_work(sessions) as session:
        session.execute(insert(Interaction), interactions)
        session.execute(insert(FeedbackEvent), events)
    return len(events)


def _feedback(
    rng: random.Random,
    i: int,
    interaction_id: uuid.UUID,
    tenant_id: uuid.UUID,
    domain_id: uuid.UUID,
    at: Any,
    question: str,
) -> list[dict[str, Any]]:
    common = {"tenant_id": tenant_id, "domain_id": domain_id, "request_sha256": "0" * 64}
    later = at + timedelta(minutes=5)
    found: list[dict[str, Any]] = []

    def event(kind: str, value: dict[str, Any], **extra: Any) -> None:
        found.append(
            {"id": uuid.uuid4(), "created_at": later, "kind": kind, "value": value}
            | {"rater": f"u-{rng.randint(1, 300)}", "event_id": f"e-{i}-{len(found)}"}
            | common
            | extra
        )

    draw = rng.random()
    if draw < 0.20:
        for _ in range(rng.choice((1, 1, 2))):
            if rng.random() < 0.5:
                event(
                    "rating", {"thumbs": rng.choice(("up", "down"))}, interaction_id=interaction_id
                )
            else:
                event("rating", {"stars": rng.randint(1, 5)}, interaction_id=interaction_id)
    elif draw < 0.23:
        fixed = sentence(rng, 25)
        event("correction", {"text": fixed}, interaction_id=interaction_id)
    elif draw < 0.28:
        event("outcome", {"success": rng.random() < 0.7}, interaction_id=interaction_id)
    elif draw < 0.30:
        messages = [{"role": "user", "content": question}]
        responses = [sentence(rng, 20), sentence(rng, 20)]
        value = {"messages": messages, "responses": responses, "preferred": rng.randint(0, 1)}
        event("comparison", value)
    return found


def table_sizes(engine: Any) -> dict[str, int]:
    names = [table.name for table in Base.metadata.sorted_tables]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for name in names:
            connection.execute(text(f"VACUUM FULL {name}"))
        return {
            name: int(
                connection.execute(text(f"SELECT pg_total_relation_size('{name}')")).scalar_one()
            )
            for name in names
        }


def empty_sizes(url: str) -> dict[str, int]:
    engine = make_engine(Settings(database_url=url, home=Path(tempfile.mkdtemp())))
    try:
        return table_sizes(engine)
    finally:
        engine.dispose()


def measure(url: str, calls: int) -> tuple[dict[str, int], dict[str, float]]:
    baseline = empty_sizes(url)
    engine = make_engine(Settings(database_url=url, home=Path(tempfile.mkdtemp())))
    sessions = make_session_factory(engine)
    timings: dict[str, float] = {}
    try:
        with unit_of_work(sessions) as session:
            tenant = tenancy.create_tenant(session=session, name="acme")
            domain = tenancy.create_domain(session=session, tenant=tenant, name="billing")
            tenant_id, domain_id = tenant.id, domain.id
        start = time.perf_counter()
        timings["events"] = write_week(sessions, tenant_id, domain_id, calls)
        timings["write_s"] = time.perf_counter() - start
        start = time.perf_counter()
        compile_feedback(sessions, tenant_id=tenant_id, domain_id=domain_id, link=True)
        timings["compile_s"] = time.perf_counter() - start
        with unit_of_work(sessions) as session:
            build_dataset_version(
                session=session, tenant_id=tenant_id, domain_id=domain_id, recipe=DatasetRecipe()
            )
        sizes = table_sizes(engine)
    finally:
        engine.dispose()
    return {name: size - baseline.get(name, 0) for name, size in sizes.items()}, timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interactions", type=int, default=10_000)
    parser.add_argument("--retention-weeks", type=int, default=8)
    args = parser.parse_args()
    from tests.conftest import create_postgres_database, drop_postgres_database

    url = create_postgres_database()
    try:
        migrate.upgrade(url)
        grown, timings = measure(url, args.interactions)
    finally:
        drop_postgres_database(url)
    print(
        f"one domain, one week: {args.interactions} interactions, {timings['events']:.0f} "
        f"events (written in {timings['write_s']:.1f} s, compiled in {timings['compile_s']:.1f} s)"
    )
    print(f"{'table':28s} {'bytes/domain/week':>18s}")
    for name, size in sorted(grown.items(), key=lambda item: -item[1]):
        if size > 0:
            print(f"{name:28s} {size:18,d}")
    raw = sum(grown.get(name, 0) for name in RAW)
    total = sum(grown.values())
    print(f"{'total':28s} {total:18,d}")
    print(f"raw (interactions + events): {raw:,d} ({raw / total:.0%}); derived: {total - raw:,d}")
    print(f"bytes per interaction (all tables): {total / args.interactions:,.0f}")
    weeks = args.retention_weeks
    kept_year = 52 * total
    with_retention = 52 * (total - raw) + weeks * raw
    print(
        f"one domain after a year: {kept_year / 2**20:,.1f} MiB keeping everything; "
        f"{with_retention / 2**20:,.1f} MiB with retention of {weeks} weeks "
        f"({with_retention / kept_year:.0%}); x1,000 domains: "
        f"{kept_year * 1000 / 2**30:,.1f} GiB vs {with_retention * 1000 / 2**30:,.1f} GiB"
    )


if __name__ == "__main__":
    main()
