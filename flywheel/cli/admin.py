"""`flywheel tenants|keys|domains`: the administration a platform operator does."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import typer

from flywheel.cli.common import JsonOption, database_session, emit, settings
from flywheel.errors import InvalidInput

tenants = typer.Typer(help="Create and list tenants.", no_args_is_help=True)
keys = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
domains = typer.Typer(help="Create, configure and list a tenant's domains.", no_args_is_help=True)

TenantOption = typer.Option(..., "--tenant", "-t", help="Tenant name.")


@tenants.command("create")
def create_tenant(
    name: str = typer.Argument(..., help="Tenant name, e.g. acme."), as_json: bool = JsonOption
) -> None:
    """Create a tenant."""
    from flywheel.tenancy import service

    with database_session() as session:
        tenant = service.create_tenant(session=session, name=name)
        data = {"id": str(tenant.id), "name": tenant.name}
    emit(data, as_json=as_json, text=f"created tenant {name} ({data['id']})")


@tenants.command("list")
def list_tenants(as_json: bool = JsonOption) -> None:
    """List tenants."""
    from flywheel.tenancy import service

    with database_session() as session:
        data = [{"id": str(t.id), "name": t.name} for t in service.list_tenants(session=session)]
    emit(data, as_json=as_json, text="\n".join(item["name"] for item in data) or "(no tenants)")


@keys.command("create")
def create_key(
    tenant: str = TenantOption,
    scopes: list[str] = typer.Option(
        ...,
        "--scopes",
        "-s",
        help="Comma-separated: feedback:write, data:read, models:write, infer, admin.",
    ),
    name: str = typer.Option("", "--name", help="A label to recognise the key by."),
    as_json: bool = JsonOption,
) -> None:
    """Create an API key. The key is printed once; only its hash is stored."""
    from flywheel.tenancy import service

    with database_session() as session:
        owner = service.get_tenant(session=session, name=tenant)
        issued = service.create_api_key(
            session=session, tenant=owner, scopes=service.parse_scopes(scopes), name=name
        )
    data = {
        "id": str(issued.id),
        "tenant": issued.tenant,
        "name": issued.name,
        "scopes": list(issued.scopes),
        "key": issued.secret,
    }
    text = f"{issued.secret}\n(key id {issued.id}; store it now: it is not shown again)"
    emit(data, as_json=as_json, text=text)


@keys.command("list")
def list_keys(tenant: str = TenantOption, as_json: bool = JsonOption) -> None:
    """List a tenant's keys (never their secrets)."""
    from flywheel.tenancy import service

    with database_session() as session:
        owner = service.get_tenant(session=session, name=tenant)
        data: list[dict[str, Any]] = [
            {
                "id": str(key.id),
                "name": key.name,
                "scopes": key.scopes,
                "created_at": key.created_at.isoformat(),
                "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
            }
            for key in service.list_api_keys(session=session, tenant=owner)
        ]
    lines = [
        f"{item['id']}  {','.join(item['scopes'])}  {item['name']}"
        + ("  (revoked)" if item["revoked_at"] else "")
        for item in data
    ]
    emit(data, as_json=as_json, text="\n".join(lines) or "(no keys)")


@keys.command("revoke")
def revoke_key(
    key_id: str = typer.Argument(..., help="The key's id."), as_json: bool = JsonOption
) -> None:
    """Revoke an API key; it stops working within the API's auth cache TTL (at once with
    FLYWHEEL_REDIS_URL)."""
    from flywheel.tenancy import service
    from flywheel.tenancy.revocation import key_revocations

    try:
        parsed = uuid.UUID(key_id)
    except ValueError as error:
        raise InvalidInput(f"{key_id!r} is not a key id (a UUID)") from error
    with database_session() as session:
        revocations = key_revocations(settings())
        key = service.revoke_api_key(session=session, key_id=parsed, revocations=revocations)
        data = {
            "id": str(key.id),
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        }
    emit(data, as_json=as_json, text=f"revoked key {key_id}")


@domains.command("create")
def create_domain(
    name: str = typer.Argument(..., help="Domain name, e.g. billing-support."),
    tenant: str = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a domain for a tenant."""
    from flywheel.tenancy import service

    with database_session() as session:
        owner = service.get_tenant(session=session, name=tenant)
        domain = service.create_domain(session=session, tenant=owner, name=name)
        data = {"id": str(domain.id), "tenant": tenant, "name": domain.name}
    emit(data, as_json=as_json, text=f"created domain {tenant}/{name} ({data['id']})")


@domains.command("list")
def list_domains(tenant: str = TenantOption, as_json: bool = JsonOption) -> None:
    """List a tenant's domains."""
    from flywheel.tenancy import service

    with database_session() as session:
        owner = service.get_tenant(session=session, name=tenant)
        data = [
            {"id": str(domain.id), "name": domain.name}
            for domain in service.list_domains(session=session, tenant=owner)
        ]
    emit(data, as_json=as_json, text="\n".join(item["name"] for item in data) or "(no domains)")


@domains.command("configure")
def configure_domain(
    name: str = typer.Argument(..., help="The domain."),
    config_file: Path = typer.Option(
        ...,
        "--file",
        help="YAML or JSON: base_model, cycle, dataset, gate, primary_metric, auto_rollback, "
        "webhooks, release.",
    ),
    tenant: str = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Replace a domain's configuration (checked before it is stored)."""
    import yaml

    from flywheel.datasets.settings import dataset_settings
    from flywheel.registry.release import release_config
    from flywheel.registry.webhooks import domain_webhooks
    from flywheel.scheduling.config import cycle_settings
    from flywheel.tenancy import service

    try:
        config = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise InvalidInput(f"cannot read {config_file}: {error}") from error
    if not isinstance(config, dict):
        raise InvalidInput(f"{config_file} must hold a mapping, not {type(config).__name__}")
    with database_session() as session:
        owner = service.get_tenant(session=session, name=tenant)
        domain = service.get_domain(session, owner.id, name)
        domain.config = config
        cycle_settings(domain)  # a bad cycle section fails here, before anything is stored
        dataset_settings(domain)  # and so does a bad dataset section
        domain_webhooks(domain)  # and a bad webhooks list
        release_config(domain)  # and a bad release section
        data = {"name": domain.name, "config": config}
    emit(data, as_json=as_json, text=f"configured {tenant}/{name}")
