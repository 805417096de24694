"""`flywheel cycle --domain D`: one full turn inline (compile, build, train, evaluate, gate,
promote), resuming the domain's interrupted cycle if there is one."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import JsonOption, database_sessions, emit, resolve_tenant_id, settings
from flywheel.errors import InvalidState

if TYPE_CHECKING:
    from flywheel.scheduling.cycle import CycleOutcome


def cycle(
    domain: str = typer.Option(..., "--domain", help="The domain to turn."),
    tenant: str | None = typer.Option(None, "--tenant", help="The domain's tenant."),
    as_json: bool = JsonOption,
) -> None:
    """Run a cycle now, in this process (training in a subprocess). Each step is recorded on
    the cycle's run; a failed or killed cycle resumes at its failed step when run again."""
    from flywheel.db import unit_of_work
    from flywheel.scheduling.cycle import CycleRequest, run_cycle

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            tenant_id = resolve_tenant_id(session, tenant)
        outcome = run_cycle(
            sessions, CycleRequest(tenant_id, domain), settings(), progress=print_step
        )
    emit(outcome.as_json(), as_json=as_json, text=summary(domain, outcome))
    if outcome.status in ("failed", "cancelled"):
        raise InvalidState(f"cycle {outcome.status}: {outcome.error} (run {outcome.run_id})")


def print_step(name: str, entry: dict[str, Any]) -> None:
    """One stderr line per step as it starts and ends (training streams its own progress)."""
    status = entry["status"]
    if entry.get("resumed"):
        line = f"[cycle] {name}: done in an earlier attempt"
    elif status == "running":
        line = f"[cycle] {name} ..."
    else:
        line = f"[cycle] {name}: {status} in {entry.get('duration_s', 0):.1f} s"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def summary(domain: str, outcome: CycleOutcome) -> str:
    lines = [f"cycle of {domain}: {outcome.status} (run {outcome.run_id})"]
    if outcome.error:
        lines.append(f"  {outcome.error}")
    promoted = (outcome.steps.get("promote") or {}).get("result") or {}
    if promoted:
        verdict = "promoted to champion" if promoted.get("promoted") else "not promoted"
        lines.append(f"  v{promoted.get('version')} {verdict}")
        lines += [f"  - {reason}" for reason in promoted.get("reasons", [])]
    return "\n".join(lines)
