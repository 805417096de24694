"""A domain's dataset versions as rows: the newest, all of them, and what an export's manifest
says of one. Apart from `flywheel.datasets.service` (builds), so that `flywheel dataset list`
and the registry's checks load the version model only, not a build's modules (`python -m
bench.cli_startup`).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from flywheel.datasets.models import DatasetVersion
from flywheel.tenancy.service import get_domain


def latest_version(
    *, session: Session, domain_id: uuid.UUID, is_untainted: bool = False
) -> DatasetVersion | None:
    """The domain's newest version (with `is_untainted`, its newest untainted one)."""
    query = select(DatasetVersion).where(DatasetVersion.domain_id == domain_id)
    if is_untainted:
        query = query.where(DatasetVersion.tainted_at.is_(None))
    return session.scalars(query.order_by(DatasetVersion.version.desc()).limit(1)).first()


def list_versions(*, session: Session, tenant_id: uuid.UUID, domain: str) -> list[DatasetVersion]:
    """The domain's versions, newest first."""
    domain_id = get_domain(session, tenant_id, domain).id
    return list(
        session.scalars(
            select(DatasetVersion)
            .where(DatasetVersion.domain_id == domain_id)
            .order_by(DatasetVersion.version.desc())
        )
    )


def version_manifest(version: DatasetVersion, domain: str) -> dict[str, Any]:
    """What an export's manifest.json says of the version: enough to trace and rebuild it."""
    return {
        "dataset_version_id": str(version.id),
        "domain": domain,
        "version": version.version,
        "manifest_sha256": version.manifest_sha256,
        "eval_sha256": version.eval_sha256,
        "recipe": version.recipe,
        "stats": version.stats,
        "parent_id": str(version.parent_id) if version.parent_id else None,
        "created_at": version.created_at.isoformat(),
        "tainted_at": version.tainted_at.isoformat() if version.tainted_at else None,
    }
