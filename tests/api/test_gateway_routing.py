"""The gateway's routing cache on the real database: a release is read once per TTL, never on
the hot path within it, and a promotion shows once the TTL has passed; model addressing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.errors import NotFound
from flywheel.inference.routing import Router, parse_model
from flywheel.models import Domain, ModelVersion, PromotionEvent
from tests.conftest import Caller


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def count_queries(sessions: sessionmaker[Session]) -> list[str]:
    """Every SELECT the sessions' connection runs from now on."""
    seen: list[str] = []
    bind: Any = sessions.kw["bind"]

    @event.listens_for(bind, "before_cursor_execute")
    def record(*args: Any) -> None:
        if args[2].lstrip().upper().startswith("SELECT"):
            seen.append(args[2])

    return seen


def add_version(sessions: sessionmaker[Session], caller: Caller, version: str) -> ModelVersion:
    with unit_of_work(sessions) as session:
        domain = session.query(Domain).filter_by(tenant_id=caller.tenant_id).one()
        row = ModelVersion(
            tenant_id=caller.tenant_id,
            domain_id=domain.id,
            registered_model="acme.billing",
            version=version,
            adapter_uri=f"runs:/r{version}/adapter",
            base_model="/models/tiny",
            gate_result={"is_promoted": True},
        )
        session.add(row)
        session.flush()
        return row


def make_champion(sessions: sessionmaker[Session], caller: Caller, row: ModelVersion) -> None:
    with unit_of_work(sessions) as session:
        session.add(
            PromotionEvent(
                tenant_id=caller.tenant_id,
                domain_id=row.domain_id,
                alias="champion",
                action="promote",
                to_model_version_id=row.id,
                actor="test",
            )
        )


def test_parse_model() -> None:
    assert parse_model("billing") == ("billing", None, None)
    assert parse_model("billing@challenger") == ("billing", "challenger", None)
    assert parse_model("billing:3") == ("billing", None, "3")


def test_a_release_is_read_once_per_ttl_and_a_promotion_shows_after_it(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    clock = Clock()
    router = Router(sessions, ttl_s=2.0, clock=clock)
    first = add_version(sessions, acme, "1")

    async def served() -> tuple[str | None, str]:
        route = await router.route(acme.tenant_id, "billing", "u-1")
        return (route.version.version if route.version else None), route.role

    assert asyncio.run(served()) == (None, "base")
    make_champion(sessions, acme, first)
    queries = count_queries(sessions)
    clock.now += 1.9
    assert asyncio.run(served()) == (None, "base")  # within the TTL: the cached release
    assert queries == []
    clock.now += 0.2
    assert asyncio.run(served()) == ("1", "champion")
    assert queries  # read again once


def test_unknown_domains_are_remembered_too(sessions: sessionmaker[Session], acme: Caller) -> None:
    router = Router(sessions, ttl_s=60, clock=Clock())
    queries = count_queries(sessions)
    for _ in range(3):
        with pytest.raises(NotFound):
            asyncio.run(router.route(acme.tenant_id, "nothing", "u"))
    assert len(queries) == 1
    with pytest.raises(NotFound):
        asyncio.run(router.route(uuid.uuid4(), "billing", "u"))  # another tenant: not acme's


def test_concurrent_requests_share_one_read(sessions: sessionmaker[Session], acme: Caller) -> None:
    queries = count_queries(sessions)
    asyncio.run(Router(sessions, ttl_s=60).route(acme.tenant_id, "billing", "u"))
    one_read = len(queries)
    queries.clear()
    router = Router(sessions, ttl_s=60, clock=Clock())

    async def many() -> set[str]:
        routes = await asyncio.gather(
            *(router.route(acme.tenant_id, "billing", f"u{i}") for i in range(20))
        )
        return {route.role for route in routes}

    assert asyncio.run(many()) == {"base"}
    assert len(queries) == one_read
