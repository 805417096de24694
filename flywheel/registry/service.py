"""Model versions, promotion and rollback: the database is the record, MLflow the registry.

    register_version(session=..., registry=..., run=..., adapter_uri=..., base_model=...)
    promote(session=..., registry=..., domain=<Domain>, version="3", actor=..., ...)
    rollback(session=..., registry=..., domain=<Domain>, to=None, actor=..., ...)

The domain is the row the caller looked up once (`tenancy.service.get_domain`).

Every alias move is a `PromotionEvent` (append-only: actor, from, to, reason, whether forced,
the gate evidence) and an MLflow tag on the version it moved to. The event is written first
(flushed, not committed), then the alias is moved in MLflow: if MLflow fails, the error
rolls the transaction back and nothing moved anywhere. The move's webhooks are written in
the same transaction (an outbox, `registry.webhooks`) and sent after it commits. Moves of one
domain take turns: a second promotion or rollback while one is in progress gets Conflict
(409), not a wait.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flywheel.bulk import chunked
from flywheel.db import utcnow
from flywheel.errors import Conflict, NotFound
from flywheel.registry.mlflow_registry import Registry
from flywheel.registry.models import CHALLENGER, CHAMPION, ModelVersion, PromotionEvent, Run
from flywheel.tenancy.models import Domain, Tenant
from flywheel.tenancy.service import get_domain


def registered_model_name(session: Session, domain: Domain) -> str:
    """One registered model per domain: `<tenant>.<domain>`."""
    tenant = session.get_one(Tenant, domain.tenant_id)
    return f"{tenant.name}.{domain.name}"


def register_version(
    *,
    session: Session,
    registry: Registry,
    run: Run,
    adapter_uri: str,
    base_model: str,
    extra_tags: dict[str, str] | None = None,
) -> ModelVersion:
    """A new version of the domain's registered model from a training run's adapter, tagged
    with its lineage, and marked `challenger`."""
    domain = session.get_one(Domain, run.domain_id)
    name = registered_model_name(session, domain)
    tags = {
        "flywheel.training_run_id": str(run.id),
        "flywheel.dataset_version_id": str(run.dataset_version_id),
        "flywheel.method": run.method,
        "flywheel.base_model": base_model,
        **(extra_tags or {}),
    }
    version = registry.create_version(name, adapter_uri, run.mlflow_run_id, tags)
    row = ModelVersion(
        tenant_id=run.tenant_id,
        domain_id=run.domain_id,
        training_run_id=run.id,
        registered_model=name,
        version=version,
        adapter_uri=adapter_uri,
        base_model=base_model,
    )
    session.add(row)
    session.flush()
    registry.set_alias(name, CHALLENGER, version)
    return row


@dataclass(frozen=True)
class DomainModels:
    name: str
    versions: list[ModelVersion]
    champion: ModelVersion | None
    history: list[PromotionEvent]


def list_models(*, session: Session, tenant_id: uuid.UUID, domain: str) -> DomainModels:
    """The domain's versions (newest first), its champion and its alias history."""
    found = get_domain(session, tenant_id, domain)
    versions = session.scalars(
        select(ModelVersion)
        .where(ModelVersion.domain_id == found.id)
        .order_by(ModelVersion.created_at.desc())
    ).all()
    history = session.scalars(
        select(PromotionEvent)
        .where(PromotionEvent.domain_id == found.id)
        .order_by(PromotionEvent.created_at.desc())
    ).all()
    return DomainModels(
        registered_model_name(session, found),
        list(versions),
        current_champion(session, found.id),
        list(history),
    )


def taint_models_trained_on(
    session: Session, dataset_version_ids: list[uuid.UUID], *, request_id: uuid.UUID
) -> list[uuid.UUID]:
    """Mark the model versions trained on these dataset versions tainted by this forget
    request (the first request stays recorded); their ids."""
    found: set[uuid.UUID] = set()
    for chunk in chunked(dataset_version_ids):
        found.update(
            session.scalars(
                select(ModelVersion.id)
                .join(Run, Run.id == ModelVersion.training_run_id)
                .where(Run.dataset_version_id.in_(chunk))
            )
        )
    found |= _sharing_adapters(session, found)
    now = utcnow()
    for chunk in chunked(sorted(found)):
        session.execute(
            update(ModelVersion)
            .where(ModelVersion.id.in_(chunk), ModelVersion.tainted_at.is_(None))
            .values(tainted_at=now, tainted_by_id=request_id)
        )
    return sorted(found)


def _sharing_adapters(session: Session, version_ids: set[uuid.UUID]) -> set[uuid.UUID]:
    """The versions registered from the same adapters as these: a suite's one adapter is a
    version of each member domain (flywheel.suites), and data forgotten from one member taints
    every one of them."""
    adapters: set[str] = set()
    for chunk in chunked(sorted(version_ids)):
        adapters.update(
            session.scalars(select(ModelVersion.adapter_uri).where(ModelVersion.id.in_(chunk)))
        )
    found: set[uuid.UUID] = set()
    for uris in chunked(sorted(adapters)):
        found.update(
            session.scalars(select(ModelVersion.id).where(ModelVersion.adapter_uri.in_(uris)))
        )
    return found


def refuse_versions(
    *, session: Session, version_ids: list[uuid.UUID], reason: str, evidence: dict[str, Any]
) -> None:
    """Mark versions not promotable whatever their own gates said, `reason` added to theirs
    and `evidence` kept under the gate result's `suite` key: a suite's adapter is refused for
    every member when any member regresses (flywheel.suites), so `promote` refuses each."""
    for version_id in version_ids:
        row = session.get_one(ModelVersion, version_id)
        reasons = [*row.gate_result.get("reasons", []), reason]
        row.gate_result = {**row.gate_result, "is_promoted": False, "reasons": reasons,
                           "suite": evidence}  # fmt: skip
    session.flush()


def current_champion(session: Session, domain_id: uuid.UUID) -> ModelVersion | None:
    latest = latest_champion_event(session, domain_id)
    if latest is None or latest.to_model_version_id is None:
        return None
    return session.get(ModelVersion, latest.to_model_version_id)


def promote(
    *,
    session: Session,
    registry: Registry,
    domain: Domain,
    version: str,
    actor: str,
    reason: str = "",
    force: bool = False,
) -> PromotionEvent:
    """Make `version` the champion. It must have passed its gate against the current champion
    (the base when there is none) on the current eval set, unless `force` (audited as forced)."""
    _take_turn(session, domain)
    target = _version(session, domain, version)
    name = domain.name
    if target.tainted_at is not None and not force:
        raise Conflict(f"v{version} of {name} is tainted (trained on forgotten data)")
    if not target.gate_result.get("is_promoted") and not force:
        reasons = "; ".join(target.gate_result.get("reasons", [])) or "it has not been gated"
        raise Conflict(f"v{version} of {name} did not pass its gate ({reasons}): use --force")
    current = current_champion(session, domain.id)
    if current is not None and current.id == target.id:
        raise Conflict(f"v{version} is already the champion of {name}")
    if not force:
        _require_current_verdict(session, domain, target, current)
    return _move(session, registry, domain, current, target, "promote", actor, reason, force)


def _require_current_verdict(
    session: Session, domain: Domain, target: ModelVersion, current: ModelVersion | None
) -> None:
    """A passed gate counts only against today's rival on today's eval set: a version that once
    beat the base (or an older champion, or an older eval set) may be worse than the champion
    now. Conflict, naming the fix, when the verdict is stale."""
    from flywheel.datasets.versions import latest_version  # its model: not for `models list`

    verdict = target.gate_result
    rival = str(current.id) if current else None
    evaluation = latest_version(session=session, domain_id=domain.id, is_untainted=True)
    stale = []
    if (
        verdict.get("against_model_version_id") != rival
        or "against_model_version_id" not in verdict
    ):
        now = f"v{current.version}" if current else "the base"
        stale.append(
            f"it was gated against {verdict.get('against', 'an unknown rival')}, not {now}"
        )
    if evaluation is None or verdict.get("eval_sha256") != evaluation.eval_sha256:
        which = f"dataset v{evaluation.version}'s" if evaluation else "the current"
        stale.append(f"on another eval set than {which}")
    if stale:
        raise Conflict(
            f"v{target.version} of {domain.name} has a stale verdict ({'; '.join(stale)}): "
            f"evaluate it first (flywheel eval --domain {domain.name} --model-version "
            f"{target.version}), or use --force"
        )


def rollback(
    *,
    session: Session,
    registry: Registry,
    domain: Domain,
    actor: str,
    to: str | None = None,
    reason: str = "",
    action: str = "rollback",
) -> PromotionEvent:
    """Move the champion back to the one it replaced (or to version `to`, a former champion),
    at once: nothing is retrained, the earlier adapter is still registered. Never to a tainted
    version."""
    _take_turn(session, domain)
    current = current_champion(session, domain.id)
    if current is None:
        raise Conflict(f"{domain.name} has no champion to roll back")
    if to is not None:
        target = _version(session, domain, to)
        _require_former_champion(session, domain, target)
    else:
        latest = latest_champion_event(session, domain.id)
        previous = latest.from_model_version_id if latest else None
        if previous is None:
            raise Conflict(f"{domain.name} has no previous champion to roll back to")
        target = session.get_one(ModelVersion, previous)
    if target.tainted_at is not None:  # trained on forgotten data: never served again
        raise Conflict(f"v{target.version} of {domain.name} is tainted (trained on forgotten data)")
    if target.id == current.id:
        raise Conflict(f"v{target.version} is already the champion of {domain.name}")
    return _move(session, registry, domain, current, target, action, actor, reason, False)


def _require_former_champion(session: Session, domain: Domain, target: ModelVersion) -> None:
    """A rollback returns to a version that was champion before (instant: its verdict held
    then, and live traffic judged it); any other version goes through `promote` and its
    gate."""
    was_champion = session.scalars(
        select(PromotionEvent.id).where(
            PromotionEvent.domain_id == domain.id,
            PromotionEvent.alias == CHAMPION,
            PromotionEvent.to_model_version_id == target.id,
        )
    ).first()
    if was_champion is None:
        raise Conflict(
            f"v{target.version} was never champion of {domain.name}: promote it instead "
            f"(flywheel models promote --domain {domain.name} --to {target.version})"
        )


def _move(
    session: Session,
    registry: Registry,
    domain: Domain,
    current: ModelVersion | None,
    target: ModelVersion,
    action: str,
    actor: str,
    reason: str,
    force: bool,
) -> PromotionEvent:
    event = PromotionEvent(
        tenant_id=domain.tenant_id,
        domain_id=domain.id,
        alias=CHAMPION,
        action=action,
        from_model_version_id=current.id if current else None,
        to_model_version_id=target.id,
        actor=actor,
        reason=reason,
        is_forced=force,
        evidence=_evidence(target, current),
    )
    session.add(event)
    session.flush()  # the record first: an MLflow failure below rolls it back
    from flywheel.registry import webhooks  # pydantic's URL checks: not for `models list`

    webhooks.enqueue(session, event=event, target=target, current=current)  # same transaction
    registry.set_alias(target.registered_model, CHAMPION, target.version)
    drop_challenger_alias(registry, target)  # it is no longer a challenger
    registry.set_version_tag(
        target.registered_model,
        target.version,
        f"flywheel.{action}",
        f"{utcnow().isoformat()} by {actor}" + (" (forced)" if force else ""),
    )
    return event


def drop_challenger_alias(registry: Registry, version: ModelVersion) -> None:
    """MLflow's `challenger` alias off `version`, when it still marks it (a newer registration
    may have moved it on)."""
    if registry.alias_version(version.registered_model, CHALLENGER) == version.version:
        registry.delete_alias(version.registered_model, CHALLENGER)


def _evidence(target: ModelVersion, current: ModelVersion | None) -> dict[str, Any]:
    return {
        "gate": target.gate_result,
        "eval": target.eval_results,
        "from_version": current.version if current else None,
        "to_version": target.version,
    }


def _take_turn(session: Session, domain: Domain) -> None:
    """One alias move per domain at a time: a second gets Conflict instead of waiting."""
    if session.get_bind().dialect.name != "postgresql":
        return  # SQLite: one writer at a time anyway
    try:
        session.execute(
            text("SELECT id FROM domains WHERE id = :id FOR UPDATE NOWAIT"), {"id": domain.id}
        )
    except OperationalError as error:
        raise Conflict(f"another promotion or rollback of {domain.name} is in progress") from error


def latest_champion_event(session: Session, domain_id: uuid.UUID) -> PromotionEvent | None:
    return session.scalars(
        select(PromotionEvent)
        .where(PromotionEvent.domain_id == domain_id, PromotionEvent.alias == CHAMPION)
        .order_by(PromotionEvent.created_at.desc(), PromotionEvent.id.desc())
        .limit(1)
    ).first()


def _version(session: Session, domain: Domain, version: str) -> ModelVersion:
    found = session.scalars(
        select(ModelVersion).where(
            ModelVersion.domain_id == domain.id, ModelVersion.version == version
        )
    ).first()
    if found is None:
        raise NotFound(f"{domain.name} has no model version {version!r}")
    return found
