"""Tenants own domains and API keys; every other row hangs off a tenant."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.db import Base, IdMixin, JsonType

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


class Tenant(IdMixin, Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(63), unique=True)


class ApiKey(IdMixin, Base):
    """An API key, stored only as the SHA-256 of its secret part.

    The key string is `fwk_<prefix>_<secret>`; `prefix` finds the row, the hash proves the secret.
    Secrets carry 256 bits of entropy, so a fast hash is enough (no password stretching needed).
    """

    __tablename__ = "api_keys"

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255), default="")
    scopes: Mapped[list[str]] = mapped_column(JsonType)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class Domain(IdMixin, Base):
    """A tenant's area of work (e.g. `billing-support`): one adapter line, one eval set."""

    __tablename__ = "domains"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    config: Mapped[dict[str, object]] = mapped_column(JsonType, default=dict)
