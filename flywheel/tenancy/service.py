"""Tenants, API keys and domains: create, look up, revoke. Services flush, never commit."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from flywheel.db import utcnow
from flywheel.errors import Conflict, InvalidInput, NotFound
from flywheel.tenancy.models import NAME_PATTERN, ApiKey, Domain, Tenant
from flywheel.tenancy.revocation import KeyRevocations

KEY_PREFIX = "fwk"
_KEY_PATTERN = re.compile(rf"^{KEY_PREFIX}_([0-9a-f]{{16}})_([A-Za-z0-9_-]{{43}})$")


class Scope(StrEnum):
    FEEDBACK_WRITE = "feedback:write"
    DATA_READ = "data:read"
    MODELS_WRITE = "models:write"
    INFER = "infer"
    ADMIN = "admin"


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: `secret` is shown once and never stored."""

    id: uuid.UUID
    tenant: str
    name: str
    scopes: tuple[str, ...]
    secret: str


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's tenant and what the key may do."""

    key_id: uuid.UUID
    tenant_id: uuid.UUID
    scopes: frozenset[str]

    def has_scope(self, scope: Scope) -> bool:
        return scope.value in self.scopes or Scope.ADMIN.value in self.scopes


@dataclass(frozen=True)
class LiveKey:
    """A key that exists and is not revoked: who it speaks for and the hash of its secret."""

    principal: Principal
    secret_sha256: str

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.secret_sha256, hash_secret(secret))


def check_name(name: str, *, what: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidInput(
            f"{what} name {name!r} must be 1-63 characters of a-z, 0-9, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


def create_tenant(*, session: Session, name: str) -> Tenant:
    tenant = Tenant(name=check_name(name, what="tenant"))
    session.add(tenant)
    _flush_or_conflict(session, f"tenant {name!r} already exists")
    return tenant


def get_tenant(*, session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f"tenant {name!r} not found")
    return tenant


def list_tenants(*, session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant).order_by(Tenant.name)))


def create_domain(*, session: Session, tenant: Tenant, name: str) -> Domain:
    domain = Domain(tenant_id=tenant.id, name=check_name(name, what="domain"), config={})
    session.add(domain)
    _flush_or_conflict(session, f"domain {name!r} already exists for tenant {tenant.name!r}")
    return domain


def list_domains(*, session: Session, tenant: Tenant) -> list[Domain]:
    query = select(Domain).where(Domain.tenant_id == tenant.id).order_by(Domain.name)
    return list(session.scalars(query))


def get_domain(session: Session, tenant_id: uuid.UUID, name: str) -> Domain:
    """The tenant's domain of that name: the one lookup by name, raising the one NotFound
    (404, or a one-line CLI error) — never another tenant's. Look it up once, pass it down."""
    found = session.scalar(select(Domain).where(Domain.tenant_id == tenant_id, Domain.name == name))
    if found is None:
        raise NotFound(f"domain {name!r} not found")
    return found


def parse_scopes(raw: list[str]) -> tuple[str, ...]:
    known = {scope.value for scope in Scope}
    scopes = tuple(dict.fromkeys(part.strip() for item in raw for part in item.split(",")))
    unknown = [scope for scope in scopes if scope not in known]
    if unknown or not scopes:
        raise InvalidInput(
            f"unknown or missing scopes {unknown}; choose from {', '.join(sorted(known))}"
        )
    return scopes


def create_api_key(
    *, session: Session, tenant: Tenant, scopes: tuple[str, ...], name: str = ""
) -> IssuedKey:
    """Create a key with 256 bits of secret; only its SHA-256 is stored."""
    prefix = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    key = ApiKey(
        tenant_id=tenant.id,
        prefix=prefix,
        secret_sha256=hash_secret(secret),
        name=name,
        scopes=list(scopes),
    )
    session.add(key)
    session.flush()
    return IssuedKey(
        id=key.id,
        tenant=tenant.name,
        name=name,
        scopes=scopes,
        secret=f"{KEY_PREFIX}_{prefix}_{secret}",
    )


def revoke_api_key(
    *, session: Session, key_id: uuid.UUID, revocations: KeyRevocations | None = None
) -> ApiKey:
    """Revoke the key; `revocations` (the API's shared cache, when there is one) forgets it at
    once, so no worker or host trusts it from its cache any more. Without one, each API process
    stops trusting it within its auth cache TTL."""
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"API key {key_id} not found")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.flush()
    if revocations is not None:
        revocations.revoked(key.prefix)
    return key


def list_api_keys(*, session: Session, tenant: Tenant) -> list[ApiKey]:
    query = select(ApiKey).where(ApiKey.tenant_id == tenant.id).order_by(ApiKey.created_at)
    return list(session.scalars(query))


def split_key(raw: str) -> tuple[str, str] | None:
    """(prefix, secret) of a well-formed key string, else None."""
    match = _KEY_PATTERN.fullmatch(raw)
    return (match.group(1), match.group(2)) if match else None


def load_live_key(*, session: Session, prefix: str) -> LiveKey | None:
    """The live key with this prefix, else None (no such key, or revoked)."""
    key = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))
    if key is None or key.is_revoked:
        return None
    return _live(key)


def load_live_keys(*, session: Session, limit: int) -> dict[str, LiveKey]:
    """Up to `limit` live keys, by prefix: what an API process knows from its start."""
    keys = session.scalars(select(ApiKey).where(ApiKey.revoked_at.is_(None)).limit(limit))
    return {key.prefix: _live(key) for key in keys}


def _live(key: ApiKey) -> LiveKey:
    principal = Principal(key_id=key.id, tenant_id=key.tenant_id, scopes=frozenset(key.scopes))
    return LiveKey(principal=principal, secret_sha256=key.secret_sha256)


def load_principal(*, session: Session, prefix: str, secret: str) -> Principal | None:
    """The principal of a live key whose secret matches, else None (unknown, wrong or revoked)."""
    live = load_live_key(session=session, prefix=prefix)
    return live.principal if live is not None and live.matches(secret) else None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _flush_or_conflict(session: Session, message: str) -> None:
    try:
        session.flush()
    except IntegrityError as error:
        raise Conflict(message) from error
