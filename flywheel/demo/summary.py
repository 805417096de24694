"""The demo's closing table: what went in, what it became, and what the cycles did."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from flywheel.datasets.models import DatasetVersion
from flywheel.feedback.models import FeedbackEvent, Interaction
from flywheel.registry.service import current_champion
from flywheel.signals.models import LabeledCompletion, PreferencePair, SftExample, VerifiableTask
from flywheel.tenancy.models import Domain

COUNTED: dict[str, Any] = {
    "interactions": Interaction,
    "feedback events": FeedbackEvent,
    "SFT examples": SftExample,
    "preference pairs": PreferencePair,
    "labels": LabeledCompletion,
    "tasks": VerifiableTask,
    "dataset versions": DatasetVersion,
}


def domain_counts(session: Session) -> dict[str, dict[str, Any]]:
    """Per domain: rows of each kind, verified tasks, and the champion."""
    counts: dict[str, dict[str, Any]] = {}
    for domain in session.scalars(select(Domain).order_by(Domain.name)):
        row: dict[str, Any] = {}
        for label, model in COUNTED.items():
            query = select(func.count()).select_from(model).where(model.domain_id == domain.id)
            row[label] = session.scalar(query) or 0
        row["verified tasks"] = session.scalar(
            select(func.count())
            .select_from(VerifiableTask)
            .where(VerifiableTask.domain_id == domain.id)
            .where(VerifiableTask.verifier_status == "usable")
        )
        champion = current_champion(session, domain.id)
        row["champion"] = f"v{champion.version}" if champion else "-"
        counts[domain.name] = row
    return counts


def live_by_version(session: Session, domain: str) -> dict[str, dict[str, Any]]:
    """Per version that answered the domain's traffic ("base" before a champion): the
    interactions that got feedback, and the share of them rated thumbs up (a correction or a
    thumbs down counts against)."""
    thumbs_up = case(
        ((FeedbackEvent.kind == "rating") & (FeedbackEvent.value["thumbs"].as_string() == "up"), 1),
        else_=0,
    )
    rated = (
        select(
            Interaction.model_version,
            Interaction.id,
            func.max(thumbs_up).label("up"),
            func.max(case((FeedbackEvent.kind == "correction", 1), else_=0)).label("corrected"),
        )
        .join(FeedbackEvent, FeedbackEvent.interaction_id == Interaction.id)
        .join(Domain, Domain.id == Interaction.domain_id)
        .where(Domain.name == domain)
        .group_by(Interaction.model_version, Interaction.id)
        .subquery()
    )
    judged_up = case(((rated.c.up == 1) & (rated.c.corrected == 0), 1), else_=0)
    rows = session.execute(
        select(rated.c.model_version, func.count(), func.sum(judged_up)).group_by(
            rated.c.model_version
        )
    )
    return {
        (f"v{version}" if version else "base"): {
            "rated": count,
            "thumbs_up_rate": round(int(up or 0) / count, 3) if count else None,
        }
        for version, count, up in rows
    }


def version_rows(
    cycles: list[dict[str, Any]], live: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each version the cycles measured (the base included): its held-out primary metric
    (its last measurement) next to its live thumbs-up rate."""
    held_out: dict[str, float | None] = {}
    for row in cycle_rows(cycles):
        held_out[_version(row["against"]) if row["against"] != "-" else "base"] = row["before"]
        if row["candidate"] != "-":
            held_out[row["candidate"]] = row["after"]
    names = list(dict.fromkeys([*held_out, *live]))
    return [
        {
            "version": name,
            "held_out": held_out.get(name),
            "live_rated": (live.get(name) or {}).get("rated", 0),
            "live_thumbs_up_rate": (live.get(name) or {}).get("thumbs_up_rate"),
        }
        for name in names
    ]


def cycle_rows(cycles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cycle: the dataset it trained on, the candidate, its held-out primary
    metric against its rival's, and the gate's decision."""
    rows = []
    for number, outcome in enumerate(cycles, start=1):
        steps = outcome.get("steps", {})
        built = (steps.get("build") or {}).get("result") or {}
        gate = (steps.get("evaluate") or {}).get("result") or {}
        promoted = (steps.get("promote") or {}).get("result") or {}
        metric, ours, theirs = _primary(gate)
        rows.append({
            "cycle": number,
            "status": outcome.get("status"),
            "dataset_version": built.get("dataset_version"),
            "candidate": f"v{gate.get('version')}" if gate else "-",
            "against": _version(gate.get("against")),
            "metric": metric,
            "before": theirs,
            "after": ours,
            "gate": "passed" if gate.get("is_promotable") else "failed" if gate else "-",
            "promoted": bool(promoted.get("promoted")),
            "reasons": promoted.get("reasons") or gate.get("reasons") or [],  # why not
            "slices": gate.get("slices", []),
            "seconds": sum(float(s.get("duration_s") or 0) for s in steps.values()),
        })  # fmt: skip
    return rows


def _primary(gate: dict[str, Any]) -> tuple[str, float | None, float | None]:
    summary, against = gate.get("summary") or {}, gate.get("against_summary") or {}
    for metric in ("pass@1", "exact_match", "preference_accuracy"):
        if metric in summary:
            return metric, summary.get(metric), against.get(metric)
    return "-", None, None


def print_summary(
    console: Console,
    counts: dict[str, dict[str, Any]],
    cycles: list[dict[str, Any]],
    versions: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> None:
    data = Table(title="Data and training signal, per domain")
    data.add_column("")
    for name in counts:
        data.add_column(name, justify="right")
    for label in [*COUNTED, "verified tasks", "champion"]:
        data.add_row(label, *(str(row[label]) for row in counts.values()))
    console.print(data)
    _print_cycles(console, cycles)
    slices = Table(title="Slices of each cycle's gate (before: the rival, after: the candidate)")
    for column in ("cycle", "slice", "items", "before", "after", "tolerance", "judged",
                   "regressed"):  # fmt: skip
        slices.add_column(column, justify="right")
    for number, row in ((c["cycle"], row) for c in cycle_rows(cycles) for row in c["slices"]):
        slices.add_row(
            str(number), row["slice"], str(row["n"]), _number(row["champion_mean"]),
            _number(row["challenger_mean"]), _number(row["tolerance"]),
            "yes" if row["judged"] else "no", "YES" if row["regressed"] else "no",
        )  # fmt: skip
    console.print(slices)
    live = Table(title="Each version: held-out metric and live thumbs-up through the gateway")
    for column in ("version", "held-out", "live rated", "live thumbs-up"):
        live.add_column(column, justify="right")
    for row in versions:
        live.add_row(
            row["version"], _number(row["held_out"]), str(row["live_rated"]),
            _number(row["live_thumbs_up_rate"]),
        )  # fmt: skip
    console.print(live)
    if tools:
        print_tool_rows(console, tools)


def _print_cycles(console: Console, cycles: list[dict[str, Any]]) -> None:
    """The arithmetic cycles' table, and why a cycle was not promoted."""
    turns = Table(title="Cycles of the arithmetic domain (held-out eval set)")
    for column in ("cycle", "dataset", "candidate", "against", "metric", "before", "after",
                   "gate", "promoted", "seconds"):  # fmt: skip
        turns.add_column(column, justify="right")
    for row in cycle_rows(cycles):
        turns.add_row(
            str(row["cycle"]), f"v{row['dataset_version']}", row["candidate"],
            str(row["against"]), row["metric"], _number(row["before"]), _number(row["after"]),
            row["gate"], "yes" if row["promoted"] else "no", f"{row['seconds']:.0f}",
        )  # fmt: skip
    console.print(turns)
    for row in cycle_rows(cycles):
        if row["reasons"] and not row["promoted"]:
            console.print(f"cycle {row['cycle']} not promoted: {'; '.join(row['reasons'])}")


def print_tool_rows(console: Console, tools: list[dict[str, Any]]) -> None:
    """The tool domain: held-out environment success of base, SFT and GRPO."""
    table = Table(title="The orders domain: held-out environment success (the tool call acted)")
    for column in ("stage", "version", "held-out success", "gate", "promoted"):
        table.add_column(column, justify="right")
    for row in tools:
        promoted = row.get("promoted")
        table.add_row(
            row["stage"], row["version"], _number(row["held_out_success"]), row.get("gate", "-"),
            "-" if promoted is None else "yes" if promoted else "no",
        )  # fmt: skip
    console.print(table)


def _version(name: object) -> str:
    if name is None:
        return "-"
    return f"v{name}" if str(name).isdigit() else str(name)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
