"""`flywheel ingest tasks --format bfcl` stores BFCL's tasks with their tools, calls and
environments, counts what it rejects, and verifier QA passes BFCL's ground truth (in the
real sandbox for environments) while empty and wrong calls fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import Domain, VerifiableTask
from tests.conftest import Caller, count_rows, run_cli

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bfcl"
BFCL = ("--format", "bfcl", "--no-verify")
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def ingest(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run_cli(
        capsys, "ingest", "tasks", *args, "--domain", "billing", "--tenant", "acme", "--json"
    )
    return code, (json.loads(out) if code == 0 else {}), err


def test_bfcl_files_go_in_with_their_tools_calls_and_environments(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, single, err = ingest(capsys, str(FIXTURE / "BFCL_v4_single_turn.json"), *BFCL)
    assert (code, err) == (0, "")
    assert single["accepted"] == {"verifiable_tasks": 8}
    assert single["rejected"] == {"expects_no_call": 1, "expects_any_call": 1, "not_python": 1}

    code, multi, err = ingest(
        capsys,
        str(FIXTURE / "BFCL_v4_multi_turn.json"),
        *BFCL,
        "--answers",
        str(FIXTURE / "possible_answer" / "BFCL_v4_multi_turn.json"),
        "--environments",
        str(FIXTURE / "environments"),
    )
    assert (code, err) == (0, "")
    # base_31 and long_context_31 share their prompt: only the environment tells them apart
    assert multi["accepted"] == {"verifiable_tasks": 4}
    assert multi["rejected"] == {"tools_added_mid_episode": 1}

    with on_test_database() as session:
        tasks = {task.source_ref: task for task in session.scalars(select(VerifiableTask))}
    factorial = tasks["simple_python_1"]
    assert factorial.task_kind == "tool_call"
    assert factorial.expected_calls == [{"name": "math_factorial", "arguments": {"number": [5]}}]
    assert factorial.tools[0]["function"]["name"] == "math_factorial"
    assert factorial.group_key == "bfcl:simple_python_1"
    environment = tasks["multi_turn_base_31"]
    assert environment.task_kind == "environment"
    assert environment.environment["ground_truth"][1][0] == {
        "name": "cd",
        "arguments": {"folder": "Reports"},
    }
    assert "class GorillaFileSystem" in environment.environment["source"]
    assert tasks["live_multiple_27-7-0"].messages[0]["role"] == "system"

    code, again, _ = ingest(capsys, str(FIXTURE / "BFCL_v4_single_turn.json"), *BFCL)
    assert (code, again["accepted"], again["duplicate"]) == (0, {}, 8)
    assert count_rows(on_test_database, "verifiable_tasks") == 12


def test_a_multi_turn_file_without_its_classes_is_one_line_naming_the_flag(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    path, missing = str(FIXTURE / "BFCL_v4_multi_turn.json"), str(tmp_path / "no")
    code, _, err = ingest(capsys, path, *BFCL, "--environments", missing)

    assert code == 2
    assert "--environments" in err
    assert "no such directory" in err
    assert count_rows(on_test_database, "verifiable_tasks") == 0


def test_answers_go_with_the_bfcl_format_only(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = str(FIXTURE / "possible_answer" / "BFCL_v4_single_turn.json")
    path = str(FIXTURE / "BFCL_v4_single_turn.json")
    code, _, err = ingest(capsys, path, "--format", "humaneval", "--answers", answers)

    assert code == 2
    assert "--answers and --environments go with --format bfcl only" in err


def test_bfcl_ground_truth_passes_verifier_qa_and_says_why_when_it_cannot(
    capsys: pytest.CaptureFixture[str], on_test_database: sessionmaker[Session], acme: Caller
) -> None:
    environments = ("--environments", str(FIXTURE / "environments"))
    code, single, err = ingest(
        capsys, "--format", "bfcl", str(FIXTURE / "BFCL_v4_single_turn.json")
    )
    assert (code, err) == (0, "")
    assert single["verifier"] == {"checked": 8, "usable": 8, "unusable": 0}
    for name in ("BFCL_v4_multi_turn_file_system.json", "BFCL_v4_multi_turn.json"):
        code, _, err = ingest(capsys, "--format", "bfcl", str(FIXTURE / name), *environments)
        assert (code, err) == (0, "")

    with on_test_database() as session:
        found = {
            task.source_ref: (task.verifier_status, task.verifier_reason or "")
            for task in session.scalars(
                select(VerifiableTask).where(VerifiableTask.task_kind == "environment")
            )
        }
    for name in ("multi_turn_base_1", "multi_turn_base_3"):
        assert found[name] == (
            "usable",
            "the ground truth reaches its state in 3 of 3 runs; doing nothing does not",
        )
    # MathAPI imports mpmath: the sandbox's Python has the standard library only.
    status, reason = found["multi_turn_base_31"]
    assert status == "unusable"
    assert "No module named 'mpmath'" in reason


# Whether a surrogate is redacted again depends on the redaction key: under "k36" (when this
# was written) parallel_0's surrogate artist is a name the detector does not know, under "k0"
# one it does.
@pytest.mark.parametrize("key", ["k0", "k36"])
def test_tool_and_environment_tasks_export_and_come_back_in_flywheels_format(
    capsys: pytest.CaptureFixture[str],
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
) -> None:
    """export-tasks writes what a tool_call or environment task needs, and the flywheel format
    reads it back into another domain as the same tasks, which pass QA again."""
    monkeypatch.setenv("FLYWHEEL_REDACTION_KEY", key)
    environments = ("--environments", str(FIXTURE / "environments"))
    fs_file = str(FIXTURE / "BFCL_v4_multi_turn_file_system.json")
    assert ingest(capsys, "--format", "bfcl", str(FIXTURE / "BFCL_v4_single_turn.json"))[0] == 0
    assert ingest(capsys, "--format", "bfcl", fs_file, *environments)[0] == 0
    exported = tmp_path / "tools.jsonl"
    code, _, err = run_cli(
        capsys, "ingest", "export-tasks", "--domain", "billing", "--tenant", "acme",
        "--status", "usable", "--out", str(exported),
    )  # fmt: skip
    assert (code, err) == (0, "10 tasks written\n")
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert {record["kind"] for record in records} == {"tool_call", "environment"}

    run_cli(capsys, "domains", "create", "mirror", "--tenant", "acme")
    code, out, err = run_cli(
        capsys, "ingest", "tasks", str(exported), "--domain", "mirror", "--tenant", "acme",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["verifier"] == {"checked": 10, "usable": 10, "unusable": 0}
    with on_test_database() as session:
        tasks: dict[str, list[VerifiableTask]] = {"billing": [], "mirror": []}
        for task, domain in session.execute(
            select(VerifiableTask, Domain.name).join(Domain, Domain.id == VerifiableTask.domain_id)
        ):
            tasks[domain].append(task)
    billing = {task.content_sha256 for task in tasks["billing"]}
    again = [task for task in tasks["mirror"] if task.redaction_report]
    kept = {task.content_sha256 for task in tasks["mirror"] if not task.redaction_report}
    assert len(tasks["mirror"]) == 10
    # the same content, hashed the same way: every task that came back as it went out
    assert len(kept) == 10 - len(again)
    assert kept <= billing
    # parallel_0 names "Taylor Swift": redacted on the way in. On the way back its surrogate is
    # redacted again (to another surrogate) when the detector takes it for a name, which depends
    # on the redaction key (about 1 key in 20 draws a first name it does not know); either way
    # the call still names the artist the prompt names, so the task stays solvable.
    assert len(again) <= 1
    for task in [*again, *(task for task in tasks["billing"] if task.redaction_report)]:
        (artist,) = task.expected_calls[0]["arguments"]["artist"]
        assert artist in task.prompt
        assert "Taylor Swift" not in task.prompt


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"kind": "tool_call", "prompt": "p", "tools": []}, "line 1: a tool_call task needs"),
        (
            {"kind": "tool_call", "prompt": "p", "tools": TOOLS, "expected_calls": [{"x": 1}]},
            "line 1: a tool_call task needs 'tools' and 'expected_calls': malformed expected call",
        ),
        (
            {"kind": "environment", "prompt": "p", "tools": TOOLS, "environment": {"source": 1}},
            "line 1: 'environment.source' must be a str",
        ),
        ({"kind": "agent", "prompt": "p"}, "line 1: 'kind' must be one of code, answer"),
    ],
)
def test_a_malformed_tool_task_line_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    line: dict[str, Any],
    message: str,
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(line) + "\n")
    code, _, err = ingest(capsys, str(path))
    assert code == 2
    assert message in err
    assert count_rows(on_test_database, "verifiable_tasks") == 0
