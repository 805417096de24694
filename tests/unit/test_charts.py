"""The report's SVG charts: well-formed, labelled, escaped, and sane on degenerate data."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from flywheel.reporting.charts import PALETTE, bar_chart, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    """The chart as XML: it must be well-formed on its own."""
    return ET.fromstring(svg)


def numbers(root: ET.Element, attribute: str) -> list[float]:
    found = []
    for element in root.iter():
        value = element.get(attribute)
        if value is not None:
            found += [float(part) for part in re.split(r"[ ,]+", value.strip()) if part]
    return found


def texts(root: ET.Element) -> list[str]:
    return ["".join(element.itertext()) for element in root.iter(f"{SVG}text")]


def test_line_chart_draws_one_labelled_line_per_series_in_distinct_colours() -> None:
    svg = line_chart(
        {"sft v1": [(1, 2.0), (2, 1.5), (3, 1.0)], "dpo v2": [(1, 0.7), (3, 0.6)]},
        title="Training loss",
        x_label="step",
        y_label="loss",
    )
    root = parse(svg)
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "series"]
    assert [g.get("data-label") for g in groups] == ["sft v1", "dpo v2"]
    strokes = [g.find(f"{SVG}polyline").get("stroke") for g in groups]  # type: ignore[union-attr]
    assert strokes == [PALETTE[0], PALETTE[1]]
    first = groups[0].find(f"{SVG}polyline")
    assert first is not None
    assert len(first.get("points", "").split()) == 3
    labels = texts(root)
    assert {"Training loss", "step", "loss", "sft v1", "dpo v2"} <= set(labels)
    assert any(label in labels for label in ("1", "2", "3"))  # x ticks
    # SVG's y grows downwards: a falling loss is drawn with growing y coordinates.
    ys = [float(point.split(",")[1]) for point in first.get("points", "").split()]
    assert ys[0] < ys[1] < ys[2]


def test_points_are_drawn_in_step_order_and_non_finite_values_are_dropped() -> None:
    svg = line_chart(
        {"run": [(3, 1.0), (1, 3.0), (2, math.nan), (4, math.inf), (2, 2.0)]},
        title="t",
        x_label="x",
        y_label="y",
    )
    polyline = parse(svg).find(f".//{SVG}polyline")
    assert polyline is not None
    xs = [float(point.split(",")[0]) for point in polyline.get("points", "").split()]
    assert len(xs) == 3
    assert xs == sorted(xs)
    assert "nan" not in svg.lower()
    assert "inf" not in svg.lower()


def test_empty_series_say_no_data() -> None:
    for series in ({}, {"run": []}, {"run": [(math.nan, 1.0)]}):
        root = parse(line_chart(series, title="Loss", x_label="step", y_label="loss"))
        assert "no data" in texts(root)
        assert root.find(f".//{SVG}polyline") is None
    root = parse(bar_chart({}, title="Held-out", y_label="mean"))
    assert "no data" in texts(root)
    assert parse(bar_chart({"pass@1": {}}, title="h", y_label="m")).find(f".//{SVG}rect") is None


def test_a_single_point_is_a_marker_inside_the_plot() -> None:
    root = parse(line_chart({"only": [(5, 0.25)]}, title="t", x_label="x", y_label="y"))
    assert root.find(f".//{SVG}polyline") is None
    circles = list(root.iter(f"{SVG}circle"))
    assert len(circles) == 1
    cx, cy = float(circles[0].get("cx", "nan")), float(circles[0].get("cy", "nan"))
    assert 0 < cx < 640
    assert 0 < cy < 320
    assert all(math.isfinite(value) for value in numbers(root, "y"))


def test_constant_values_do_not_divide_by_zero() -> None:
    for constant in (0.0, 3.0, -2.0):
        svg = line_chart(
            {"flat": [(1, constant), (2, constant), (3, constant)]},
            title="t",
            x_label="x",
            y_label="y",
        )
        root = parse(svg)
        polyline = root.find(f".//{SVG}polyline")
        assert polyline is not None
        ys = {point.split(",")[1] for point in polyline.get("points", "").split()}
        assert len(ys) == 1  # a horizontal line
        assert 36 <= float(ys.pop()) <= 276  # inside the plot area
        assert "nan" not in svg.lower()
    same_x = parse(line_chart({"s": [(2, 1.0), (2, 3.0)]}, title="t", x_label="x", y_label="y"))
    assert all(math.isfinite(value) for value in numbers(same_x, "cx"))
    zeros = parse(bar_chart({"m": {"base": 0.0, "v1": 0.0}}, title="t", y_label="y"))
    assert all(math.isfinite(value) for value in numbers(zeros, "height"))


def test_text_is_escaped_everywhere() -> None:
    evil = "<script>alert('x')</script>"
    svg = line_chart({evil: [(1, 1.0), (2, 2.0)]}, title=evil, x_label=evil, y_label=evil)
    bars = bar_chart({evil: {evil: 0.5}}, title=evil, y_label=evil)
    for chart in (svg, bars):
        assert "<script>" not in chart
        assert "&lt;script&gt;" in chart
        root = parse(chart)  # still well-formed
        assert evil in texts(root)  # reads back as the original text


def test_bar_chart_groups_bars_by_metric_with_one_colour_per_version() -> None:
    svg = bar_chart(
        {
            "pass@1": {"base": 0.2, "v1": 0.4, "v2": 0.5},
            "exact_match": {"base": 0.1, "v2": 0.3},
        },
        title="Held-out metrics",
        y_label="mean score",
    )
    root = parse(svg)
    bars = [rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "bar"]
    assert [bar.get("data-label") for bar in bars] == ["base", "v1", "v2", "base", "v2"]
    colours = {bar.get("data-label"): bar.get("fill") for bar in bars}
    assert colours == {"base": PALETTE[0], "v1": PALETTE[1], "v2": PALETTE[2]}
    heights = {bar.get("data-label"): float(bar.get("height", "0")) for bar in bars[:3]}
    assert heights["base"] < heights["v1"] < heights["v2"]
    assert heights["v2"] == 2.5 * heights["base"]
    labels = texts(root)
    assert {"pass@1", "exact_match", "base", "v1", "v2", "Held-out metrics"} <= set(labels)


def test_negative_bars_hang_below_the_zero_line() -> None:
    root = parse(bar_chart({"delta": {"v1": -0.5, "v2": 0.5}}, title="t", y_label="y"))
    down, up = (rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "bar")
    assert float(down.get("y", "0")) == float(up.get("y", "0")) + float(up.get("height", "0"))
    assert float(down.get("height", "0")) == float(up.get("height", "0"))


def test_long_legend_labels_are_shortened_but_kept_whole_on_hover() -> None:
    label = "grpo " + "x" * 40
    root = parse(line_chart({label: [(1, 1.0), (2, 2.0)]}, title="t", x_label="x", y_label="y"))
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    hover = legend.find(f"{SVG}text/{SVG}title")
    assert hover is not None
    assert hover.text == label  # whole on hover
    assert hover.tail == label[:21] + "…"  # shortened on the page
