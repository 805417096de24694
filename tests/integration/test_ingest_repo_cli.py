"""`flywheel ingest repo` end to end: a real PyPI sdist (inflection 0.5.1, with its tests)
becomes verifiable tasks that verifier QA accepts; a second run adds nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import VerifiableTask
from tests.conftest import Caller, run_cli

SDIST = Path(__file__).parent.parent / "fixtures" / "sdists" / "inflection-0.5.1.tar.gz"


def test_a_real_sdist_becomes_usable_tasks(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("ingest", "repo", str(SDIST), "--domain", "billing", "--json")

    code, out, err = run_cli(capsys, *args)

    assert code == 0, err
    counts = json.loads(out)
    assert counts["accepted"] == {"verifiable_tasks": 11}
    assert counts["rejected"] == {"no_tests": 2}
    assert counts["verifier"] == {"checked": 11, "usable": 11, "unusable": 0}
    with on_test_database() as session:
        tasks = session.scalars(select(VerifiableTask)).all()
    assert {task.verifier_status for task in tasks} == {"usable"}
    assert {task.group_key for task in tasks} == {"repository:inflection-0.5.1"}
    camelize = next(task for task in tasks if task.entry_point == "camelize")
    assert camelize.hidden_tests is not None
    assert camelize.hidden_tests not in camelize.prompt
    assert camelize.prompt.rstrip().endswith('"""')  # signature and docstring, no body

    code, out, _ = run_cli(capsys, *args)

    assert code == 0
    again = json.loads(out)
    assert (again["accepted"], again["duplicate"]) == ({}, 11)
    assert again["verifier"]["checked"] == 0


def test_not_a_repository_is_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("no code here")
    for source in (str(tmp_path / "missing"), str(tmp_path), str(tmp_path / "notes.txt")):
        code, _, err = run_cli(capsys, "ingest", "repo", source, "--domain", "billing")
        assert code == 2, source
        assert err.startswith("error: ")
        assert len(err.strip().splitlines()) == 1


TYPEDKIT = Path(__file__).parent.parent / "fixtures" / "repos" / "typedkit"


def test_the_report_says_what_became_of_each_function(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "ingest", "repo", str(TYPEDKIT), "--domain", "billing", "--json"
    )

    assert code == 0, err
    report = json.loads(out)["report"]
    assert {key: report[key] for key in ("functions", "tasks", "usable", "unusable")} == {
        "functions": 11,
        "tasks": 5,
        "usable": 5,
        "unusable": 0,
    }
    assert report["usable_share"] == 1.0
    assert report["rejected"] == {
        "returns_iterator": 3,
        "mutates_argument": 1,
        "method": 1,
        "returns_object": 1,
    }
    records = {record["ref"]: record for record in report["records"]}
    evens = records["typedkit/numbers.py::evens"]
    assert (evens["kind"], evens["outcome"]) == ("function", "returns_iterator")
    assert evens["detail"] == "evens returns filter(...), which cannot cross the sandbox as a value"
    (clamp,) = records["typedkit/numbers.py::clamp"]["tasks"]
    assert clamp["verifier"] == "usable"
    assert clamp["ref"].endswith(":typedkit/numbers.py::clamp")

    code, out, _ = run_cli(capsys, "ingest", "repo", str(TYPEDKIT), "--domain", "billing")

    assert code == 0
    assert "functions 11, tasks 5, usable 5 (100% of tasks), unusable 0, pending 0" in out
    assert "  typedkit/numbers.py::clamp: task, usable\n" in out
    assert "  typedkit/numbers.py::evens: rejected, returns_iterator (evens returns filter" in out
