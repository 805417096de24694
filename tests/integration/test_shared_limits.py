"""Limits shared across workers and hosts (issue 17, part 6): two real `flywheel serve`
workers on one real Redis keep one rate limit per key, and a revoked key is refused by both
at once, well within the auth cache TTL.

Redis must be reachable (FLYWHEEL_TEST_REDIS_URL, default redis://127.0.0.1:6379/0): the tests
error, never skip, without it. Each test writes under a key prefix of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import redis
import redis.asyncio as aioredis
from sqlalchemy.orm import Session, sessionmaker

from api.auth_stores import KnownKey, RedisKeyCache
from flywheel.errors import InvalidState
from flywheel.tenancy.revocation import RedisRevocations
from flywheel.tenancy.service import LiveKey, Principal
from tests.integration.test_server import clean_env, cli, free_port, server

REDIS_URL = os.environ.get("FLYWHEEL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.commits("flywheel CLI and uvicorn subprocesses write and read the rows"),
]


@pytest.fixture(autouse=True)
def emptied_tables(sessions: sessionmaker[Session]) -> None:
    """The `commits` marker empties the tables after a test that asks for `sessions`."""


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix of this test's own, its keys deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as error:
        raise RuntimeError(
            f"these tests need Redis at {REDIS_URL} (set FLYWHEEL_TEST_REDIS_URL): {error}"
        ) from error
    prefix = f"flywheel-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    names = list(client.scan_iter(match=f"{prefix}:*"))
    if names:
        client.delete(*names)
    client.close()


def shared_env(database_url: str, home: Path, redis_prefix: str, **extra: str) -> dict[str, str]:
    return clean_env(
        FLYWHEEL_DATABASE_URL=database_url,
        FLYWHEEL_HOME=str(home),
        FLYWHEEL_REDIS_URL=REDIS_URL,
        FLYWHEEL_REDIS_KEY_PREFIX=redis_prefix,
        **extra,
    )


def reader_key(env: dict[str, str], cwd: Path) -> dict[str, str]:
    cli(env, cwd, "tenants", "create", "acme")
    cli(env, cwd, "domains", "create", "billing", "--tenant", "acme")
    issued: dict[str, str] = json.loads(
        cli(env, cwd, "keys", "create", "-t", "acme", "-s", "data:read", "--json")
    )
    return issued


def worker_pids(port: int) -> set[int]:
    """The server processes holding established connections on `port`."""
    return {
        connection.pid
        for connection in psutil.net_connections("tcp")
        if connection.laddr
        and connection.laddr.port == port
        and connection.status == psutil.CONN_ESTABLISHED
        and connection.pid not in (None, os.getpid())
    }


@contextmanager
def clients_on_both_workers(base: str) -> Iterator[list[httpx.Client]]:
    """Keep-alive clients, connected until both workers hold some of their connections."""
    clients: list[httpx.Client] = []
    try:
        while len(clients) < 8 or len(worker_pids(httpx.URL(base).port or 80)) < 2:
            if len(clients) >= 64:
                raise AssertionError("64 connections, all taken by one worker")
            client = httpx.Client(base_url=base, timeout=30)
            clients.append(client)
            client.get("/healthz").raise_for_status()
        yield clients
    finally:
        for client in clients:
            client.close()


def statuses(clients: list[httpx.Client], key: str, count: int) -> list[int]:
    """`count` requests in turn over `clients` (so both workers serve them)."""
    headers = {"Authorization": f"Bearer {key}"}
    return [
        clients[index % len(clients)]
        .get("/v1/datasets", params={"domain": "billing"}, headers=headers)
        .status_code
        for index in range(count)
    ]


def test_the_rate_limit_is_exact_across_two_workers(
    database_url: str, tmp_path: Path, redis_prefix: str
) -> None:
    env = shared_env(
        database_url,
        tmp_path,
        redis_prefix,
        FLYWHEEL_RATE_LIMIT_BURST="10",
        FLYWHEEL_RATE_LIMIT_PER_S="0.01",
    )
    key = reader_key(env, tmp_path)["key"]

    with server(env, tmp_path, workers=2) as base, clients_on_both_workers(base) as clients:
        seen = statuses(clients, key, 40)

    assert Counter(seen) == {200: 10, 429: 30}  # not 10 per worker


def test_the_address_failure_budget_is_exact_across_two_workers(
    database_url: str, tmp_path: Path, redis_prefix: str
) -> None:
    env = shared_env(
        database_url,
        tmp_path,
        redis_prefix,
        FLYWHEEL_ADDRESS_FAILURE_LIMIT="5",
        FLYWHEEL_ADDRESS_REFUSAL_DELAY_S="0",
    )
    reader_key(env, tmp_path)

    with server(env, tmp_path, workers=2) as base, clients_on_both_workers(base) as clients:
        seen = [
            statuses([clients[index % len(clients)]], f"fwk_{uuid.uuid4().hex[:16]}_{'A' * 43}", 1)[
                0
            ]
            for index in range(12)
        ]

    assert seen == [401] * 5 + [429] * 7


def test_a_revoked_key_is_refused_by_both_workers_at_once(
    database_url: str, tmp_path: Path, redis_prefix: str
) -> None:
    """...and, found revoked, its prefix is remembered as unknown in Redis for them all."""
    # A long auth cache TTL: without the shared cache, each worker would trust it 60 s more.
    env = shared_env(database_url, tmp_path, redis_prefix, FLYWHEEL_AUTH_CACHE_TTL_S="60")
    issued = reader_key(env, tmp_path)

    with server(env, tmp_path, workers=2) as base, clients_on_both_workers(base) as clients:
        before = statuses(clients, issued["key"], 3 * len(clients))
        cli(env, tmp_path, "keys", "revoke", issued["id"])
        after = statuses(clients, issued["key"], 3 * len(clients))

    assert set(before) == {200}
    assert set(after) == {401}
    prefix = issued["key"].split("_")[1]
    with redis.Redis.from_url(REDIS_URL) as client:
        assert client.exists(f"{redis_prefix}:auth:unknown:{prefix}") == 1


def test_the_shared_cache_forgets_a_revoked_key_and_remembers_unknown_prefixes(
    redis_prefix: str,
) -> None:
    prefix = "0123456789abcdef"
    principal = Principal(key_id=uuid.uuid4(), tenant_id=uuid.uuid4(), scopes=frozenset({"admin"}))
    known = KnownKey(LiveKey(principal=principal, secret_sha256="ab" * 32), verified_at=time.time())

    async def scenario() -> list[tuple[KnownKey | None, bool]]:
        client = aioredis.Redis.from_url(REDIS_URL)
        cache = RedisKeyCache(client, namespace=redis_prefix, keep_s=60, unknown_ttl_s=30)
        try:
            await cache.remember(prefix, known)
            remembered = await cache.recall(prefix)
            RedisRevocations(REDIS_URL, redis_prefix).revoked(prefix)
            revoked = await cache.recall(prefix)
            await cache.remember(prefix, known)
            await cache.mark_unknown(prefix)
            return [remembered, revoked, await cache.recall(prefix)]
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [(known, False), (None, False), (None, True)]


def test_revoking_without_the_configured_redis_fails_rather_than_half_revokes() -> None:
    unreachable = RedisRevocations(f"redis://127.0.0.1:{free_port()}/0", "flywheel-test")

    with pytest.raises(InvalidState, match="could not reach Redis"):
        unreachable.revoked("0123456789abcdef")
