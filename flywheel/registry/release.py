"""A domain's release: which version answers which request, and how a challenger goes live.

The `release` mapping of a domain's config, parsed and checked:

{"release": {"challenger_share": 0.1,   # the share of end users the challenger answers (sticky)
             "shadow": false,           # true: the challenger answers as well, recorded, unseen
             "auto_promote": false,     # the live watch promotes a challenger that is not worse
             "auto_rollback": false,    # the live watch rolls a worse champion back
             "min_ratings": 30,         # per side, before the live watch decides anything
             "alpha": 0.05}}            # the one-sided two-proportion test's level

The challenger is the newest registered version that passed its gate, is not tainted, has
never been champion and was not retired, registered after the current champion (the MLflow
`challenger` alias marks the same version; the database decides, so routing never waits on
MLflow). A challenger the live watch found worse is retired: an append-only promotion event
(alias `challenger`, action `retire`, from that version to none), after which no canary
serves it again.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from flywheel.errors import InvalidInput
from flywheel.registry.mlflow_registry import Registry
from flywheel.registry.models import CHALLENGER, CHAMPION, ModelVersion, PromotionEvent
from flywheel.registry.service import (
    _take_turn,
    current_champion,
    drop_challenger_alias,
)
from flywheel.tenancy.models import Domain


class ReleaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    challenger_share: float = Field(default=0.0, ge=0.0, le=1.0)
    shadow: bool = False
    auto_promote: bool = False
    auto_rollback: bool = False
    min_ratings: int = Field(default=30, ge=1)
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)

    @property
    def is_canary(self) -> bool:
        """A challenger goes live next to the champion (to a share of users, or in shadow)
        instead of being promoted by the cycle."""
        return self.challenger_share > 0 or self.shadow


RETIRE = "retire"


def release_config(domain: Domain) -> ReleaseConfig:
    """The domain's release settings (defaults when it has none); InvalidInput when malformed."""
    raw = (domain.config or {}).get("release") or {}
    try:
        return ReleaseConfig.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(["release", *(str(part) for part in first["loc"])])
        raise InvalidInput(f"domain {domain.name!r} {where}: {first['msg']}") from error


def current_challenger(session: Session, domain_id: uuid.UUID) -> ModelVersion | None:
    """The version a canary would serve next to the champion, or None."""
    champion = current_champion(session, domain_id)
    retired = select(PromotionEvent.from_model_version_id).where(
        PromotionEvent.domain_id == domain_id,
        PromotionEvent.alias == CHALLENGER,
        PromotionEvent.action == RETIRE,
        PromotionEvent.from_model_version_id.is_not(None),
    )
    ever_champion = select(PromotionEvent.to_model_version_id).where(
        PromotionEvent.domain_id == domain_id,
        PromotionEvent.alias == CHAMPION,
        PromotionEvent.to_model_version_id.is_not(None),
    )
    query = (
        select(ModelVersion)
        .where(
            ModelVersion.domain_id == domain_id,
            ModelVersion.tainted_at.is_(None),
            ModelVersion.id.not_in(ever_champion),
            ModelVersion.id.not_in(retired),
        )
        .order_by(ModelVersion.created_at.desc(), ModelVersion.id.desc())
    )
    if champion is not None:
        query = query.where(ModelVersion.created_at > champion.created_at)
    for version in session.scalars(query.limit(20)):
        if version.gate_result.get("is_promoted"):
            return version
    return None


def retire_challenger(
    *,
    session: Session,
    registry: Registry,
    domain: Domain,
    challenger: ModelVersion,
    actor: str,
    reason: str,
    evidence: dict[str, Any],
) -> PromotionEvent:
    """Stop serving `challenger`: the event first (flushed), then its MLflow `challenger`
    alias goes (when it still marks this version); an MLflow failure rolls the event back."""
    _take_turn(session, domain)  # one alias move per domain at a time, as promotions
    event = PromotionEvent(
        tenant_id=domain.tenant_id,
        domain_id=domain.id,
        alias=CHALLENGER,
        action=RETIRE,
        from_model_version_id=challenger.id,
        to_model_version_id=None,
        actor=actor,
        reason=reason,
        evidence=evidence,
    )
    session.add(event)
    session.flush()
    drop_challenger_alias(registry, challenger)
    return event
