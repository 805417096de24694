"""`flywheel sandbox run`: the verdict and its reason, as a person or a script reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.cli import main

TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n"


@pytest.mark.parametrize(
    ("solution", "exit_code", "reason"),
    [
        ("def add(a, b):\n    return a + b\n", 0, "passed"),
        ("def add(a, b):\n    return a - b\n", 3, "failed_tests"),
        ("import time\ndef add(a, b):\n    time.sleep(1e9)\n", 3, "timeout"),
        ("def add(a, b):\n    return bytearray(10**10)\n", 3, "memory"),
        ("def add(a, b):\n    print('x' * 10**6)\n    return 3\n", 3, "output_limit"),
        ("import os\ndef add(a, b):\n    os._exit(0)\n", 3, "crash"),
    ],
)
def test_verdict_and_reason(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    solution: str,
    exit_code: int,
    reason: str,
) -> None:
    (tmp_path / "solution.py").write_text(solution)
    (tmp_path / "tests.py").write_text(TESTS)

    code = main(
        [
            "sandbox", "run", "--solution", str(tmp_path / "solution.py"),
            "--tests", str(tmp_path / "tests.py"), "--wall-s", "4", "--json",
        ]
    )  # fmt: skip

    verdict = json.loads(capsys.readouterr().out)
    assert (code, verdict["reason"]) == (exit_code, reason)
    assert verdict["is_passed"] is (reason == "passed")
    # Cut off at the wall clock before it reports, the test is still there: failed.
    assert [test["name"] for test in verdict["tests"]] == ["test_small"]
    if reason == "timeout":
        assert verdict["tests"][0]["message"].startswith("did not report")
    assert verdict["duration_s"] > 0


def test_entry_point_must_be_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "solution.py").write_text("def a():\n    pass\n\ndef b():\n    pass\n")
    (tmp_path / "tests.py").write_text(TESTS)

    code = main(["sandbox", "run", "--solution", str(tmp_path / "solution.py"),
                 "--tests", str(tmp_path / "tests.py")])  # fmt: skip

    assert code == 2
    assert "defines 2 functions; give --entry-point" in capsys.readouterr().err
