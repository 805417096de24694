"""Bearer API keys: authenticate, check the scope, apply the per-key rate limit."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from flywheel.errors import Forbidden, RateLimited, Unauthenticated
from flywheel.tenancy.service import Principal, Scope, load_principal, split_key

MAX_CACHED_KEYS = 10_000


class KeyAuthenticator:
    """Looks keys up in the database, trusting a hit for `ttl_s` seconds in this process."""

    def __init__(self, sessions: sessionmaker[Session], ttl_s: float) -> None:
        self._sessions = sessions
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[Principal, float]] = {}

    def cached(self, raw_key: str) -> Principal | None:
        hit = self._cache.get(raw_key)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return None

    def lookup(self, raw_key: str) -> Principal:
        parts = split_key(raw_key)
        if parts is None:
            raise Unauthenticated("malformed API key")
        with self._sessions() as session:
            principal = load_principal(session=session, prefix=parts[0], secret=parts[1])
        if principal is None:
            raise Unauthenticated("unknown or revoked API key")
        if self._ttl_s > 0:
            if len(self._cache) >= MAX_CACHED_KEYS:
                self._cache.clear()
            self._cache[raw_key] = (principal, time.monotonic() + self._ttl_s)
        return principal


class RateLimiter:
    """A token bucket per API key, in this process: `rate_per_s` sustained, `burst` at once."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._buckets: dict[uuid.UUID, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: uuid.UUID) -> None:
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key_id, (self._burst, now))
            tokens = min(self._burst, tokens + (now - last) * self._rate_per_s)
            if tokens < 1.0:
                self._buckets[key_id] = (tokens, now)
                retry_after_s = (1.0 - tokens) / self._rate_per_s
                raise RateLimited(
                    "rate limit exceeded for this API key", retry_after_s=retry_after_s
                )
            self._buckets[key_id] = (tokens - 1.0, now)


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthenticated("missing Authorization: Bearer <API key> header")
    scheme, _, raw_key = header.partition(" ")
    if scheme.lower() != "bearer" or not raw_key.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <API key>'")
    return raw_key.strip()


def require(scope: Scope) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency: the caller's principal, if its key is valid, in scope and under its limit."""

    async def dependency(request: Request) -> Principal:
        raw_key = bearer_key(request)
        authenticator: KeyAuthenticator = request.app.state.authenticator
        principal = authenticator.cached(raw_key)
        if principal is None:
            principal = await run_in_threadpool(authenticator.lookup, raw_key)
        if not principal.has_scope(scope):
            raise Forbidden(f"this API key lacks the {scope.value!r} scope")
        request.app.state.rate_limiter.take(principal.key_id)
        return principal

    return dependency
