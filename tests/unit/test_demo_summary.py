"""The demo's summary of its cycles says why a cycle's candidate was not promoted."""

from __future__ import annotations

import io

from rich.console import Console

from flywheel.demo.summary import cycle_rows, print_summary

REASON = "exact_match: +0.010 is not significant (p=0.41, needs < 0.05)"


def _refused() -> dict[str, object]:
    gate = {
        "version": 1,
        "against": "base",
        "is_promotable": False,
        "reasons": [REASON],
        "summary": {"exact_match": 0.36},
        "against_summary": {"exact_match": 0.35},
        "slices": [],
    }
    steps = {
        "evaluate": {"result": gate, "duration_s": 2.0},
        "promote": {"result": {"promoted": False, "version": 1, "reasons": [REASON]}},
    }
    return {"status": "succeeded", "steps": steps}


def test_a_refused_cycle_says_why_in_the_rows_and_the_printed_table() -> None:
    (row,) = cycle_rows([_refused()])
    assert (row["gate"], row["promoted"], row["reasons"]) == ("failed", False, [REASON])

    out = io.StringIO()
    print_summary(Console(file=out, width=200), {}, [_refused()], [])

    assert f"cycle 1 not promoted: {REASON}" in out.getvalue()
