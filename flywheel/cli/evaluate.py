"""`flywheel eval --domain D [--model-version V] [--report-only]`: score a version against the
champion (or the base model) on the domain's frozen eval set, and record the gate's decision.

Exit status: 0 when the candidate passes the gate, REFUSED (3) when the gate refuses it (the
outcome is printed all the same; `--report-only` exits 0 then), 1 or 2 on an error."""

from __future__ import annotations

import typer

from flywheel.cli.common import (
    JsonOption,
    database_sessions,
    emit,
    resolve_tenant_id,
    settings,
    step,
)

REFUSED = 3
"""The exit status of a candidate the gate refused: not an error, not a pass."""


def evaluate(
    domain: str = typer.Option(..., "--domain", help="The domain."),
    model_version: str = typer.Option(
        None, "--model-version", help="A registered version (default: the newest)."
    ),
    k: int = typer.Option(4, "--k", min=1, help="Samples per task for pass@k."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1),
    tenant: str | None = typer.Option(None, "--tenant", help="The domain's tenant."),
    is_report_only: bool = typer.Option(
        False,
        "--report-only",
        help=f"Exit 0 when the gate refuses the candidate (default: exit {REFUSED}).",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Evaluate and gate; `flywheel models promote` then accepts a version that passed. Exits
    3 when the gate refuses the candidate, unless --report-only."""
    from flywheel.db import unit_of_work
    from flywheel.evaluation.service import EvalRequest, evaluate_version
    from flywheel.tenancy.service import get_domain

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            found = get_domain(session, resolve_tenant_id(session, tenant), domain)
        request = EvalRequest(found, model_version, k, max_new_tokens)
        with step(f"evaluating {domain} (pass@{k})", is_quiet=as_json):
            outcome = evaluate_version(sessions, request, settings())
    data = outcome.as_json()
    verdict = "passes the gate" if outcome.decision.is_promoted else "does not pass the gate"
    lines = [f"{domain} v{outcome.version} {verdict} against {outcome.against}"]
    lines += [f"  {name}: {value:.4f} (vs {outcome.against_summary.get(name, float('nan')):.4f})"
              for name, value in sorted(outcome.summary.items())]  # fmt: skip
    lines += [f"  slice {row['slice']} (n={row['n']}): {row['champion_mean']:.4f} -> "
              f"{row['challenger_mean']:.4f}" + ("  REGRESSED" if row["regressed"] else "")
              for row in data["slices"]]  # fmt: skip
    lines += [f"  - {reason}" for reason in outcome.decision.reasons]
    emit(data, as_json=as_json, text="\n".join(lines))
    if not outcome.decision.is_promoted and not is_report_only:
        raise typer.Exit(REFUSED)
