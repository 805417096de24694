"""The demo's sample data through the real CLI: every file ingests cleanly, the compiler makes
the training signal the demo trains on, the redactor catches the tickets' personal data and
the repository's tasks pass verifier QA."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.demo.arithmetic_feedback import SIZES
from flywheel.demo.data import (
    ARITHMETIC_DOMAIN,
    CODE_DOMAIN,
    SUPPORT_DOMAIN,
    write_arithmetic,
    write_repository,
    write_support,
)
from flywheel.models import Interaction, PreferencePair, SftExample, VerifiableTask
from tests.conftest import Caller, run_cli

PERSONAL = (
    "4111 1111 1111 1111",
    "olivia.grant@example.com",
    "+1 (415) 555-0142",
    "DE89 3704 0044 0532 0130 00",
    "203.0.113.57",
    "AKIAIOSFODNN7EXAMPLE",
    "ana@example.net",
    "Olivia",
)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, *args, "--tenant", "acme", "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def compiled(capsys: pytest.CaptureFixture[str], domain: str) -> dict[str, Any]:
    [counts] = cli(capsys, "compile", "--domain", domain)["domains"]
    result: dict[str, Any] = counts
    return result


@pytest.fixture
def demo_domains(acme: Caller, capsys: pytest.CaptureFixture[str]) -> Caller:
    for domain in (ARITHMETIC_DOMAIN, SUPPORT_DOMAIN, CODE_DOMAIN):
        code, _, err = run_cli(capsys, "domains", "create", domain, "--tenant", "acme")
        assert code == 0, err
    return acme


def test_arithmetic_batches_compile_into_sft_examples_pairs_and_labels(
    on_test_database: sessionmaker[Session],
    demo_domains: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = {"pairs": 0, "sft": 0, "labels": 0}
    for batch in (1, 2):
        [path] = write_arithmetic(tmp_path, batch=batch, quick=True)
        size = SIZES[True, batch]
        events = size.carries + size.plain

        counts = cli(capsys, "ingest", "feedback", str(path), "--domain", ARITHMETIC_DOMAIN)

        assert (counts["read"], counts["accepted"]) == (events, {"feedback_events": events})
        assert counts["rejected"] == {}
        corrections = size.carry_corrections + size.plain_corrections
        comparisons = size.carry_comparisons + size.plain_comparisons
        expected["pairs"] += corrections + comparisons
        expected["sft"] += corrections
        expected["labels"] += size.thumbs_up

    result = compiled(capsys, ARITHMETIC_DOMAIN)

    assert {key: result[key] for key in expected} == expected
    assert result["near_duplicate"] == 0
    with on_test_database() as session:
        examples = session.scalars(select(SftExample)).all()
    assert len(examples) == expected["sft"]
    for example in examples:
        a, b = (int(part) for part in example.messages[-1]["content"].removesuffix("=").split("+"))
        assert example.completion == str(a + b)


def test_support_tickets_and_feedback_ingest_redacted(
    on_test_database: sessionmaker[Session],
    demo_domains: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tickets, feedback = write_support(tmp_path)

    from_tickets = cli(
        capsys, "ingest", "tickets", str(tickets), "--format", "csv", "--domain", SUPPORT_DOMAIN
    )
    from_feedback = cli(capsys, "ingest", "feedback", str(feedback), "--domain", SUPPORT_DOMAIN)
    result = compiled(capsys, SUPPORT_DOMAIN)

    assert from_tickets["read"] == 20
    assert from_tickets["accepted"] == {
        "sft_examples": 15,
        "preference_pairs": 4,
        "interactions": 22,
        "feedback_events": 22,
    }
    assert from_tickets["rejected"] == {"unresolved": 2}
    assert from_tickets["redacted"] > 0
    assert from_feedback["accepted"] == {"feedback_events": 15}
    assert (result["events_read"], result["pairs"], result["sft"], result["labels"]) == (
        37,
        13,
        3,
        12,
    )
    assert result["ties_dropped"] == 1
    with on_test_database() as session:
        texts = [
            json.dumps([row.messages, row.completion])
            for row in session.scalars(select(SftExample))
        ]
        texts += [
            json.dumps([row.messages, row.chosen, row.rejected])
            for row in session.scalars(select(PreferencePair))
        ]
        texts += [
            json.dumps([row.messages, row.response]) for row in session.scalars(select(Interaction))
        ]
    stored = "\n".join(texts)
    assert not [value for value in PERSONAL if value in stored]
    assert re.search(r"<[A-Z_]+>", stored) is None  # surrogates, never placeholders
    with on_test_database() as session:
        reports = [row.redaction_report for row in session.scalars(select(SftExample))]
        reports += [row.redaction_report for row in session.scalars(select(PreferencePair))]
    assert {"EMAIL", "CARD"} <= {kind for report in reports for kind in report}


def test_the_repository_becomes_usable_tasks(
    on_test_database: sessionmaker[Session],
    demo_domains: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repository = write_repository(tmp_path)

    counts = cli(
        capsys, "ingest", "repo", str(repository), "--domain", CODE_DOMAIN, "--history", "2"
    )

    assert counts["accepted"] == {"verifiable_tasks": 8}
    assert counts["rejected"] == {"no_tests": 1, "method": 2, "root_commit": 1}
    assert counts["verifier"] == {"checked": 8, "usable": 8, "unusable": 0}
    with on_test_database() as session:
        tasks = session.scalars(select(VerifiableTask)).all()
    assert {task.group_key for task in tasks} == {"repository:invoicing"}
    assert "split_evenly" in {task.entry_point for task in tasks}
