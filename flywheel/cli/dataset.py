"""`flywheel dataset build|list|export|lineage`: immutable, versioned training sets per domain."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from flywheel.cli.common import (
    JsonOption,
    database_session,
    emit,
    resolve_tenant_id,
    step,
)
from flywheel.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from flywheel.datasets import service
    from flywheel.datasets.export_formats import Format
    from flywheel.datasets.models import DatasetVersion

dataset = typer.Typer(help="Build, list and export dataset versions.", no_args_is_help=True)

DomainOption = typer.Option(..., "--domain", help="The domain.")
TenantOption = typer.Option(None, "--tenant", help="The tenant (when there is more than one).")


@dataset.command("build")
def build(
    domain: str = DomainOption,
    tenant: str | None = TenantOption,
    # Defaults (None here) are the recipe's: the services load when the command runs.
    eval_fraction: float = typer.Option(None, help="Share of new groups [default: 0.1]."),
    replay_fraction: float = typer.Option(
        None, help="Share of earlier train items trained on again [default: 0.25]."
    ),
    ngram: int = typer.Option(None, help="Decontamination n-gram length (words) [default: 13]."),
    curriculum: str = typer.Option(None, help="easy_first or none [default: easy_first]."),
    mix: list[str] = typer.Option(
        [], "--mix", help="DOMAIN=SHARE: mix in that share (0..1] of another domain's train items."
    ),
    source_weight: list[str] = typer.Option(
        [], "--source-weight", help="KIND=WEIGHT: scale a source's train weights (0 drops it)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Build the domain's next version from its eligible signal (or say nothing changed)."""
    from flywheel.datasets import service
    from flywheel.tenancy.service import get_domain

    given: dict[str, Any] = {"eval_fraction": eval_fraction, "replay_fraction": replay_fraction}
    given |= {"ngram": ngram, "curriculum": curriculum}
    recipe = service.DatasetRecipe(
        **{name: value for name, value in given.items() if value is not None},
        mix=_pairs("--mix", mix),
        source_weights=_pairs("--source-weight", source_weight),
    )
    with database_session() as session:
        tenant_id = resolve_tenant_id(session, tenant)
        domain_id = get_domain(session, tenant_id, domain).id
        with step(f"building {domain}'s next version", is_quiet=as_json):
            built = service.build_dataset_version(
                session=session, tenant_id=tenant_id, domain_id=domain_id, recipe=recipe
            )
        data = _version_json(built.version, domain) | {"is_new": built.is_new}
    data["warnings"] = built.warnings
    emit(data, as_json=as_json, text=_build_line(built, domain))
    if not as_json:
        for warning in built.warnings:
            sys.stderr.write(f"warning: {warning}\n")


def _build_line(built: service.Built, domain: str) -> str:
    """What a build did, in one line: the splits' items by kind and their groups."""
    stats = built.version.stats or {}
    groups = stats.get("groups") or {}
    splits = "; ".join(
        f"{split} {_counts(stats.get(split) or {})} in {groups.get(split, 0)} groups"
        for split in ("train", "eval")
    )
    number = built.version.version
    if built.is_new:
        return f"built {domain} v{number}: {splits}"
    return (
        f"nothing new since {domain} v{number} ({splits}): no new eligible item, and groups "
        "already placed keep their split (an eval fraction or minimum places new groups only)"
    )


def _counts(by_kind: dict[str, int]) -> str:
    total = sum(by_kind.values())
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items()))
    return f"{total} items ({kinds})" if kinds else "0 items"


def _pairs(option: str, values: list[str]) -> dict[str, float]:
    """NAME=NUMBER options as a dict."""
    found: dict[str, float] = {}
    for value in values:
        name, sign, number = value.partition("=")
        try:
            found[name.strip()] = float(number)
        except ValueError:
            sign = ""
        if not sign or not name.strip():
            raise InvalidInput(f"{option} takes NAME=NUMBER, not {value!r}")
    return found


@dataset.command("list")
def list_command(
    domain: str = DomainOption, tenant: str | None = TenantOption, as_json: bool = JsonOption
) -> None:
    """The domain's versions, newest first."""
    from flywheel.datasets.versions import list_versions

    with database_session() as session:
        tenant_id = resolve_tenant_id(session, tenant)
        versions = list_versions(session=session, tenant_id=tenant_id, domain=domain)
        data = [_version_json(version, domain) for version in versions]
    lines = [
        f"v{item['version']}  {item['manifest_sha256'][:12]}  {item['created_at']}"
        + ("  TAINTED" if item["tainted_at"] else "")
        for item in data
    ]
    emit(data, as_json=as_json, text="\n".join(lines) or "(no versions)")


def _version_json(version: DatasetVersion, domain: str) -> dict[str, Any]:
    """The version as an export's manifest describes it, keyed by `id` for the CLI."""
    from flywheel.datasets.versions import version_manifest

    summary = version_manifest(version, domain)
    return {"id": summary.pop("dataset_version_id"), **summary}


@dataset.command("export")
def export(
    version: str = typer.Argument(..., help="A version id, or a version number with --domain."),
    out: Path = typer.Option(..., "--out", help="A new (or empty) directory."),
    export_format: str = typer.Option("trl", "--format", help="trl, openai or jsonl."),
    domain: str | None = typer.Option(None, "--domain", help="With a version number."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Write a version's train and eval splits as training files, with its manifest."""
    from flywheel.datasets.reader import export_dataset_version
    from flywheel.tenancy.models import Domain

    if export_format not in ("trl", "openai", "jsonl"):
        raise InvalidInput(f"unknown export format {export_format!r}: trl, openai or jsonl")
    with database_session() as session:
        found = _find_version(session, version, domain, tenant)
        domain_name = session.get_one(Domain, found.domain_id).name
        with step(f"exporting v{found.version} of {domain_name}", is_quiet=as_json):
            summary = export_dataset_version(
                session, found, domain_name, out, cast("Format", export_format)
            )
    files = {str(item.path): item.rows for item in summary.files}
    data = {
        "out": str(summary.out_dir),
        "format": summary.format,
        "files": files,
        "manifest_sha256": summary.manifest_sha256,
        "skipped": summary.skipped,
    }
    lines = [f"exported v{found.version} of {domain_name} to {summary.out_dir}"]
    lines += [f"  {path}: {rows} rows" for path, rows in files.items()]
    emit(data, as_json=as_json, text="\n".join(lines))


@dataset.command("lineage")
def lineage(
    version: str = typer.Argument(..., help="A version id, or a version number with --domain."),
    domain: str | None = typer.Option(None, "--domain", help="With a version number."),
    tenant: str | None = TenantOption,
) -> None:
    """Where every item of a version came from, one JSON line per item (split, kind, item id,
    source kind, source ref, group)."""
    from flywheel.datasets.reader import version_lineage

    with database_session() as session:
        found = _find_version(session, version, domain, tenant)
        for row in version_lineage(session, found):
            sys.stdout.write(json.dumps(row) + "\n")


def _find_version(
    session: Session, version: str, domain: str | None, tenant: str | None
) -> DatasetVersion:
    from flywheel.datasets.models import DatasetVersion
    from flywheel.datasets.service import get_version
    from flywheel.tenancy.service import get_domain

    if domain is None:
        try:
            version_id = uuid.UUID(version)
        except ValueError as error:
            raise InvalidInput(
                f"{version!r} is not a version id (give --domain for a number)"
            ) from error
        found = session.get(DatasetVersion, version_id)
        if (
            found is not None
            and tenant is not None
            and found.tenant_id != resolve_tenant_id(session, tenant)
        ):
            found = None  # another tenant's version is not found, not forbidden
    else:
        if not version.isdigit():
            raise InvalidInput(f"with --domain, VERSION is a number, not {version!r}")
        owner = get_domain(session, resolve_tenant_id(session, tenant), domain)
        return get_version(session, owner, int(version))
    if found is None:
        raise NotFound(f"dataset version {version} not found")
    return found
