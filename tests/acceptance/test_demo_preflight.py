"""`flywheel demo` checks every requirement before any work: a missing one is one line with
its fix, and nothing is created (before, the demo pretrained for 17 s and then died at its
first sandbox with "sandbox unavailable")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_database


def _demo(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    directory = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "flywheel", "demo", "--quick", "--dir", str(directory)],
        env=base | env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, directory


def test_a_missing_bwrap_stops_the_demo_in_one_line_before_any_work(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-bwrap")

    result, directory = _demo(tmp_path, FLYWHEEL_SANDBOX_BWRAP=missing)

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: flywheel demo cannot run here:")
    assert missing in result.stderr
    assert "(fix: point FLYWHEEL_SANDBOX_BWRAP at bwrap, or unset it)" in result.stderr
    assert "flywheel doctor" in result.stderr
    assert result.stdout == ""
    assert not directory.exists()  # no workspace, no pretraining: nothing was started


def test_a_path_without_setpriv_stops_the_demo_naming_the_package(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").symlink_to(str(shutil.which("bwrap")))

    result, directory = _demo(tmp_path, PATH=str(bin_dir))

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "setpriv is not installed (fix: apt-get install util-linux)" in result.stderr
    assert not directory.exists()


def test_the_demo_needs_git_for_its_repository_history(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bwrap", "setpriv"):
        (bin_dir / tool).symlink_to(str(shutil.which(tool)))

    result, directory = _demo(tmp_path, PATH=str(bin_dir))

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "git is not installed" in result.stderr
    assert "(fix: apt-get install git)" in result.stderr
    assert "setpriv" not in result.stderr
    assert not directory.exists()
