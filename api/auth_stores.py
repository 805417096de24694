"""What auth remembers between requests: known keys, unknown key prefixes, rate-limit windows.

In this process by default (the embedded setup, `flywheel demo`, the SQLite tests); in Redis
when `FLYWHEEL_REDIS_URL` is set, so that every worker and host shares one limit per key and
per client address, one cache of unknown prefixes, and sees a revocation at once. Rate limits
are `limits`' windows on its memory or Redis storage.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from cachetools import TTLCache
from limits import RateLimitItem, RateLimitItemPerSecond, WindowStats, strategies
from limits.aio import strategies as aio_strategies
from limits.aio.storage import RedisStorage
from limits.storage import MemoryStorage

from flywheel.errors import RateLimited
from flywheel.settings import Settings
from flywheel.tenancy.revocation import known_key_name, unknown_key_name
from flywheel.tenancy.service import LiveKey, Principal

MAX_KNOWN_KEYS = 10_000
# How long a key once verified stays "known" (kept, though re-checked against the database
# after the auth cache TTL): a known key's lookups skip the client address's failure budget,
# so a flood from its address (a shared NAT, the same host) does not lock it out.
MIN_KNOWN_KEEP_S = 60.0


@dataclass(frozen=True)
class KnownKey:
    """A live key as last read from the database, at `verified_at` (time.time())."""

    live: LiveKey
    verified_at: float


class KeyCache(Protocol):
    """Known keys and unknown prefixes, by key prefix."""

    async def recall(self, prefix: str) -> tuple[KnownKey | None, bool]:
        """(the known key, whether the prefix is known to have no live key)."""
        ...

    async def remember(self, prefix: str, known: KnownKey) -> None: ...

    async def mark_unknown(self, prefix: str) -> None:
        """No live key has this prefix (never had, or revoked): forget it, refuse it a while."""
        ...


class MemoryKeyCache:
    """In this process: bounded, each entry expiring on its own."""

    def __init__(self, *, keep_s: float, unknown_ttl_s: float, unknown_size: int) -> None:
        self._known: TTLCache[str, KnownKey] = TTLCache(MAX_KNOWN_KEYS, ttl=keep_s)
        self._unknown: TTLCache[str, bool] | None = (
            TTLCache(unknown_size, ttl=unknown_ttl_s) if unknown_ttl_s > 0 else None
        )

    async def recall(self, prefix: str) -> tuple[KnownKey | None, bool]:
        is_unknown = self._unknown is not None and prefix in self._unknown
        return self._known.get(prefix), is_unknown

    async def remember(self, prefix: str, known: KnownKey) -> None:
        self._known[prefix] = known

    async def mark_unknown(self, prefix: str) -> None:
        self._known.pop(prefix, None)
        if self._unknown is not None:
            self._unknown[prefix] = True


class RedisKeyCache:
    """In Redis, shared: entries expire with Redis TTLs; revoking deletes the known entry."""

    def __init__(
        self, client: aioredis.Redis, *, namespace: str, keep_s: float, unknown_ttl_s: float
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._keep_ms = max(1, round(keep_s * 1000))
        self._unknown_ttl_ms = round(unknown_ttl_s * 1000)

    async def recall(self, prefix: str) -> tuple[KnownKey | None, bool]:
        known, unknown = await self._client.mget(
            known_key_name(self._namespace, prefix), unknown_key_name(self._namespace, prefix)
        )
        return (_decode_known(known) if known is not None else None), unknown is not None

    async def remember(self, prefix: str, known: KnownKey) -> None:
        name = known_key_name(self._namespace, prefix)
        await self._client.set(name, _encode_known(known), px=self._keep_ms)

    async def mark_unknown(self, prefix: str) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.delete(known_key_name(self._namespace, prefix))
            if self._unknown_ttl_ms > 0:
                pipe.set(unknown_key_name(self._namespace, prefix), b"1", px=self._unknown_ttl_ms)
            await pipe.execute()


def _encode_known(known: KnownKey) -> str:
    principal = known.live.principal
    return json.dumps(
        {
            "key_id": str(principal.key_id),
            "tenant_id": str(principal.tenant_id),
            "scopes": sorted(principal.scopes),
            "secret_sha256": known.live.secret_sha256,
            "verified_at": known.verified_at,
        }
    )


def _decode_known(raw: bytes) -> KnownKey:
    data = json.loads(raw)
    principal = Principal(
        key_id=uuid.UUID(data["key_id"]),
        tenant_id=uuid.UUID(data["tenant_id"]),
        scopes=frozenset(data["scopes"]),
    )
    live = LiveKey(principal=principal, secret_sha256=data["secret_sha256"])
    return KnownKey(live=live, verified_at=float(data["verified_at"]))


class AddressRefused(RateLimited):
    """The client address spent its budget of failed requests."""


class Limiter(Protocol):
    """The part of `limits`' (async) strategies used here."""

    async def hit(self, item: RateLimitItem, *identifiers: str) -> bool: ...

    async def test(self, item: RateLimitItem, *identifiers: str) -> bool: ...

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats: ...


class InProcessLimiter:
    """A synchronous `limits` strategy on its memory storage, behind the async interface: it
    does no I/O, so it runs on the event loop directly. (The async memory storage starts an
    expiry task, and a thread hop per window, on nearly every call: about 150 us of CPU per
    request here, against 40 us for this.)"""

    def __init__(self, limiter: strategies.RateLimiter) -> None:
        self._limiter = limiter

    async def hit(self, item: RateLimitItem, *identifiers: str) -> bool:
        return self._limiter.hit(item, *identifiers)

    async def test(self, item: RateLimitItem, *identifiers: str) -> bool:
        return self._limiter.test(item, *identifiers)

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        return self._limiter.get_window_stats(item, *identifiers)


class InProcessMovingWindow:
    """The per-key moving window in this process, exact: each key's hit times in a deque,
    oldest first, pruned as it is used; at most `amount` times per key.

    `limits`' memory storage keeps the same window as a list it grows at the front, and
    starts a timer thread every 10 ms to expire entries: on a bench worker (py-spy, GIL
    held) that cost ~25 us per request, this ~2 us. It runs on the event loop only.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._hits: dict[str, deque[float]] = {}
        self._clock = clock

    async def hit(self, item: RateLimitItem, *identifiers: str) -> bool:
        hits, now = self._window(item, identifiers)
        if len(hits) >= item.amount:
            return False
        hits.append(now)
        return True

    async def test(self, item: RateLimitItem, *identifiers: str) -> bool:
        hits, _ = self._window(item, identifiers)
        return len(hits) < item.amount

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        hits, now = self._window(item, identifiers)
        reset_time = (hits[0] if hits else now) + item.get_expiry()
        return WindowStats(reset_time=reset_time, remaining=max(0, item.amount - len(hits)))

    def _window(
        self, item: RateLimitItem, identifiers: tuple[str, ...]
    ) -> tuple[deque[float], float]:
        """The key's hits within the last `expiry` seconds, and now."""
        key = item.key_for(*identifiers)
        hits = self._hits.get(key)
        if hits is None:
            hits = self._hits[key] = deque()
        now = self._clock()
        start = now - item.get_expiry()
        while hits and hits[0] <= start:
            hits.popleft()
        return hits, now


class RequestLimits:
    """The rate limit per key (a moving window: exact) and the budget of failed requests per
    client address (a fixed window: a counter, cheap however many addresses a flood uses)."""

    def __init__(
        self,
        *,
        keys: Limiter,
        addresses: Limiter,
        key_limit: RateLimitItem,
        address_limit: RateLimitItem,
    ) -> None:
        self._keys = keys
        self._addresses = addresses
        self._key_limit = key_limit
        self._address_limit = address_limit

    async def take_key(self, key_id: uuid.UUID) -> None:
        if not await self._keys.hit(self._key_limit, "key", str(key_id)):
            stats = await self._keys.get_window_stats(self._key_limit, "key", str(key_id))
            raise RateLimited(
                "rate limit exceeded for this API key", retry_after_s=_retry_after_s(stats)
            )

    async def check_address(self, address: str) -> None:
        """Refuse the address if its failure budget is spent (a test: it costs nothing)."""
        if not await self._addresses.test(self._address_limit, "address", address):
            await self.refuse_address(address)

    async def charge_address(self, address: str) -> bool:
        """Count one failed request against the address; False if its budget was spent."""
        return await self._addresses.hit(self._address_limit, "address", address)

    async def refuse_address(self, address: str) -> None:
        stats = await self._addresses.get_window_stats(self._address_limit, "address", address)
        raise AddressRefused(
            "too many failed requests from this address", retry_after_s=_retry_after_s(stats)
        )


def _retry_after_s(stats: WindowStats) -> float:
    return max(0.0, stats.reset_time - time.time())


@dataclass(frozen=True)
class AuthStores:
    cache: KeyCache
    limits: RequestLimits


def key_limit(settings: Settings) -> RateLimitItem:
    """`burst` requests in any window of burst/rate seconds, rounded up to whole seconds."""
    window_s = max(1, math.ceil(settings.rate_limit_burst / settings.rate_limit_per_s))
    return RateLimitItemPerSecond(settings.rate_limit_burst, window_s)


def make_auth_stores(settings: Settings) -> AuthStores:
    """In this process, or in Redis when `FLYWHEEL_REDIS_URL` is set."""
    keep_s = max(MIN_KNOWN_KEEP_S, 10 * settings.auth_cache_ttl_s)
    address_limit = RateLimitItemPerSecond(
        settings.address_failure_limit, settings.address_failure_window_s
    )
    keys: Limiter
    addresses: Limiter
    cache: KeyCache
    if settings.redis_url is None:
        storage = MemoryStorage()
        keys = InProcessMovingWindow()
        addresses = InProcessLimiter(strategies.FixedWindowRateLimiter(storage))
        cache = MemoryKeyCache(
            keep_s=keep_s,
            unknown_ttl_s=settings.unknown_key_cache_ttl_s,
            unknown_size=settings.unknown_key_cache_size,
        )
    else:
        url = settings.redis_url.get_secret_value()
        namespace = settings.redis_key_prefix
        shared = RedisStorage(
            f"async+{url}", implementation="redispy", key_prefix=f"{namespace}:limits"
        )
        keys = aio_strategies.MovingWindowRateLimiter(shared)
        addresses = aio_strategies.FixedWindowRateLimiter(shared)
        cache = RedisKeyCache(
            aioredis.Redis.from_url(url),
            namespace=namespace,
            keep_s=keep_s,
            unknown_ttl_s=settings.unknown_key_cache_ttl_s,
        )
    limits = RequestLimits(
        keys=keys, addresses=addresses, key_limit=key_limit(settings), address_limit=address_limit
    )
    return AuthStores(cache=cache, limits=limits)
