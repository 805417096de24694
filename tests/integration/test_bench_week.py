"""`python -m bench.week` at a tiny size: it runs every week through the public services and
prints (and writes as JSON) well-formed numbers. No timing is asserted: only that each number is
there, of the right kind, and the counts follow from the sizes asked for."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import week

ROOT = Path(__file__).resolve().parents[2]
WEEK_ROW = re.compile(
    r"^\s*(\d+)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)"
    r"\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+v(\d+)( \(unchanged\))?$"
)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    numbers = tmp_path_factory.mktemp("week") / "week.json"
    command = [sys.executable, "-m", "bench.week", "--items", "2000", "--weeks", "2"]
    command += ["--copy-rounds", "1", "--json", str(numbers)]
    finished = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    return finished.stdout, json.loads(numbers.read_text())


@pytest.mark.postgres_only
def test_the_week_table_has_a_well_formed_row_per_week(ran: tuple[str, dict[str, Any]]) -> None:
    stdout, _ = ran
    rows = [match for line in stdout.splitlines() if (match := WEEK_ROW.match(line))]
    assert [int(row[1]) for row in rows] == [0, 1, 2]
    assert [row[3] for row in rows] == ["2,000", "20", "20"]  # +1% of the items each week
    assert [int(row[12]) for row in rows] == [1, 2, 3]  # each week's new items: a new version
    assert rows[0][6] == "1.000"  # week 0 is the full build itself
    for line in (
        "ratio full build / COPY items: ",
        "ratio full compile / (COPY events + write floor): ",
        "week 1: build / full build ",
        "week 2: build / full build ",
        "export peak RSS by week (MB): ",
    ):
        assert line in stdout


@pytest.mark.postgres_only
def test_the_json_holds_every_week_with_its_rows_written(ran: tuple[str, dict[str, Any]]) -> None:
    _, numbers = ran
    weeks = numbers["weeks"]
    assert [each["number"] for each in weeks] == [0, 1, 2]
    assert weeks[0]["new_events"] == 2000
    assert weeks[0]["compile_counts"]["events_read"] == 2000
    assert weeks[0]["write_floor_s"] > 0
    assert [each["write_floor_s"] for each in weeks[1:]] == [None, None]
    for each in weeks:
        for key in ("compile_s", "build_s", "export_s", "copy_items_s", "copy_events_s"):
            assert each[key] > 0, key
        assert each["export_peak_mb"] > 10  # a Python process, sampled while it ran
        assert each["exported_rows"] > 0
        assert each["is_new_version"] is True
        build, compiled = each["rows"]["build"], each["rows"]["compile"]
        assert build["dataset_versions"]["inserted"] == 1
        assert build["dataset_members"]["inserted"] > 0
        assert compiled["ingest_runs"]["inserted"] == 1
        assert set(compiled["preference_pairs"]) == {"inserted", "updated", "deleted"}
    # the late ratings change weights of items compiled before: updates, not inserts
    assert weeks[1]["rows"]["compile"]["preference_pairs"]["updated"] > 0
    ratios = numbers["ratios"]
    assert ratios["full_build_over_copy"] > 0
    assert ratios["full_compile_over_export_plus_floor"] > 0
    assert len(ratios["build_over_full_build"]) == len(ratios["compile_over_full_compile"]) == 2


@pytest.mark.no_database
def test_tick_runs_the_scheduler_bench(capsys: pytest.CaptureFixture[str]) -> None:
    week.run_tick("--sizes 3 --sqlite")
    out = capsys.readouterr().out
    assert out.startswith("tick: python -m bench.scheduler_tick --sizes 3 --sqlite\n"), out
    assert "exited with" not in out, out


@pytest.mark.no_database
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--growth", "0"], "--growth must be in (0, 1]"),
        (["--items", "0"], "--items and --events must be >= 1"),
    ],
)
def test_bad_options_exit_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        week.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
