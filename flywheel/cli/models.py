"""`flywheel models list|promote|rollback --domain D`: the domain's adapters and its champion."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import (
    JsonOption,
    cli_actor,
    database_session,
    database_sessions,
    emit,
    resolve_tenant_id,
    settings,
)

if TYPE_CHECKING:
    from flywheel.registry.mlflow_registry import MlflowRegistry
    from flywheel.registry.models import ModelVersion, PromotionEvent, WebhookDelivery
    from flywheel.registry.webhooks import DeliveryReport

models = typer.Typer(help="List, promote and roll back a domain's adapters.", no_args_is_help=True)

DomainOption = typer.Option(..., "--domain", help="The domain.")
TenantOption = typer.Option(None, "--tenant", help="The tenant (when there is more than one).")
ReasonOption = typer.Option("", "--reason", help="Why: kept in the audit trail.")


def _registry() -> MlflowRegistry:
    from flywheel.registry.mlflow_registry import MlflowRegistry

    return MlflowRegistry(settings().resolved_mlflow_tracking_uri)


@models.command("list")
def list_command(
    domain: str = DomainOption, tenant: str | None = TenantOption, as_json: bool = JsonOption
) -> None:
    """The domain's versions (newest first), which is champion, which the live watch retired,
    and the history of moves."""
    from flywheel.registry import service

    with database_session() as session:
        found = service.list_models(
            session=session, tenant_id=resolve_tenant_id(session, tenant), domain=domain
        )
        champion = found.champion.id if found.champion else None
        retired = {e.from_model_version_id for e in found.history if e.action == "retire"}
        versions = [
            version_json(v, is_champion=v.id == champion) | {"is_retired": v.id in retired}
            for v in found.versions
        ]
        data: dict[str, Any] = {
            "registered_model": found.name,
            "champion": found.champion.version if found.champion else None,
            "versions": versions,
            "history": [event_json(e, found.versions) for e in found.history],
        }
    lines = [
        f"v{v['version']}  {v['created_at'][:19]}  gate "
        f"{'passed' if v['gate_result'].get('is_promoted') else 'not passed'}"
        + ("  CHAMPION" if v["is_champion"] else "")
        + ("  TAINTED" if v["tainted_at"] else "")
        + ("  RETIRED" if v["is_retired"] else "")
        for v in versions
    ]
    emit(data, as_json=as_json, text="\n".join(lines) or f"{found.name}: no versions yet")


@models.command("promote")
def promote(
    version: str = typer.Option(..., "--to", help="The version to make champion."),
    domain: str = DomainOption,
    reason: str = ReasonOption,
    force: bool = typer.Option(False, "--force", help="Even if it did not pass its gate."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Make a version the champion (it must have passed its gate unless --force)."""
    from flywheel.db import unit_of_work
    from flywheel.registry import service
    from flywheel.registry.webhooks import deliver_after_move
    from flywheel.tenancy.service import get_domain

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            event = service.promote(
                session=session,
                registry=_registry(),
                domain=get_domain(session, resolve_tenant_id(session, tenant), domain),
                version=version,
                actor=cli_actor(),
                reason=reason,
                force=force,
            )
            data = event_json(event, None) | {"to": version}
        sent = deliver_after_move(sessions, event.id)  # committed: now tell serving stacks
    data["webhooks"] = sent.as_json()
    emit(data, as_json=as_json, text=f"{domain}: champion is now v{version}{_told(sent)}")


@models.command("rollback")
def rollback(
    domain: str = DomainOption,
    to: str | None = typer.Option(None, "--to", help="A version (default: the previous champion)."),
    reason: str = ReasonOption,
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Move the champion back to the previous one (or --to a version), without retraining."""
    from flywheel.db import unit_of_work
    from flywheel.registry import service
    from flywheel.registry.models import ModelVersion
    from flywheel.registry.webhooks import deliver_after_move
    from flywheel.tenancy.service import get_domain

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            event = service.rollback(
                session=session,
                registry=_registry(),
                domain=get_domain(session, resolve_tenant_id(session, tenant), domain),
                to=to,
                actor=cli_actor(),
                reason=reason,
            )
            target = session.get_one(ModelVersion, event.to_model_version_id)
            data = event_json(event, None) | {"to": target.version}
        sent = deliver_after_move(sessions, event.id)  # committed: now tell serving stacks
    data["webhooks"] = sent.as_json()
    text = f"{domain}: rolled back, champion is now v{target.version}{_told(sent)}"
    emit(data, as_json=as_json, text=text)


def _told(sent: DeliveryReport) -> str:
    """What became of the move's webhooks, for a person (nothing when none are configured)."""
    if not (sent.delivered or sent.failed or sent.retried or sent.errors):
        return ""
    parts = [f"{sent.delivered} delivered"]
    if sent.retried or sent.errors:
        parts.append("the rest retried later (flywheel models webhooks list)")
    return "; webhooks: " + ", ".join(parts)


@models.command("watch")
def watch(
    domain: str = DomainOption, tenant: str | None = TenantOption, as_json: bool = JsonOption
) -> None:
    """Compare the champion's live thumbs-up rate with its predecessor's (roll back a
    significant drop with auto_rollback), then the challenger's with the champion's on the same
    period's traffic (the domain's release config: promote or retire it)."""
    from flywheel.db import unit_of_work
    from flywheel.registry.canary import watch as watch_live
    from flywheel.registry.webhooks import Scope, deliver_soon
    from flywheel.tenancy.service import get_domain

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            found = get_domain(session, resolve_tenant_id(session, tenant), domain)
            result = watch_live(session=session, registry=_registry(), domain=found)
        if result.has_moved_champion:  # committed: now tell serving stacks
            deliver_soon(sessions, Scope(domain_id=found.id))
    checked = result.champion
    verdict = "FLAGGED: " if checked.is_flagged else ""
    back = f"; rolled back to v{checked.rolled_back_to}" if checked.rolled_back_to else ""
    text = f"{domain}: {verdict}{checked.reason}{back}\nrelease: {result.release.reason}"
    emit(result.as_json(), as_json=as_json, text=text)


def version_json(version: ModelVersion, *, is_champion: bool) -> dict[str, Any]:
    return {
        "id": str(version.id),
        "version": version.version,
        "registered_model": version.registered_model,
        "adapter_uri": version.adapter_uri,
        "base_model": version.base_model,
        "training_run_id": str(version.training_run_id) if version.training_run_id else None,
        "eval_results": version.eval_results,
        "gate_result": version.gate_result,
        "is_champion": is_champion,
        "created_at": version.created_at.isoformat(),
        "tainted_at": version.tainted_at.isoformat() if version.tainted_at else None,
    }


def event_json(event: PromotionEvent, versions: list[ModelVersion] | None) -> dict[str, Any]:
    number = {v.id: v.version for v in versions or []}
    return {
        "id": str(event.id),
        "action": event.action,
        "alias": event.alias,
        "from": number.get(event.from_model_version_id) if event.from_model_version_id else None,
        "to": number.get(event.to_model_version_id) if event.to_model_version_id else None,
        "actor": event.actor,
        "reason": event.reason,
        "is_forced": event.is_forced,
        "created_at": event.created_at.isoformat(),
    }


webhooks = typer.Typer(help="The signed webhooks champion moves send.", no_args_is_help=True)
models.add_typer(webhooks, name="webhooks")

StatusOption = typer.Option(None, "--status", help="Only pending, delivered or failed ones.")


@webhooks.command("list")
def list_webhooks(
    domain: str = DomainOption,
    status: str | None = StatusOption,
    limit: int = typer.Option(100, "--limit", min=1, max=10_000, help="At most this many."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """The domain's webhook deliveries, oldest first: status, attempts, last response."""
    from flywheel.errors import InvalidInput
    from flywheel.registry.models import WEBHOOK_STATUSES
    from flywheel.registry.webhooks import list_deliveries

    if status is not None and status not in WEBHOOK_STATUSES:
        raise InvalidInput(f"--status must be one of {', '.join(WEBHOOK_STATUSES)}, not {status!r}")
    with database_session() as session:
        page = list_deliveries(
            session=session,
            tenant_id=resolve_tenant_id(session, tenant),
            domain=domain,
            status=status,
            limit=limit,
        )
        data = [delivery_json(row) for row in page.items]
    lines = [
        f"{d['created_at'][:19]}  {d['event']:<11}  {d['status']:<9}  {d['attempts']} tries  "
        f"{d['url']}"
        + (f"  ({d['last_error']})" if d["status"] != "delivered" and d["last_error"] else "")
        for d in data
    ]
    emit(data, as_json=as_json, text="\n".join(lines) or f"{domain}: no webhook deliveries")


@webhooks.command("deliver")
def deliver_webhooks(
    domain: str | None = typer.Option(None, "--domain", help="Only this domain's (default all)."),
    budget: float = typer.Option(
        60.0, "--budget-s", min=0, help="Keep retrying what falls due for this long."
    ),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Send the pending webhooks that are due (retries with backoff, then failed)."""
    from flywheel.db import unit_of_work
    from flywheel.errors import InvalidState
    from flywheel.registry.webhooks import Scope, deliver_due
    from flywheel.tenancy.service import get_domain

    current = settings()
    if current.webhook_secret is None:
        raise InvalidState("FLYWHEEL_WEBHOOK_SECRET is not set: webhooks are sent signed only")
    with database_sessions() as sessions:
        scope = Scope()
        if domain is not None:
            with unit_of_work(sessions) as session:
                found = get_domain(session, resolve_tenant_id(session, tenant), domain)
            scope = Scope(domain_id=found.id)
        sent = deliver_due(sessions, budget_s=budget, scope=scope, settings=current)
    text = f"{sent.delivered} delivered, {sent.failed} failed, {sent.retried} to retry"
    emit(sent.as_json(), as_json=as_json, text=text)
    if sent.failed:
        raise InvalidState(
            f"{sent.failed} webhook deliveries failed after their last attempt "
            "(flywheel models webhooks list --status failed)"
        )


def delivery_json(row: WebhookDelivery) -> dict[str, Any]:
    def when(at: Any) -> str | None:
        return at.isoformat() if at else None

    return {
        "id": str(row.id),
        "event": row.event,
        "url": row.url,
        "promotion_event_id": str(row.promotion_event_id),
        "status": row.status,
        "attempts": row.attempts,
        "last_status_code": row.last_status_code,
        "last_error": row.last_error,
        "next_attempt_at": when(row.next_attempt_at),
        "created_at": when(row.created_at),
        "delivered_at": when(row.delivered_at),
        "body": row.body,
    }
