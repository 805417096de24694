"""The canary's verdict: is the challenger worse than the champion on the same period's traffic?

Both versions' live thumbs-up rates (`watch.live_rates`) are read over the interactions
created since the challenger went live: the first interaction it served (its registration
when it has served none), or since the current champion became champion, whichever is later,
so that both sides saw the same period's users. With at least `min_ratings` ratings per side
(the domain's `release` config), the one-sided two-proportion z-test of "the challenger is
below the champion" at `alpha` decides:

- it rejects: the challenger is worse. With `auto_rollback` it is retired (an append-only
  `retire` event by `watch`, `release.retire_challenger`): no canary serves it again.
- it does not reject: the challenger is not worse. With `auto_promote` it is promoted through
  `service.promote` (its gate rules apply: a stale verdict is refused, never forced), audited
  by `watch` with the live evidence on the event.
- too few ratings: nothing moves; the verdict says how many are missing.

Without a champion the challenger is compared with the base (the interactions no version
served). `watch_domain` (the champion against its predecessor) runs first; a champion it rolls
back leaves the canary for the next watch.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.errors import Conflict, FlywheelError
from flywheel.feedback.models import Interaction
from flywheel.registry.mlflow_registry import Registry
from flywheel.registry.models import ModelVersion
from flywheel.registry.release import (
    ReleaseConfig,
    current_challenger,
    release_config,
    retire_challenger,
)
from flywheel.registry.service import current_champion, latest_champion_event, promote
from flywheel.registry.watch import (
    SEEN_BY_USERS,
    LiveRates,
    WatchResult,
    base_rates,
    live_rates,
    one_sided_p,
    watch_domain,
)
from flywheel.tenancy.models import Domain

log = logging.getLogger(__name__)

WATCH_ACTOR = "watch"
Outcome = Literal["none", "keep", "promote", "retire"]


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    p_value: float | None
    reason: str


@dataclass(frozen=True)
class ReleaseVerdict:
    decision: Outcome
    reason: str
    champion: LiveRates | None = None
    challenger: LiveRates | None = None
    since: str | None = None
    p_value: float | None = None
    action: Literal["promoted", "retired"] | None = None
    promotion_event_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DomainWatch:
    """Both checks of one watch: the champion against its predecessor, and the canary."""

    champion: WatchResult
    release: ReleaseVerdict = field(default_factory=lambda: ReleaseVerdict("none", ""))

    @property
    def has_moved_champion(self) -> bool:
        return bool(self.champion.rolled_back_to) or self.release.action == "promoted"

    def as_json(self) -> dict[str, Any]:
        return self.champion.as_json() | {"release": self.release.as_json()}


def decide(
    champion: LiveRates, challenger: LiveRates, *, alpha: float, min_ratings: int
) -> Decision:
    """The canary's decision on two versions' live counts (a pure function)."""
    missing = [
        f"{max(0, min_ratings - side.ratings)} more for {name}"
        for name, side in (("the champion", champion), ("the challenger", challenger))
        if side.ratings < min_ratings
    ]
    if missing:
        return Decision(
            "keep", None, f"keep collecting: {' and '.join(missing)} (need {min_ratings} each)"
        )
    p_value = one_sided_p(challenger, champion)
    rates = (
        f"v{challenger.version} {challenger.thumbs_up_rate:.1%} of {challenger.ratings} "
        f"against {_named(champion.version)} {champion.thumbs_up_rate:.1%} of "
        f"{champion.ratings} (one-sided p = {p_value:.4f}, alpha {alpha})"
    )
    if p_value < alpha:
        return Decision("retire", p_value, f"challenger worse: thumbs-up {rates}")
    return Decision("promote", p_value, f"challenger not worse: thumbs-up {rates}")


def watch(*, session: Session, registry: Registry, domain: Domain) -> DomainWatch:
    """The champion against its predecessor, then (unless that rolled it back) the canary."""
    config = release_config(domain)
    checked = watch_domain(
        session=session,
        registry=registry,
        domain=domain,
        alpha=config.alpha,
        min_ratings=config.min_ratings,
    )
    if checked.rolled_back_to:
        waits = ReleaseVerdict("none", "the champion was rolled back: the canary waits")
        return DomainWatch(checked, waits)
    return DomainWatch(checked, watch_release(session=session, registry=registry, domain=domain))


def watch_release(*, session: Session, registry: Registry, domain: Domain) -> ReleaseVerdict:
    """The canary's verdict, acted on as the domain's `release` config says."""
    config = release_config(domain)
    challenger = current_challenger(session, domain.id)
    if challenger is None:
        return ReleaseVerdict("none", "no challenger")
    since = _went_live(session, challenger)
    champion = current_champion(session, domain.id)
    ours = live_rates(session, challenger, since=since)
    theirs = (
        live_rates(session, champion, since=since)
        if champion is not None
        else base_rates(session, domain.id, since=since)
    )
    decision = decide(theirs, ours, alpha=config.alpha, min_ratings=config.min_ratings)
    verdict = ReleaseVerdict(
        decision.outcome, decision.reason, theirs, ours, since.isoformat(), decision.p_value
    )
    if decision.outcome == "retire":
        return _retire(session, registry, domain, challenger, config, verdict)
    if decision.outcome == "promote":
        return _promote(session, registry, domain, challenger, config, verdict)
    return verdict


def _went_live(session: Session, challenger: ModelVersion) -> datetime:
    """When the same period's traffic starts: the challenger's first interaction (else its
    registration), or the current champion's promotion when that came later."""
    first = session.scalar(
        select(func.min(Interaction.created_at)).where(
            SEEN_BY_USERS,  # a shadow answer is not the canary reaching users
            Interaction.domain_id == challenger.domain_id,
            Interaction.model_name == challenger.registered_model,
            Interaction.model_version == challenger.version,
        )
    )
    since: datetime = first or challenger.created_at
    crowned = latest_champion_event(session, challenger.domain_id)
    if crowned is not None and crowned.created_at > since:
        since = crowned.created_at
    return since


def _retire(
    session: Session,
    registry: Registry,
    domain: Domain,
    challenger: ModelVersion,
    config: ReleaseConfig,
    verdict: ReleaseVerdict,
) -> ReleaseVerdict:
    if not config.auto_rollback:
        return _with(verdict, reason=f"{verdict.reason}; not retired (auto_rollback is off)")
    with session.begin_nested():
        event = retire_challenger(
            session=session,
            registry=registry,
            domain=domain,
            challenger=challenger,
            actor=WATCH_ACTOR,
            reason=verdict.reason,
            evidence={"live": _evidence(verdict)},
        )
    return _with(
        verdict,
        reason=f"{verdict.reason}; v{challenger.version} retired",
        action="retired",
        promotion_event_id=str(event.id),
    )


def _promote(
    session: Session,
    registry: Registry,
    domain: Domain,
    challenger: ModelVersion,
    config: ReleaseConfig,
    verdict: ReleaseVerdict,
) -> ReleaseVerdict:
    if not config.auto_promote:
        return _with(verdict, reason=f"{verdict.reason}; not promoted (auto_promote is off)")
    try:
        with session.begin_nested():
            event = promote(
                session=session,
                registry=registry,
                domain=domain,
                version=challenger.version,
                actor=WATCH_ACTOR,
                reason=f"live canary: {verdict.reason}",
            )
            event.evidence = {**event.evidence, "live": _evidence(verdict)}
            session.flush()
    except Conflict as refused:
        return _with(verdict, reason=f"{verdict.reason}; not promoted: {refused}")
    return _with(
        verdict,
        reason=f"{verdict.reason}; v{challenger.version} promoted",
        action="promoted",
        promotion_event_id=str(event.id),
    )


def _evidence(verdict: ReleaseVerdict) -> dict[str, Any]:
    return {
        "champion": asdict(verdict.champion) if verdict.champion else None,
        "challenger": asdict(verdict.challenger) if verdict.challenger else None,
        "p_value": verdict.p_value,
        "since": verdict.since,
    }


def _with(verdict: ReleaseVerdict, **changes: Any) -> ReleaseVerdict:
    return replace(verdict, **changes)


def _named(version: str) -> str:
    return version if version == "base" else f"v{version}"


def is_watched(domain: Domain) -> bool:
    """Whether the periodic watch looks at the domain: it has a release section or asks for
    auto_rollback."""
    config = domain.config if isinstance(domain.config, dict) else {}
    return bool(config.get("release")) or bool(config.get("auto_rollback"))


def watch_domains(sessions: sessionmaker[Session], registry: Registry) -> list[dict[str, Any]]:
    """The periodic watch: every watched domain in its own transaction; one that fails is
    logged and the rest carry on. Their moves' webhooks go out with the next delivery."""
    with unit_of_work(sessions) as session:
        ids = [domain.id for domain in session.scalars(select(Domain)) if is_watched(domain)]
    results = []
    for domain_id in ids:
        try:
            with unit_of_work(sessions) as session:
                domain = session.get_one(Domain, domain_id)
                seen = watch(session=session, registry=registry, domain=domain)
                results.append({"domain": domain.name} | seen.as_json())
        except FlywheelError as error:
            log.warning("watch of domain %s failed: %s", domain_id, error)
            results.append({"domain_id": str(domain_id), "error": str(error)})
    return results
