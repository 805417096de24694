"""Which version answers a request's `model`, and the adapter files it needs.

    billing              the champion (the base model before one exists); the domain's canary
                         share of end users (sticky: a hash of domain and end user) gets the
                         challenger, or with `shadow` the champion while the challenger answers
                         too, unseen
    billing@challenger   the challenger (404 when there is none)
    billing@champion     the champion, never the canary
    billing:3            version 3 (404 when the domain has none, or it is tainted)

A domain's release (champion, challenger, untainted versions, release config) is read from the
database once per `ttl_s` per process and kept: requests on the hot path never wait for the
database, and a promotion or rollback is served within `ttl_s` (FLYWHEEL_GATEWAY_ROUTE_CACHE_TTL_S,
2 s by default). A domain that does not exist is remembered the same way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.split import position_of
from flywheel.errors import FlywheelError, NotFound
from flywheel.inference.backends import Adapter, BackendError, ChatBackend
from flywheel.registry.models import ModelVersion
from flywheel.registry.release import ReleaseConfig, current_challenger, release_config
from flywheel.registry.service import current_champion
from flywheel.tenancy.models import Domain

Role = Literal["champion", "challenger", "pinned", "base", "shadow"]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedVersion:
    """What the gateway needs of a `ModelVersion` (a plain snapshot, kept across sessions)."""

    registered_model: str
    version: str
    adapter_uri: str

    @property
    def adapter_name(self) -> str:
        return f"{self.registered_model}-v{self.version}"

    @classmethod
    def of(cls, row: ModelVersion | None) -> ServedVersion | None:
        if row is None:
            return None
        return cls(row.registered_model, row.version, row.adapter_uri)


@dataclass(frozen=True)
class DomainRelease:
    domain_id: uuid.UUID
    name: str
    champion: ServedVersion | None
    challenger: ServedVersion | None
    config: ReleaseConfig
    versions: dict[str, ServedVersion] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    """The answer to one request: `version` None is the base model."""

    domain_id: uuid.UUID
    domain: str
    version: ServedVersion | None
    role: Role
    shadow: ServedVersion | None = None  # answers too, recorded with role "shadow", unseen


def parse_model(model: str) -> tuple[str, str | None, str | None]:
    """`billing` -> (billing, None, None); `billing@challenger` -> alias; `billing:3` -> version."""
    if "@" in model:
        name, _, alias = model.partition("@")
        return name, alias, None
    if ":" in model:
        name, _, version = model.partition(":")
        return name, None, version
    return model, None, None


class Router:
    """Requests' `model` -> `Route`, from a per-process cache of each domain's release."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[tuple[uuid.UUID, str], tuple[float, DomainRelease | None]] = {}
        self._loading: dict[tuple[uuid.UUID, str], asyncio.Future[DomainRelease | None]] = {}

    async def route(self, tenant_id: uuid.UUID, model: str, end_user: str) -> Route:
        name, alias, version = parse_model(model)
        release = await self.release(tenant_id, name)
        if release is None:
            raise NotFound(f"model {model!r} not found: no domain {name!r}")
        if version is not None:
            pinned = release.versions.get(version)
            if pinned is None:
                raise NotFound(f"model {model!r} not found: {name} has no version {version!r}")
            return Route(release.domain_id, name, pinned, "pinned")
        if alias == "challenger":
            if release.challenger is None:
                raise NotFound(f"model {model!r} not found: {name} has no challenger")
            return Route(release.domain_id, name, release.challenger, "challenger")
        if alias not in (None, "champion"):
            raise NotFound(f"model {model!r} not found: aliases are @champion and @challenger")
        return self._canary(release, end_user, is_canary=alias is None)

    def _canary(self, release: DomainRelease, end_user: str, *, is_canary: bool) -> Route:
        champion = release.champion
        role: Role = "champion" if champion else "base"
        served = Route(release.domain_id, release.name, champion, role)
        share = release.config.challenger_share
        if not is_canary or release.challenger is None or share <= 0:
            return served
        if position_of(release.domain_id, end_user) >= share:
            return served
        if release.config.shadow:
            return Route(served.domain_id, served.domain, champion, served.role, release.challenger)
        return Route(release.domain_id, release.name, release.challenger, "challenger")

    async def release(self, tenant_id: uuid.UUID, name: str) -> DomainRelease | None:
        """The domain's release from the cache while fresh; else read once (concurrent
        requests for the same domain wait on the one read)."""
        key = (tenant_id, name)
        cached = self._cache.get(key)
        if cached is not None and self._clock() < cached[0]:
            return cached[1]
        loading = self._loading.get(key)
        if loading is not None:
            return await asyncio.shield(loading)
        future: asyncio.Future[DomainRelease | None] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            found = await asyncio.to_thread(self._load, tenant_id, name)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters (if any) get it, nobody logs it unread
            raise
        finally:
            del self._loading[key]
        self._cache[key] = (self._clock() + self.ttl_s, found)
        future.set_result(found)
        return found

    def _load(self, tenant_id: uuid.UUID, name: str) -> DomainRelease | None:
        with self._sessions() as session:
            domain = session.scalar(
                select(Domain).where(Domain.tenant_id == tenant_id, Domain.name == name)
            )
            if domain is None:
                return None
            versions = session.scalars(
                select(ModelVersion).where(
                    ModelVersion.domain_id == domain.id, ModelVersion.tainted_at.is_(None)
                )
            )
            return DomainRelease(
                domain_id=domain.id,
                name=domain.name,
                champion=ServedVersion.of(current_champion(session, domain.id)),
                challenger=ServedVersion.of(current_challenger(session, domain.id)),
                config=_config_of(domain),
                versions={row.version: ServedVersion(
                    row.registered_model, row.version, row.adapter_uri
                ) for row in versions},
            )  # fmt: skip


def _config_of(domain: Domain) -> ReleaseConfig:
    """The domain's release config; a malformed one serves as the defaults (no canary), as
    the gateway's callers cannot fix it (`flywheel domains` reports it)."""
    try:
        return release_config(domain)
    except FlywheelError as error:
        logger.warning("domain %s: release config ignored: %s", domain.name, error.message)
        return ReleaseConfig()


class AdapterDownload(Exception):
    """The registry could not give a version's adapter files."""


class Adapters:
    """A version's adapter, servable: its files downloaded from the MLflow registry once to
    `<home>/adapters/<name>/` (atomically: a temporary directory renamed), then loaded into the
    backend. With `is_dynamic` False the upstream serves every adapter by name already."""

    def __init__(
        self,
        backend: ChatBackend,
        *,
        home: Path,
        tracking_uri: str,
        is_dynamic: bool = True,
    ) -> None:
        self._backend = backend
        self._root = home / "adapters"
        self._tracking_uri = tracking_uri
        self._is_dynamic = is_dynamic
        self._ready: dict[str, Adapter] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def adapter(self, version: ServedVersion | None) -> Adapter | None:
        """The version's adapter, its files here and the backend told of it. The backend is
        asked every time (a set lookup once loaded): an upstream that restarted and lost its
        adapters makes it load them again."""
        if version is None:
            return None
        adapter = self._ready.get(version.adapter_name)
        if adapter is None:
            lock = self._locks.setdefault(version.adapter_name, asyncio.Lock())
            async with lock:
                adapter = self._ready.get(version.adapter_name) or await self._fetch(version)
                self._ready[version.adapter_name] = adapter
        await self._backend.ensure_adapter(adapter)
        return adapter

    async def _fetch(self, version: ServedVersion) -> Adapter:
        name = version.adapter_name
        if not self._is_dynamic:  # the upstream serves it already: the backend checks it does
            return Adapter(name, self._root / name)
        try:
            path = await asyncio.to_thread(self._download, version)
        except Exception as error:  # any MLflow or file failure: the call cannot be served
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            message = f"adapter {name} could not be fetched from the registry: {first[:200]}"
            raise BackendError("unavailable", message) from error
        return Adapter(name, path)

    def _download(self, version: ServedVersion) -> Path:
        final = self._root / version.adapter_name
        if final.is_dir():
            return final
        from mlflow.artifacts import download_artifacts  # heavy: only when an adapter is new

        self._root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{version.adapter_name}-", dir=self._root))
        try:
            files = download_artifacts(
                artifact_uri=version.adapter_uri,
                dst_path=str(staging),
                tracking_uri=self._tracking_uri,
            )
            os.replace(files, final)  # another worker may have won: then keep its copy
        except OSError:
            if not final.is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return final
