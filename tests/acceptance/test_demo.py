"""`flywheel demo --quick`, as a new user runs it: a fresh process, an empty directory, the
embedded default (nothing configured). It must end with a promoted adapter whose held-out
metric beats what it was measured against, live traffic through the gateway rated per version,
a tool domain whose promoted adapter cancels held-out orders the base never could, and a
report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_database  # its own embedded workspace: once, in the PostgreSQL pass


def test_the_quick_demo_promotes_an_adapter_that_learned(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    directory = tmp_path / "demo"

    result = subprocess.run(
        [sys.executable, "-m", "flywheel", "demo", "--quick", "--dir", str(directory), "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,  # a hang guard, not a time goal: ~10 min here, 14 on a loaded CI machine
        check=False,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout)
    cycles = summary["cycles"]
    assert [cycle["status"] for cycle in cycles] == ["succeeded", "succeeded"]
    promoted = [cycle for cycle in cycles if cycle["promoted"]]
    brief = [{key: cycle[key] for key in ("cycle", "gate", "before", "after", "reasons")}
             for cycle in cycles]  # fmt: skip
    assert promoted, brief
    assert cycles[0]["promoted"], brief  # the live round after it asks v1
    for cycle in promoted:  # the held-out metric moved, through the gate
        assert cycle["after"] > cycle["before"], cycle
    for cycle in cycles:  # every gate judged its slices and shows them before and after
        labels = {row["slice"] for row in cycle["slices"]}
        assert {"skill:carry", "skill:no-carry"} <= labels, cycle
        assert all(row["regressed"] is False for row in cycle["slices"] if cycle["promoted"])
    domains = summary["domains"]
    assert domains["arithmetic"]["champion"] == promoted[-1]["candidate"]
    assert domains["support"]["SFT examples"] > 0
    assert domains["support"]["preference pairs"] > 0
    assert domains["code"]["verified tasks"] > 0
    assert domains["arithmetic"]["dataset versions"] == 2
    # live traffic went through the gateway to the champion of its time, and was rated
    assert [round_["calls"] for round_ in summary["live"]] == [60, 60]
    served = [list(round_["versions"]) for round_ in summary["live"]]
    assert served == [["1"], [promoted[-1]["candidate"].removeprefix("v")]], served
    live = {row["version"]: row for row in summary["versions"]}
    for version in {version for round_ in served for version in round_}:
        rounds = sum(version in round_ for round_ in served)  # v1 twice when v2 was refused
        assert live[f"v{version}"]["live_rated"] == 60 * rounds, live
        assert 0 <= live[f"v{version}"]["live_thumbs_up_rate"] <= 1
    assert domains["arithmetic"]["interactions"] == 120
    # the tool domain: the base never cancels an order; what the cycle trained does, through
    # the gate (tests/finetune/test_demo_tools.py holds the calibrated learning thresholds)
    base, sft, grpo = summary["tools"]
    assert base["held_out_success"] == 0.0, summary["tools"]
    assert grpo["held_out_success"] >= 0.3, summary["tools"]
    assert sft["held_out_success"] is not None, summary["tools"]
    assert grpo["gate"] == "passed", summary["tools"]
    assert grpo["promoted"] is True, summary["tools"]
    assert domains["orders"]["champion"] == grpo["version"]
    report = Path(summary["report"]).read_text(encoding="utf-8")
    assert report.count("<svg") >= 2  # loss curves and held-out metrics
    assert "v1" in report
    assert "skill:no-carry" in report  # the per-slice table
    assert (directory / ".flywheel" / "flywheel.db").is_file()  # the embedded default
    assert (directory / ".flywheel" / "mlflow.db").is_file()
