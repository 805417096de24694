"""`flywheel suites create|list|show|train`: named sets of domains trained as one adapter,
gated per member domain."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import (
    JsonOption,
    database_session,
    database_sessions,
    emit,
    resolve_tenant_id,
    settings,
)
from flywheel.errors import InvalidInput, InvalidState

if TYPE_CHECKING:
    from flywheel.suites.service import LoadedSuite

suites = typer.Typer(
    help="Suites: several domains trained as one adapter, gated per member.", no_args_is_help=True
)

TenantOption = typer.Option(None, "--tenant", help="The tenant (when there is more than one).")


@suites.command("create")
def create_command(
    name: str = typer.Argument(..., help="The suite's name."),
    domains: list[str] = typer.Option(
        ..., "--domain", help="A member as NAME=WEIGHT (its share of the draws); repeat it."
    ),
    curriculum: str = typer.Option(
        "easy_first", "--curriculum", help="easy_first (tasks by pass rate, easy first) or none."
    ),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a suite of the tenant's domains, each with a sampling weight above 0."""
    from flywheel.suites import service

    members: dict[str, float] = {}
    for text in domains:
        member, weight = service.parse_member(text)
        if member in members:
            raise InvalidInput(f"domain {member!r} is named twice")
        members[member] = weight
    with database_session() as session:
        created = service.create_suite(
            session=session,
            tenant_id=resolve_tenant_id(session, tenant),
            name=name,
            members=members,
            curriculum=curriculum,
        )
        data = created.as_json()
    emit(data, as_json=as_json, text=f"suite {name} created: {_members(data)}")


@suites.command("list")
def list_command(tenant: str | None = TenantOption, as_json: bool = JsonOption) -> None:
    """The tenant's suites and their members."""
    from flywheel.suites import service

    with database_session() as session:
        found = service.list_suites(session=session, tenant_id=resolve_tenant_id(session, tenant))
        data = [suite.as_json() for suite in found]
    lines = [f"{suite['name']}: {_members(suite)}" for suite in data] or ["no suites"]
    emit(data, as_json=as_json, text="\n".join(lines))


@suites.command("show")
def show_command(
    name: str = typer.Argument(..., help="The suite's name."),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """A suite's members and curriculum, and its runs (newest first) with each member's
    verdict."""
    from flywheel.suites import service

    with database_session() as session:
        loaded = service.get_suite(session, resolve_tenant_id(session, tenant), name)
        runs = service.list_suite_runs(session=session, suite=loaded.suite)
        data = _shown(loaded, runs)
    lines = [f"suite {name} ({data['curriculum']}): {_members(data)}"]
    for run in data["runs"]:
        verdicts = run["result"].get("verdicts") or {}
        marks = ", ".join(f"{d} {'passed' if v['is_promotable'] else 'refused'}"
                          for d, v in verdicts.items())  # fmt: skip
        lines.append(f"  run {run['id']}: {run['status']}" + (f" ({marks})" if marks else ""))
    emit(data, as_json=as_json, text="\n".join(lines))


@suites.command("train")
def train_command(
    name: str = typer.Argument(..., help="The suite's name."),
    overrides: list[str] = typer.Argument(None, help="KEY=VALUE config overrides."),
    method: str = typer.Option("sft", "--method", help="sft, dpo, kto or grpo."),
    base: Path | None = typer.Option(None, "--base", help="The base model directory."),
    config: Path | None = typer.Option(None, "--config", help="A YAML training config."),
    is_promoting: bool = typer.Option(
        True, "--promote/--no-promote", help="Promote every member when every gate passes."
    ),
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Train the suite's one adapter on every member's train split, gate it on every
    member's own eval set, and promote it in every member or in none."""
    from flywheel.db import unit_of_work
    from flywheel.suites.cycle import SuiteRequest, run_suite

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            tenant_id = resolve_tenant_id(session, tenant)
        request = SuiteRequest(tenant_id, name, method, base, config, tuple(overrides or ()),
                               is_promoting)  # fmt: skip
        outcome = run_suite(sessions, request, settings())
    data = outcome.as_json()
    emit(data, as_json=as_json, text=_summary(name, data))
    if outcome.status == "failed":
        raise InvalidState(f"suite {name} failed: {outcome.error} (run {outcome.run_id})")


def _members(data: dict[str, Any]) -> str:
    return ", ".join(f"{domain}={weight:g}" for domain, weight in data["members"].items())


def _shown(loaded: LoadedSuite, runs: list[Any]) -> dict[str, Any]:
    return loaded.as_json() | {"runs": [_run_json(run) for run in runs]}


def _run_json(run: Any) -> dict[str, Any]:
    return {"id": str(run.id), "status": run.status, "method": run.method, "error": run.error,
            "result": run.result, "created_at": run.created_at.isoformat()}  # fmt: skip


def _summary(name: str, data: dict[str, Any]) -> str:
    lines = [f"suite {name}: {data['status']} (run {data['suite_run_id']})"]
    if data.get("error"):
        lines.append(f"  {data['error']}")
    for domain, verdict in (data.get("verdicts") or {}).items():
        mark = "passed" if verdict["is_promotable"] else "refused"
        lines.append(f"  {domain} v{verdict.get('version')}: {mark}")
        lines += [f"    - {reason}" for reason in verdict.get("reasons", [])]
    for domain, moved in (data.get("promoted") or {}).items():
        lines.append(f"  {domain}: {moved}")
    for domain, curve in (data.get("domain_loss") or {}).items():
        points = ", ".join(f"{step}:{loss:.3f}" for step, loss in curve if loss is not None)
        lines.append(f"  {domain} loss by step: {points}")
    return "\n".join(lines)
