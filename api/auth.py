"""Bearer API keys: authenticate, check the scope, apply the per-key rate limit.

Floods cost the client address, not the database: every failed request (401, 403, 429) is
counted against the address it came from, and once an address has spent its budget, its
requests that would need a database lookup are refused with 429 (held back a moment) before
any database work. A prefix found to have no live key is refused from a short cache. A key
already verified is trusted for the auth cache TTL, then looked up again; its lookups skip
the address's budget, so a flood from the same address does not lock it out. Each process
starts knowing the keys that are live then (`warm`): with several workers, a key one worker
has verified is unknown to the others, and from a flooded address it could not be looked up.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from fastapi import Request
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.auth_stores import (
    MAX_KNOWN_KEYS,
    AddressRefused,
    AuthStores,
    KnownKey,
    MemoryKeyCache,
    make_auth_stores,
)
from flywheel.errors import Forbidden, RateLimited, Unauthenticated
from flywheel.settings import Settings
from flywheel.tenancy.service import (
    LiveKey,
    Principal,
    Scope,
    load_live_key,
    load_live_keys,
    split_key,
)

AuthFailure = (Unauthenticated, Forbidden, RateLimited)
logger = logging.getLogger(__name__)


class KeyAuthenticator:
    """Who is calling, from the caches when they know, else from the database."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        stores: AuthStores,
        *,
        ttl_s: float,
        refusal_delay_s: float = 0.0,
    ) -> None:
        self._sessions = sessions
        self._cache = stores.cache
        self.limits = stores.limits
        self._ttl_s = ttl_s
        self._refusal_delay_s = refusal_delay_s

    async def authorize(self, request: Request, scope: Scope) -> Principal:
        """The caller's principal, if its key is valid, in scope and under its limit; every
        failure counts against the client's address."""
        address = client_address(request)
        try:
            principal = await self.authenticate(bearer_key(request), address)
            if not principal.has_scope(scope):
                raise Forbidden(f"this API key lacks the {scope.value!r} scope")
            await self.limits.take_key(principal.key_id)
        except AddressRefused:
            await self._hold_back()
            raise
        except AuthFailure:
            if not await self.limits.charge_address(address):
                await self._hold_back()
                await self.limits.refuse_address(address)
            raise
        return principal

    async def _hold_back(self) -> None:
        """Delay a refusal: half to one and a half times the delay, so that a flood's
        connections, refused together, do not all come back in step."""
        await asyncio.sleep(self._refusal_delay_s * random.uniform(0.5, 1.5))

    async def authenticate(self, raw_key: str, address: str) -> Principal:
        parts = split_key(raw_key)
        if parts is None:
            raise Unauthenticated("malformed API key")
        prefix, secret = parts
        known, is_unknown = await self._cache.recall(prefix)
        if known is not None and known.live.matches(secret):
            if time.time() < known.verified_at + self._ttl_s:
                return known.live.principal
        else:
            await self.limits.check_address(address)
            if is_unknown:
                raise Unauthenticated("unknown or revoked API key")
        return await self._look_up(prefix, secret)

    async def _look_up(self, prefix: str, secret: str) -> Principal:
        live = await run_in_threadpool(self._load, prefix)
        if live is None:
            await self._cache.mark_unknown(prefix)
            raise Unauthenticated("unknown or revoked API key")
        if not live.matches(secret):
            raise Unauthenticated("unknown or revoked API key")
        await self._cache.remember(prefix, KnownKey(live=live, verified_at=time.time()))
        return live.principal

    async def warm(self) -> int:
        """Know the keys live now, as if each had just been verified (in this process's cache;
        a shared cache knows them already); how many. A database that cannot be read now
        does not stop the start (`/readyz` says so): keys are then looked up as they come."""
        if not isinstance(self._cache, MemoryKeyCache):
            return 0
        try:
            live = await run_in_threadpool(self._load_all)
        except SQLAlchemyError as error:
            logger.warning("live API keys not loaded at start: %s", type(error).__name__)
            return 0
        now = time.time()
        for prefix, key in live.items():
            await self._cache.remember(prefix, KnownKey(live=key, verified_at=now))
        return len(live)

    def _load_all(self) -> dict[str, LiveKey]:
        with self._sessions() as session:
            return load_live_keys(session=session, limit=MAX_KNOWN_KEYS)

    def _load(self, prefix: str) -> LiveKey | None:
        with self._sessions() as session:
            return load_live_key(session=session, prefix=prefix)


def make_authenticator(settings: Settings, sessions: sessionmaker[Session]) -> KeyAuthenticator:
    return KeyAuthenticator(
        sessions,
        make_auth_stores(settings),
        ttl_s=settings.auth_cache_ttl_s,
        refusal_delay_s=settings.address_refusal_delay_s,
    )


def client_address(request: Request) -> str:
    """The peer's address (behind a trusted proxy, uvicorn's --forwarded-allow-ips sets it)."""
    return request.client.host if request.client is not None else "unknown"


def bearer_key(request: Request) -> str:
    headers = request.headers.getlist("authorization")
    if not headers:
        raise Unauthenticated("missing Authorization: Bearer <API key> header")
    if len(headers) > 1:
        raise Unauthenticated("send one Authorization header, not several")
    scheme, _, raw_key = headers[0].partition(" ")
    if scheme.lower() != "bearer" or not raw_key.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <API key>'")
    return raw_key.strip()


def require(scope: Scope) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency: the caller's principal, if its key is valid, in scope and under its limit."""

    async def dependency(request: Request) -> Principal:
        authenticator: KeyAuthenticator = request.app.state.authenticator
        return await authenticator.authorize(request, scope)

    return dependency
