"""`flywheel compile` end to end: feedback (from a file, or judged ticket answers) becomes
pairs, SFT examples and labels; compiling again changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import LabeledCompletion, PreferencePair, SftExample
from tests.conftest import Caller, count_rows, run_cli

TICKETS = Path(__file__).parent.parent / "fixtures" / "tickets" / "zendesk_tickets.json"


def compile_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "compile", *args, "--json")
    assert code == 0, err
    compiled = json.loads(out)["domains"]
    assert len(compiled) == 1
    return dict(compiled[0])


def test_feedback_file_compiles_once(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [
        {
            "kind": "correction",
            "prompt": "Can I get a refund?",
            "response": "No.",
            "value": {"text": "Yes: within 30 days, from Settings > Billing."},
        },
        {
            "kind": "rating",
            "prompt": "Reset my password",
            "response": "Use the link.",
            "value": {"thumbs": "down"},
            "rater": "u-1",
        },
    ]
    path = tmp_path / "feedback.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert run_cli(capsys, "ingest", "feedback", str(path), "--domain", "billing")[0] == 0

    first = compile_json(capsys, "--domain", "billing")

    assert (first["events_read"], first["pairs"], first["sft"], first["labels"]) == (2, 1, 1, 1)
    with on_test_database() as session:
        pair = session.scalars(select(PreferencePair)).one()
        label = session.scalars(select(LabeledCompletion)).one()
        sft = session.scalars(select(SftExample)).one()
    assert (pair.chosen, pair.rejected) == (lines[0]["value"]["text"], "No.")
    assert pair.why.startswith("correction")
    assert sft.completion == pair.chosen
    assert (label.completion, label.is_desirable) == ("Use the link.", False)

    again = compile_json(capsys)

    assert (again["inserted"], again["updated"], again["retracted"]) == (0, 0, 0)
    assert count_rows(on_test_database, "preference_pairs") == 1


def test_judged_ticket_answers_become_labels(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "ingest", "tickets", str(TICKETS), "--format", "zendesk", "--domain", "billing"
    )
    assert code == 0, err

    compiled = compile_json(capsys, "--domain", "billing", "--tenant", "acme")

    assert compiled["events_read"] >= 3  # satisfaction ratings and reopened/escalated outcomes
    with on_test_database() as session:
        labels = session.scalars(select(LabeledCompletion)).all()
    assert {label.is_desirable for label in labels} == {True, False}
    assert all("Zoë" not in label.completion for label in labels)


def test_compile_needs_a_known_tenant_and_domain(
    on_test_database: sessionmaker[Session], acme: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, message in [
        (["--domain", "nope"], "domain 'nope' not found"),
        (["--tenant", "initech"], "tenant 'initech' not found"),
    ]:
        code, _, err = run_cli(capsys, "compile", *args)
        assert code == 2
        assert message in err
