"""Small SVG charts as strings: no JavaScript, no plotting library, nothing fetched.

    line_chart({"sft v1": [(1, 2.3), (2, 1.9)]}, title="Loss", x_label="step", y_label="loss")
    bar_chart({"pass@1": {"base": 0.41, "v1": 0.47}}, title="Held-out", y_label="mean")

Every text is escaped; empty series, a single point and constant values draw a readable chart
(an empty one says "no data") instead of dividing by zero. Non-finite values are left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
"""Tableau 10: distinct on screen and in print; repeats after ten series."""

LEGEND_WIDTH = 150
LEGEND_CHARS = 22
VALUE_LABEL_MIN_WIDTH = 28
"""Bars at least this wide carry their value above them (non-negative ones)."""
MARKER_LIMIT = 40
"""A series with at most this many points gets a marker on each."""


@dataclass(frozen=True)
class _Frame:
    """The plot area inside the SVG, and the data range it maps."""

    left: float
    top: float
    right: float
    bottom: float
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def x(self, value: float) -> float:
        low, high = self.x_range
        return self.left + (value - low) / (high - low) * (self.right - self.left)

    def y(self, value: float) -> float:
        low, high = self.y_range
        return self.bottom - (value - low) / (high - low) * (self.bottom - self.top)


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 640,
    height: int = 320,
) -> str:
    """One line per series (points sorted by x), with axes, ticks and a legend."""
    clean = {label: _finite_points(points) for label, points in series.items()}
    xs = [x for points in clean.values() for x, _ in points]
    ys = [y for points in clean.values() for _, y in points]
    if not xs:
        return _empty(title, width, height)
    frame = _frame(width, height, _nice_range(xs), _nice_range(ys))
    parts = [_axes(frame, x_label, y_label)]
    for index, (label, points) in enumerate(clean.items()):
        parts.append(_line(frame, label, points, colour(index)))
    parts.append(_legend(list(clean), frame))
    return _svg(title, width, height, parts)


def bar_chart(
    groups: Mapping[str, Mapping[str, float]],
    *,
    title: str,
    y_label: str,
    width: int = 640,
    height: int = 320,
) -> str:
    """Grouped bars: one group per key of `groups` (e.g. a metric), one bar per series in it
    (e.g. "base", "v1", "v2"), the same colour for a series in every group."""
    labels = list(dict.fromkeys(label for bars in groups.values() for label in bars))
    values = [value for bars in groups.values() for value in bars.values() if math.isfinite(value)]
    if not values:
        return _empty(title, width, height)
    y_range = _nice_range([0.0, *values])
    frame = _frame(width, height, (0.0, float(len(groups))), y_range)
    parts = [_axes(frame, "", y_label, x_ticks=False)]
    slot = (frame.right - frame.left) / len(groups)
    bar_width = slot * 0.8 / max(1, len(labels))
    for position, (group, bars) in enumerate(groups.items()):
        start = frame.left + slot * position + slot * 0.1
        for index, label in enumerate(labels):
            value = bars.get(label)
            if value is not None and math.isfinite(value):
                parts.append(
                    _bar(frame, start + index * bar_width, bar_width, value, label, colour(index))
                )
        parts.append(_text(start + slot * 0.4, frame.bottom + 18, group, anchor="middle", size=11))
    parts.append(_legend(labels, frame))
    return _svg(title, width, height, parts)


def _finite_points(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    kept = [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    return sorted(kept)


def _nice_range(values: Sequence[float]) -> tuple[float, float]:
    """A range covering `values` whose ends are round ticks; never empty."""
    low, high = min(values), max(values)
    if low == high:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = _tick_step(low, high)
    return math.floor(low / step) * step, math.ceil(high / step) * step


def _tick_step(low: float, high: float, target: int = 5) -> float:
    raw = (high - low) / target
    magnitude: float = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _ticks(low: float, high: float) -> list[float]:
    step = _tick_step(low, high)
    first = math.ceil(low / step - 1e-9)
    count = math.floor(high / step + 1e-9) - first + 1
    return [round((first + i) * step, 12) for i in range(max(0, count))]


def _frame(
    width: int, height: int, x_range: tuple[float, float], y_range: tuple[float, float]
) -> _Frame:
    return _Frame(
        left=64,
        top=36,
        right=max(65, width - LEGEND_WIDTH - 16),
        bottom=max(37, height - 44),
        x_range=x_range,
        y_range=y_range,
    )


def _axes(frame: _Frame, x_label: str, y_label: str, *, x_ticks: bool = True) -> str:
    parts = [
        f'<line x1="{frame.left}" y1="{frame.bottom}" x2="{frame.right}" y2="{frame.bottom}" '
        'stroke="#333"/>',
        f'<line x1="{frame.left}" y1="{frame.top}" x2="{frame.left}" y2="{frame.bottom}" '
        'stroke="#333"/>',
    ]
    for value in _ticks(*frame.y_range):
        y = _num(frame.y(value))
        parts.append(
            f'<line x1="{frame.left}" y1="{y}" x2="{frame.right}" y2="{y}" stroke="#e5e5e5"/>'
        )
        parts.append(_text(frame.left - 6, frame.y(value) + 4, _label(value), anchor="end"))
    if x_ticks:
        for value in _ticks(*frame.x_range):
            parts.append(_text(frame.x(value), frame.bottom + 16, _label(value), anchor="middle"))
    middle_x = (frame.left + frame.right) / 2
    parts.append(_text(middle_x, frame.bottom + 36, x_label, anchor="middle"))
    middle_y = _num((frame.top + frame.bottom) / 2)
    parts.append(
        f'<text x="16" y="{middle_y}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 16 {middle_y})">{escape(y_label)}</text>'
    )
    return "".join(parts)


def _line(frame: _Frame, label: str, points: list[tuple[float, float]], stroke: str) -> str:
    coordinates = " ".join(f"{_num(frame.x(x))},{_num(frame.y(y))}" for x, y in points)
    parts = [f'<g class="series" data-label="{escape(label)}"><title>{escape(label)}</title>']
    if len(points) > 1:
        parts.append(
            f'<polyline fill="none" stroke="{stroke}" stroke-width="2" points="{coordinates}"/>'
        )
    if len(points) <= MARKER_LIMIT:
        parts += [
            f'<circle cx="{_num(frame.x(x))}" cy="{_num(frame.y(y))}" r="3" fill="{stroke}"/>'
            for x, y in points
        ]
    parts.append("</g>")
    return "".join(parts)


def _bar(frame: _Frame, x: float, width: float, value: float, label: str, fill: str) -> str:
    zero = frame.y(max(frame.y_range[0], min(frame.y_range[1], 0.0)))
    top = frame.y(value)
    y, height = min(zero, top), abs(zero - top)
    rect = (
        f'<rect class="bar" data-label="{escape(label)}" x="{_num(x)}" y="{_num(y)}" '
        f'width="{_num(width)}" height="{_num(height)}" fill="{fill}">'
        f"<title>{escape(label)}: {_label(value)}</title></rect>"
    )
    if width < VALUE_LABEL_MIN_WIDTH or value < 0:  # a label below would hit the axis labels
        return rect
    return rect + _text(x + width / 2, y - 4, _label(value), anchor="middle", size=10)


def _legend(labels: list[str], frame: _Frame) -> str:
    parts = ['<g class="legend">']
    for index, label in enumerate(labels):
        y = frame.top + index * 18
        shown = label if len(label) <= LEGEND_CHARS else label[: LEGEND_CHARS - 1] + "…"
        parts.append(
            f'<rect x="{_num(frame.right + 16)}" y="{_num(y)}" width="12" height="12" '
            f'fill="{colour(index)}"/>'
        )
        parts.append(_text(frame.right + 34, y + 10, shown, anchor="start", full=label))
    parts.append("</g>")
    return "".join(parts)


def _empty(title: str, width: int, height: int) -> str:
    return _svg(title, width, height, [_text(width / 2, height / 2, "no data", anchor="middle")])


def _svg(title: str, width: int, height: int, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}" font-family="sans-serif">'
        f"<title>{escape(title)}</title>"
        + _text(width / 2, 20, title, anchor="middle", size=14)
        + "".join(parts)
        + "</svg>"
    )


def _text(
    x: float, y: float, text: str, *, anchor: str, size: int = 11, full: str | None = None
) -> str:
    hover = f"<title>{escape(full)}</title>" if full is not None and full != text else ""
    return (
        f'<text x="{_num(x)}" y="{_num(y)}" font-size="{size}" text-anchor="{anchor}">'
        f"{hover}{escape(text)}</text>"
    )


def _label(value: float) -> str:
    return f"{value:.4g}"


def _num(value: float) -> str:
    """A coordinate, short."""
    return f"{value:.1f}"
