"""Live watch: is the champion doing worse with real users than the one it replaced?

Interactions record the model that served them (`model: {"name": "acme.billing", "version":
"3"}`), and feedback hangs off interactions. Per version: the thumbs-up rate (thumbs, and
stars read as up at 4-5, down at 1-2) and the correction rate (interactions corrected, over
interactions with any feedback). The champion is flagged when its thumbs-up rate is below its
predecessor's by a one-sided two-proportion z-test at `alpha`, each side having at least
`min_ratings` ratings; with the domain config's `auto_rollback: true` (at its top or in its
`release` section) the champion is then rolled back at once, audited as an `auto_rollback` by
`watch`. The challenger of a canary is judged against the champion by `registry.canary`, on the
same period's traffic (`live_rates(..., since=...)`).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Integer, case, func, or_, select
from sqlalchemy.orm import Session

from flywheel.feedback.models import FeedbackEvent, Interaction
from flywheel.registry.mlflow_registry import Registry
from flywheel.registry.models import ModelVersion, PromotionEvent
from flywheel.registry.service import (
    current_champion,
    latest_champion_event,
    rollback,
)
from flywheel.tenancy.models import Domain

ALPHA = 0.05
MIN_RATINGS = 30


@dataclass(frozen=True)
class LiveRates:
    version: str
    ratings: int
    thumbs_up_rate: float | None
    judged: int  # interactions with any feedback
    correction_rate: float | None


@dataclass(frozen=True)
class WatchResult:
    champion: LiveRates | None
    predecessor: LiveRates | None
    p_value: float | None
    is_flagged: bool
    rolled_back_to: str | None
    reason: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


# Shadow answers were recorded but never shown: they are no user's experience of a version.
SEEN_BY_USERS = or_(Interaction.release_role.is_(None), Interaction.release_role != "shadow")


def live_rates(
    session: Session, version: ModelVersion, *, since: datetime | None = None
) -> LiveRates:
    """The version's live feedback, from the interactions it served (created at or after
    `since`, when given)."""
    served = (
        (Interaction.domain_id == version.domain_id)
        & (Interaction.model_name == version.registered_model)
        & (Interaction.model_version == version.version)
    )
    return _rates(session, served, version.version, since)


def base_rates(session: Session, domain_id: uuid.UUID, *, since: datetime | None) -> LiveRates:
    """The base model's live feedback: the domain's interactions served by no version."""
    served = (Interaction.domain_id == domain_id) & Interaction.model_version.is_(None)
    return _rates(session, served, "base", since)


def _rates(
    session: Session, served: ColumnElement[bool], label: str, since: datetime | None
) -> LiveRates:
    up = case(
        (FeedbackEvent.value["thumbs"].as_string() == "up", 1),
        (FeedbackEvent.value["stars"].as_integer() >= 4, 1),
        else_=0,
    )
    rated = case(
        (FeedbackEvent.value["thumbs"].as_string().is_not(None), 1),
        (FeedbackEvent.value["stars"].as_integer() >= 4, 1),
        (FeedbackEvent.value["stars"].as_integer() <= 2, 1),
        else_=0,
    )
    served = served & SEEN_BY_USERS
    if since is not None:
        served = served & (Interaction.created_at >= since)
    ratings = session.execute(
        select(func.coalesce(func.sum(rated), 0), func.coalesce(func.sum(up), 0))
        .select_from(FeedbackEvent)
        .join(Interaction, Interaction.id == FeedbackEvent.interaction_id)
        .where(served, FeedbackEvent.kind == "rating")
    ).one()
    corrected = func.max(case((FeedbackEvent.kind == "correction", 1), else_=0).cast(Integer))
    per_interaction = (
        select(corrected.label("is_corrected"))
        .select_from(FeedbackEvent)
        .join(Interaction, Interaction.id == FeedbackEvent.interaction_id)
        .where(served)
        .group_by(Interaction.id)
        .subquery()
    )
    judged, corrections = session.execute(
        select(func.count(), func.coalesce(func.sum(per_interaction.c.is_corrected), 0))
    ).one()
    count, ups = int(ratings[0]), int(ratings[1])
    return LiveRates(
        label,
        count,
        ups / count if count else None,
        int(judged),
        int(corrections) / int(judged) if judged else None,
    )


def watch_domain(
    *,
    session: Session,
    registry: Registry,
    domain: Domain,
    alpha: float = ALPHA,
    min_ratings: int = MIN_RATINGS,
) -> WatchResult:
    """Compare the champion's live thumbs-up rate with its predecessor's; roll back when the
    domain says so and the drop is significant."""
    champion = current_champion(session, domain.id)
    latest = latest_champion_event(session, domain.id)
    if champion is None or latest is None or latest.from_model_version_id is None:
        return WatchResult(None, None, None, False, None, "no champion with a predecessor")
    predecessor = session.get_one(ModelVersion, latest.from_model_version_id)
    ours, theirs = live_rates(session, champion), live_rates(session, predecessor)
    if ours.ratings < min_ratings or theirs.ratings < min_ratings:
        reason = f"too few ratings to judge (need {min_ratings} each)"
        return WatchResult(ours, theirs, None, False, None, reason)
    p_value = one_sided_p(ours, theirs)
    if p_value >= alpha:
        return WatchResult(ours, theirs, p_value, False, None, "no significant drop")
    reason = (
        f"live thumbs-up rate of v{ours.version} {ours.thumbs_up_rate:.1%} is below "
        f"v{theirs.version}'s {theirs.thumbs_up_rate:.1%} (one-sided p = {p_value:.4f})"
    )
    if not _is_auto_rollback(domain):
        return WatchResult(ours, theirs, p_value, True, None, reason)
    event: PromotionEvent = rollback(
        session=session,
        registry=registry,
        domain=domain,
        actor="watch",
        reason=reason,
        action="auto_rollback",
    )
    event.evidence = {**event.evidence, "live": {"champion": asdict(ours),
                                                 "predecessor": asdict(theirs),
                                                 "p_value": p_value}}  # fmt: skip
    return WatchResult(ours, theirs, p_value, True, predecessor.version, reason)


def _is_auto_rollback(domain: Domain) -> bool:
    """The domain's `auto_rollback`, at the top of its config or in its `release` section."""
    config = domain.config or {}
    release = config.get("release")
    in_release = isinstance(release, dict) and release.get("auto_rollback") is True
    return bool(config.get("auto_rollback")) or in_release


def one_sided_p(ours: LiveRates, theirs: LiveRates) -> float:
    """P(a rate this much lower by chance): pooled two-proportion z-test, one-sided."""
    mine, before = ours.thumbs_up_rate or 0.0, theirs.thumbs_up_rate or 0.0
    pooled = (mine * ours.ratings + before * theirs.ratings) / (ours.ratings + theirs.ratings)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / ours.ratings + 1 / theirs.ratings))
    if spread == 0:
        return 1.0 if mine >= before else 0.0
    z = (mine - before) / spread
    return 0.5 * math.erfc(-z / math.sqrt(2))
