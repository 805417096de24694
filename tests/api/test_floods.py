"""Floods cost the client address, not the database (issue 17, part 4).

Unknown key prefixes are refused from a short cache; failed requests (401, 403, 429) spend the
client address's budget, past which its lookups are refused with 429 before any database
work; a key already verified keeps working from a flooded address.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from flywheel.settings import Settings
from tests.conftest import RATING, Caller, count_rows, make_caller


class KeyLookups:
    """Counts the statements that read the api_keys table."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "FROM api_keys" in statement:
            self.count += 1


@pytest.fixture
def lookups(engine: Engine) -> Iterator[KeyLookups]:
    counter = KeyLookups()
    event.listen(engine, "before_cursor_execute", counter)
    yield counter
    event.remove(engine, "before_cursor_execute", counter)


def guarded_client(
    settings: Settings, sessions: sessionmaker[Session], **overrides: Any
) -> TestClient:
    limits = {"address_failure_limit": 5, "address_refusal_delay_s": 0, **overrides}
    return TestClient(create_app(settings.model_copy(update=limits), sessions=sessions))


def unknown_key() -> str:
    return f"fwk_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_an_unknown_key_prefix_is_looked_up_once(
    settings: Settings, sessions: sessionmaker[Session], lookups: KeyLookups
) -> None:
    key = unknown_key()
    with guarded_client(settings, sessions, address_failure_limit=100) as client:
        started = lookups.count  # the live keys read at start
        statuses = [
            client.post("/v1/feedback", json=RATING, headers=bearer(key)).status_code
            for _ in range(5)
        ]

    assert statuses == [401] * 5
    assert lookups.count == started + 1


def test_failed_requests_spend_the_address_budget_then_429_before_any_lookup(
    settings: Settings, sessions: sessionmaker[Session], lookups: KeyLookups
) -> None:
    with guarded_client(settings, sessions) as client:
        started = lookups.count  # the live keys read at start
        responses = [
            client.post("/v1/feedback", json=RATING, headers=bearer(unknown_key()))
            for _ in range(8)
        ]
        no_header = client.post("/v1/feedback", json=RATING)

    assert [response.status_code for response in responses] == [401] * 5 + [429] * 3
    refused = responses[-1]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 61
    assert lookups.count == started + 5
    assert no_header.status_code == 429
    assert count_rows(sessions, "feedback_events") == 0


def test_403s_spend_the_address_budget(settings: Settings, sessions: sessionmaker[Session]) -> None:
    reader = make_caller(sessions, scopes=("data:read",))
    with guarded_client(settings, sessions, address_failure_limit=3) as client:
        statuses = [
            client.post("/v1/feedback", json=RATING, headers=reader.headers).status_code
            for _ in range(5)
        ]

    assert statuses == [403, 403, 403, 429, 429]


def test_429s_of_a_key_spend_its_address_budget(
    settings: Settings, sessions: sessionmaker[Session], acme: Caller
) -> None:
    with guarded_client(
        settings, sessions, address_failure_limit=2, rate_limit_per_s=0.01, rate_limit_burst=1
    ) as client:
        statuses = [
            client.post("/v1/feedback", json=RATING, headers=acme.headers).status_code
            for _ in range(4)
        ]
        other_failure = client.post("/v1/feedback", json=RATING, headers=bearer(unknown_key()))

    assert statuses == [201, 429, 429, 429]
    assert other_failure.status_code == 429  # the address's budget is spent, no lookup


def test_a_known_key_keeps_working_from_a_flooded_address(
    settings: Settings, sessions: sessionmaker[Session], acme: Caller, lookups: KeyLookups
) -> None:
    # auth_cache_ttl_s=0: the known key is looked up again on every request.
    with guarded_client(settings, sessions, auth_cache_ttl_s=0) as client:
        assert client.post("/v1/feedback", json=RATING, headers=acme.headers).status_code == 201
        flood = [
            client.post("/v1/feedback", json=RATING, headers=bearer(unknown_key())).status_code
            for _ in range(20)
        ]
        before = lookups.count
        legitimate = client.post("/v1/feedback", json=RATING, headers=acme.headers)
        forged = client.post("/v1/feedback", json=RATING, headers=bearer(acme.key[:-4] + "AAAA"))

    assert flood == [401] * 5 + [429] * 15
    assert legitimate.status_code == 201
    assert lookups.count == before + 1
    assert forged.status_code == 429  # right prefix, wrong secret: not the known key
    assert count_rows(sessions, "feedback_events") == 2


def test_a_key_this_process_has_not_verified_yet_works_from_a_flooded_address(
    settings: Settings, sessions: sessionmaker[Session], acme: Caller, lookups: KeyLookups
) -> None:
    """Each worker starts knowing the live keys: with two workers, a legitimate client's
    connection to the worker that had not seen its key was refused 429 for a whole flood
    (bench.feedback_api, loopback, 64 connections of unknown keys)."""
    with guarded_client(settings, sessions, auth_cache_ttl_s=60) as client:
        flood = [
            client.post("/v1/feedback", json=RATING, headers=bearer(unknown_key())).status_code
            for _ in range(8)
        ]
        before = lookups.count
        legitimate = client.post("/v1/feedback", json=RATING, headers=acme.headers)

    assert flood == [401] * 5 + [429] * 3
    assert legitimate.status_code == 201, legitimate.text
    assert lookups.count == before  # known from the start: no lookup


def test_a_key_created_after_the_start_is_looked_up_on_first_use(
    settings: Settings, sessions: sessionmaker[Session], lookups: KeyLookups
) -> None:
    with guarded_client(settings, sessions) as client:
        later = make_caller(sessions, scopes=("feedback:write",))
        before = lookups.count
        response = client.post("/v1/feedback", json=RATING, headers=later.headers)

    assert response.status_code == 201, response.text
    assert lookups.count == before + 1


def test_a_wrong_secret_does_not_lock_out_the_key(
    settings: Settings, sessions: sessionmaker[Session], acme: Caller
) -> None:
    forged = bearer(acme.key[:-4] + ("AAAA" if not acme.key.endswith("AAAA") else "BBBB"))
    with guarded_client(settings, sessions) as client:
        refused = [
            client.post("/v1/feedback", json=RATING, headers=forged).status_code for _ in range(2)
        ]
        accepted = client.post("/v1/feedback", json=RATING, headers=acme.headers)

    assert refused == [401, 401]
    assert accepted.status_code == 201


def test_a_refused_address_waits_for_its_429(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    with guarded_client(
        settings, sessions, address_failure_limit=1, address_refusal_delay_s=0.3
    ) as client:
        first = client.post("/v1/feedback", json=RATING, headers=bearer(unknown_key()))
        started = time.monotonic()
        second = client.post("/v1/feedback", json=RATING, headers=bearer(unknown_key()))
        waited_s = time.monotonic() - started

    assert (first.status_code, second.status_code) == (401, 429)
    assert waited_s >= 0.15  # at least half the delay (it is jittered)


def test_an_unreachable_shared_store_is_a_503_not_a_500(
    settings: Settings, sessions: sessionmaker[Session], acme: Caller
) -> None:
    """FLYWHEEL_REDIS_URL set but nothing listening there: the API says it is unavailable."""
    closed = settings.model_copy(update={"redis_url": SecretStr("redis://127.0.0.1:1/0")})
    with TestClient(create_app(closed, sessions=sessions), raise_server_exceptions=False) as client:
        response = client.post("/v1/feedback", json=RATING, headers=acme.headers)

    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "shared_store_unavailable"
