"""The names of the API's shared auth entries in Redis, and the revoking side's hook on them.

The API (`api/auth_stores.py`) caches live keys in Redis under `known_key_name`, and the
prefixes it found no live key for under `unknown_key_name`, when `FLYWHEEL_REDIS_URL` is set.
Revoking a key deletes its cached entry, so every worker and host looks it up again at once.
"""

from __future__ import annotations

from typing import Protocol

from flywheel.errors import InvalidState
from flywheel.settings import Settings


def known_key_name(namespace: str, prefix: str) -> str:
    return f"{namespace}:auth:known:{prefix}"


def unknown_key_name(namespace: str, prefix: str) -> str:
    return f"{namespace}:auth:unknown:{prefix}"


class KeyRevocations(Protocol):
    """Told of every revoked key (by its prefix), so that caches forget it."""

    def revoked(self, prefix: str) -> None: ...


class RedisRevocations:
    """Deletes a revoked key's entry from the API's shared cache in Redis.

    It runs before the revoking transaction commits: an API worker that read the key as live
    just before the commit may cache it once more, for at most `FLYWHEEL_AUTH_CACHE_TTL_S`."""

    def __init__(self, redis_url: str, namespace: str) -> None:
        self._redis_url = redis_url
        self._namespace = namespace

    def revoked(self, prefix: str) -> None:
        """Raises InvalidState if Redis cannot be reached: the revocation is then rolled back,
        rather than left to the TTL on some workers and not others."""
        import redis  # here: only a configured shared store needs the client

        try:
            with redis.Redis.from_url(self._redis_url, socket_timeout=5) as client:
                client.delete(known_key_name(self._namespace, prefix))
        except redis.RedisError as error:
            raise InvalidState(
                f"could not reach Redis to revoke the key everywhere, nothing revoked: {error}"
            ) from error


def key_revocations(settings: Settings) -> KeyRevocations | None:
    """The shared cache's revocation hook, or None when each API process caches on its own."""
    if settings.redis_url is None:
        return None
    return RedisRevocations(settings.redis_url.get_secret_value(), settings.redis_key_prefix)
