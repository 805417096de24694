"""A `DomainReport` as one HTML document: inline CSS, inline SVG, no script, nothing fetched."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape

from flywheel.reporting.charts import bar_chart, line_chart
from flywheel.reporting.records import (
    DatasetRow,
    DomainReport,
    EvalRow,
    EventRow,
    RunRow,
    SliceRow,
)

UNAVAILABLE = "metrics unavailable"

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem;
     border-bottom: 1px solid #ddd; padding-bottom: .3rem; }
h3 { font-size: 1rem; margin-bottom: .4rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .85rem; }
th, td { border: 1px solid #ddd; padding: .3rem .55rem; text-align: left;
         vertical-align: top; }
th { background: #f4f4f4; }
.muted { color: #777; } .bad { color: #b00020; } .good { color: #1b7f3b; }
.badge { display: inline-block; padding: 0 .4rem; border-radius: .6rem; font-size: .75rem;
         background: #eee; margin-left: .3rem; }
.summary td:first-child { font-weight: 600; }
svg.chart { display: block; margin: .5rem 0 1rem; max-width: 100%; height: auto; }
"""


def render_html(report: DomainReport) -> str:
    """The whole document."""
    title = f"Flywheel report: {report.tenant}/{report.domain}"
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="muted">Generated {_time(report.generated_at)}</p>',
        _summary(report),
        _datasets(report.datasets),
        _runs(report.runs),
        _cycles(report.runs),
        _curves(report.runs),
        _evaluations(report.evaluations, report.champion),
        _events(report.events),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _summary(report: DomainReport) -> str:
    champion = (
        f"v{escape(report.champion)} (promoted {_time(report.champion_since)})"
        if report.champion
        else '<span class="muted">none yet</span>'
    )
    rows = [
        ("Domain", escape(report.domain)),
        ("Registered model", escape(report.registered_model)),
        ("Champion", champion),
        ("Dataset versions", str(len(report.datasets))),
        ("Training runs", str(len(report.runs))),
        ("Model versions", str(len(report.evaluations))),
        ("Promotion events", str(len(report.events))),
    ]
    cells = "".join(f"<tr><td>{name}</td><td>{value}</td></tr>" for name, value in rows)
    return f'<h2>Summary</h2><table id="summary" class="summary"><tbody>{cells}</tbody></table>'


def _datasets(rows: Sequence[DatasetRow]) -> str:
    if not rows:
        return '<h2>Dataset versions</h2><p class="muted">No dataset versions yet.</p>'
    body = [
        [
            f"v{row.version}",
            _time(row.created_at),
            _kinds(row.train),
            str(sum(row.train.values())),
            _kinds(row.eval),
            str(sum(row.eval.values())),
            '<span class="bad">tainted</span>' if row.is_tainted else "no",
        ]
        for row in rows
    ]
    head = ["Version", "Created", "Train by kind", "Train", "Eval by kind", "Eval", "Tainted"]
    return "<h2>Dataset versions</h2>" + _table(head, body, "datasets")


def _runs(rows: Sequence[RunRow]) -> str:
    if not rows:
        return '<h2>Training runs</h2><p class="muted">No training runs yet.</p>'
    body = [
        [
            f'<span title="{escape(row.id)}">{escape(row.id[:8])}</span>',
            escape(row.method),
            _status(row.status),
            f"v{row.dataset_version}" if row.dataset_version is not None else "—",
            f"v{escape(row.model_version)}" if row.model_version else "—",
            _time(row.started_at),
            _time(row.finished_at),
            _duration(row.duration_s),
            _run_metrics(row),
            f'<span class="bad">{escape(row.error)}</span>' if row.error else "",
        ]
        for row in rows
    ]
    head = ["Run", "Method", "Status", "Dataset", "Model", "Started", "Finished", "Duration",
            "Last metrics", "Error"]  # fmt: skip
    return "<h2>Training runs</h2>" + _table(head, body, "runs")


def _run_metrics(row: RunRow) -> str:
    if row.metrics_error is not None:
        return f'<span class="bad" title="{escape(row.metrics_error)}">{UNAVAILABLE}</span>'
    if row.metrics is None:
        return '<span class="muted">—</span>'
    latest = row.metrics.latest
    return ", ".join(f"{escape(key)} {_value(value)}" for key, value in latest.items()) or "—"


def _cycles(rows: Sequence[RunRow]) -> str:
    cycles = [row for row in rows if row.method == "cycle"]
    if not cycles:
        return ""
    parts = ["<h2>Cycles</h2>"]
    for row in cycles:
        parts.append(
            f"<h3>Cycle {escape(row.id[:8])} — {_status(row.status)}, "
            f"started {_time(row.started_at)}</h3>"
        )
        if not row.steps:
            parts.append('<p class="muted">No steps recorded.</p>')
            continue
        body = [
            [
                escape(step.name),
                _status(step.status),
                _iso_time(step.started_at),
                _iso_time(step.finished_at),
                _duration(step.duration_s),
            ]
            for step in row.steps
        ]
        head = ["Step", "Status", "Started", "Finished", "Duration"]
        parts.append(_table(head, body, f"steps-{row.id[:8]}"))
    return "".join(parts)


def _curves(rows: Sequence[RunRow]) -> str:
    parts = ["<h2>Training curves</h2>"]
    losses = _series(rows, "loss", methods=None)
    parts.append(
        line_chart(losses, title="Training loss", x_label="step", y_label="loss")
        if losses
        else '<p class="muted">No loss logged by any run.</p>'
    )
    rewards = _series(rows, "reward", methods={"grpo"})
    if rewards:
        parts.append(
            line_chart(rewards, title="GRPO reward", x_label="step", y_label="mean reward")
        )
    missing = [row for row in rows if row.metrics_error is not None]
    if missing:
        items = "".join(
            f"<li>{escape(row.label)} (MLflow run {escape(row.mlflow_run_id or '')}): "
            f'{UNAVAILABLE} — <span class="muted">{escape(row.metrics_error or "")}</span></li>'
            for row in missing
        )
        parts.append(f'<ul class="unavailable">{items}</ul>')
    return "".join(parts)


def _series(
    rows: Sequence[RunRow], key: str, *, methods: set[str] | None
) -> dict[str, list[tuple[float, float]]]:
    """Each run's history of `key`, labelled by method and version (unique labels)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.metrics is None or (methods is not None and row.method not in methods):
            continue
        points = row.metrics.histories.get(key)
        if points:
            label, n = row.label, 2
            while label in series:
                label, n = f"{row.label} ({n})", n + 1
            series[label] = points
    return series


def _evaluations(rows: Sequence[EvalRow], champion: str | None) -> str:
    evaluated = [row for row in rows if row.is_evaluated]
    if not evaluated:
        return '<h2>Held-out evaluation</h2><p class="muted">No model version evaluated yet.</p>'
    scores = _metric_names(evaluated, losses=False)
    losses = _metric_names(evaluated, losses=True)
    parts = ["<h2>Held-out evaluation</h2>"]
    if scores:
        parts.append(
            bar_chart(_bars(evaluated, scores), title="Held-out metrics", y_label="mean score")
        )
    if losses:
        parts.append(
            bar_chart(_bars(evaluated, losses), title="Held-out loss", y_label="mean loss")
        )
    parts.append(_base_note(evaluated))
    parts.append(_evaluation_table(rows, [*scores, *losses], champion))
    parts += [_slice_table(row) for row in evaluated if row.slices]
    return "".join(parts)


def _slice_table(row: EvalRow) -> str:
    """The gate's slices for one version: the primary metric before (its rival) and after."""
    against = escape(row.against or "—")
    rival = against if against in ("base", "—") else f"v{against}"
    metric = escape(row.primary_metric or "primary metric")
    title = f"<h3>Slices of v{escape(row.version)} against {rival} ({metric}): before / after</h3>"
    body = [_slice_cells(entry) for entry in row.slices]
    head = ["Slice", "n", "Before", "After", "Change", "Tolerance", "Judged", "Regressed"]
    return title + _table(head, body, f"slices-v{escape(row.version)}")


def _slice_cells(entry: SliceRow) -> list[str]:
    before, after = entry.champion_mean, entry.challenger_mean
    change = f"{after - before:+.4f}" if before is not None and after is not None else "—"
    regressed = '<span class="bad">regressed</span>' if entry.is_regressed else "no"
    return [
        escape(entry.label),
        str(entry.n),
        "—" if before is None else _value(before),
        "—" if after is None else _value(after),
        change,
        "—" if entry.tolerance is None else f"{entry.tolerance:.4f}",
        "yes" if entry.is_judged else '<span class="muted">no (too few)</span>',
        regressed,
    ]


def _base_note(rows: Sequence[EvalRow]) -> str:
    base = next((row for row in reversed(rows) if row.against == "base"), None)
    source = (
        f"the base model as scored in v{escape(base.version)}'s evaluation"
        + (f" (dataset v{base.dataset_version})" if base.dataset_version is not None else "")
        if base
        else "no version was compared with the base model"
    )
    return (
        f'<p class="muted">Bars: {source}; each version as scored in its own evaluation. '
        "Table: each version against what its gate compared it with.</p>"
    )


def _metric_names(rows: Sequence[EvalRow], *, losses: bool) -> list[str]:
    """Metric names across versions, primary metrics first."""
    names: dict[str, None] = {}
    for row in rows:
        if row.primary_metric and (row.primary_metric in row.loss_names) == losses:
            names.setdefault(row.primary_metric)
    for row in rows:
        for name in sorted(row.summary):
            if (name in row.loss_names) == losses:
                names.setdefault(name)
    return list(names)


def _bars(rows: Sequence[EvalRow], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """metric -> {"base": ..., "v1": ..., ...}: the base as scored in the latest evaluation
    against it, each version as scored in its own evaluation."""
    base = next((row for row in reversed(rows) if row.against == "base"), None)
    groups: dict[str, dict[str, float]] = {}
    for name in names:
        bars: dict[str, float] = {}
        if base is not None and name in base.against_summary:
            bars["base"] = base.against_summary[name]
        for row in rows:
            if name in row.summary:
                bars[f"v{row.version}"] = row.summary[name]
        groups[name] = bars
    return groups


def _evaluation_table(rows: Sequence[EvalRow], names: Sequence[str], champion: str | None) -> str:
    body = []
    for row in rows:
        badges = _badge("champion") if row.version == champion else ""
        badges += _badge("tainted") if row.is_tainted else ""
        against = escape(row.against or "—")
        body.append(
            [
                f"v{escape(row.version)}{badges}",
                against if against in ("base", "—") else f"v{against}",
                f"v{row.dataset_version}" if row.dataset_version is not None else "—",
                *(_comparison(row, name) for name in names),
                _gate(row.is_promoted),
                "<br>".join(escape(reason) for reason in row.reasons),
            ]
        )
    head = ["Version", "Against", "Dataset", *(escape(name) for name in names), "Gate", "Reasons"]
    return _table(head, body, "evaluations", escaped_head=True)


def _comparison(row: EvalRow, name: str) -> str:
    ours, theirs = row.summary.get(name), row.against_summary.get(name)
    if ours is None:
        return "—"
    if theirs is None:
        return _value(ours)
    return f"{_value(ours)} vs {_value(theirs)} ({ours - theirs:+.4f})"


def _gate(is_promoted: bool | None) -> str:
    if is_promoted is None:
        return '<span class="muted">not gated</span>'
    return '<span class="good">passed</span>' if is_promoted else '<span class="bad">failed</span>'


def _events(rows: Sequence[EventRow]) -> str:
    if not rows:
        return '<h2>Promotion events</h2><p class="muted">No promotions yet.</p>'
    body = [
        [
            _time(row.at),
            escape(row.action) + ("" if row.alias == "champion" else _badge(row.alias)),
            f"{_version(row.from_version)} → {_version(row.to_version)}",
            escape(row.actor),
            '<span class="bad">forced</span>' if row.is_forced else "no",
            escape(row.reason),
        ]
        for row in rows
    ]
    head = ["Time", "Action", "From → To", "Actor", "Forced", "Reason"]
    return "<h2>Promotion events</h2>" + _table(head, body, "events")


def _table(
    head: Sequence[str], body: Iterable[Sequence[str]], name: str, *, escaped_head: bool = False
) -> str:
    """Cells are HTML already; header names are escaped here unless `escaped_head`."""
    header = "".join(f"<th>{cell if escaped_head else escape(cell)}</th>" for cell in head)
    rows = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in body)
    return f'<table id="{name}"><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>'


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{escape(kind)} {n}" for kind, n in sorted(counts.items())) or "—"


def _status(status: str) -> str:
    style = {"succeeded": "good", "failed": "bad", "cancelled": "bad"}.get(status, "muted")
    return f'<span class="{style}">{escape(status)}</span>'


def _badge(text: str) -> str:
    return f'<span class="badge">{escape(text)}</span>'


def _version(version: str | None) -> str:
    return f"v{escape(version)}" if version is not None else "none"


def _time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if value is not None else "—"


def _iso_time(text: str | None) -> str:
    """A step's ISO timestamp like every other time in the report (as given if not ISO)."""
    if text is None:
        return "—"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return escape(text)
    return _time(moment.astimezone(UTC) if moment.tzinfo else moment)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _value(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.0f}"
