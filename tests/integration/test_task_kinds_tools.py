"""Tool-call and environment tasks on a real database: stored with their tools, expected calls
and environment (redacted alike), eligible only once verifier QA found them usable, exported to
GRPO with their answer key as JSON text the prompt never shows, and refused without it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import ItemStreams, TaskRecord
from flywheel.datasets.items import eligible_items
from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput
from flywheel.models import VerifiableTask
from flywheel.signals.candidates import Provenance, TaskCandidate
from tests.conftest import Caller, run_cli
from tests.integration.test_dataset_build import domain_of, groups_in, store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "send_invoice",
            "description": "Send an invoice by email.",
            "parameters": {
                "type": "object",
                "properties": {"email": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["email", "amount"],
            },
        },
    }
]
EMAIL = "jane.roe@corp-mail.com"
EXPECTED = [{"name": "send_invoice", "arguments": {"email": [EMAIL], "amount": [12.5]}}]
ENVIRONMENT = {
    "source": "class Shop:\n    def __init__(self):\n        self.orders = {}\n",
    "classes": {"Shop": {"orders": {"A1": {"email": EMAIL, "status": "paid"}}}},
    "turns": [[{"role": "user", "content": "Refund A1."}]],
    "ground_truth": [[{"name": "refund", "arguments": {"order_id": "A1"}}]],
}


def tool_task(group: str) -> TaskCandidate:
    return TaskCandidate(
        Provenance("task_file", f"bfcl:{group}", group),
        f"Send {EMAIL} an invoice for 12.50.",
        None,
        None,
        None,
        task_kind="tool_call",
        messages=[
            {"role": "system", "content": "You are the billing assistant."},
            {"role": "user", "content": f"Send {EMAIL} an invoice for 12.50."},
        ],
        tools=TOOLS,
        expected_calls=EXPECTED,
    )


def environment_task(group: str) -> TaskCandidate:
    return TaskCandidate(
        Provenance("task_file", f"env:{group}", group),
        "Refund A1.",
        None,
        None,
        None,
        task_kind="environment",
        tools=TOOLS,
        environment=ENVIRONMENT,
    )


def test_new_kinds_are_stored_redacted_alike_and_wait_for_qa(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    domain_id = domain_of(on_test_database, acme)
    first, second = groups_in("train", domain_id, 2)
    store(on_test_database, acme, [tool_task(first), environment_task(second)])

    with on_test_database() as session:
        rows = {
            row.task_kind: row
            for row in session.scalars(
                select(VerifiableTask).where(VerifiableTask.domain_id == domain_id)
            )
        }
    tool, environment = rows["tool_call"], rows["environment"]
    assert tool.tools == TOOLS
    assert tool.messages is not None
    (argument,) = tool.expected_calls[0]["arguments"]["email"]  # type: ignore[index]
    # The email is a surrogate, the same one in the prompt and in the expected call.
    assert EMAIL not in json.dumps(tool.expected_calls)
    assert EMAIL not in tool.prompt
    assert argument in tool.prompt
    assert argument in tool.messages[1]["content"]
    assert environment.environment is not None
    assert environment.environment["source"] == ENVIRONMENT["source"]
    assert EMAIL not in json.dumps(environment.environment)

    # Pending tasks are not eligible: nothing has checked them yet.
    assert eligible_tasks(on_test_database, domain_id) == 0
    with unit_of_work(on_test_database) as session:
        session.execute(
            update(VerifiableTask)
            .where(VerifiableTask.domain_id == domain_id)
            .values(verifier_status="usable")
        )
    assert eligible_tasks(on_test_database, domain_id) == 2
    code, _, err = run_cli(capsys, "dataset", "build", "--domain", "billing", "--json")
    assert code == 0, err
    version = max_version(capsys)
    out = tmp_path / "export"
    code, _, err = run_cli(
        capsys, "dataset", "export", str(version), "--domain", "billing", "--out", str(out)
    )
    assert code == 0, err
    grpo = {
        row["task_kind"]: row
        for row in map(json.loads, (out / "train" / "grpo.jsonl").read_text().splitlines())
    }
    assert grpo["tool_call"]["prompt"][0] == {
        "role": "system",
        "content": "You are the billing assistant.",
    }
    assert json.loads(grpo["tool_call"]["tools"]) == TOOLS
    assert json.loads(grpo["tool_call"]["expected_calls"]) == tool.expected_calls
    assert json.loads(grpo["environment"]["environment"]) == environment.environment
    for row in grpo.values():
        assert "ground_truth" not in json.dumps(row["prompt"])
        assert "refund" not in json.dumps(row["prompt"]).replace("Refund", "")


def eligible_tasks(sessions: sessionmaker[Session], domain_id: uuid.UUID) -> int:
    with sessions() as session:
        return sum(item.kind == "task" for item in eligible_items(session, domain_id, 13))


def max_version(capsys: pytest.CaptureFixture[str]) -> int:
    code, stdout, err = run_cli(capsys, "dataset", "list", "--domain", "billing", "--json")
    assert code == 0, err
    return max(int(row["version"]) for row in json.loads(stdout))


def record(**fields: object) -> TaskRecord:
    defaults: dict[str, object] = {
        "prompt": "Send the invoice.",
        "entry_point": None,
        "hidden_tests": None,
        "visible_tests": None,
        "reference_solution": None,
        "task_kind": "tool_call",
        "answer": None,
        "difficulty": None,
        "group_key": "g",
        "item_id": str(uuid.uuid4()),
    }
    return TaskRecord(**(defaults | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"tools": TOOLS}, "a tool_call task needs its tools and expected calls"),
        ({"expected_calls": EXPECTED}, "a tool_call task needs its tools and expected calls"),
        ({"task_kind": "environment", "tools": TOOLS}, "an environment task needs its tools"),
        ({"task_kind": "environment", "environment": ENVIRONMENT}, "an environment task needs"),
    ],
)
def test_an_export_refuses_a_task_without_its_answer_key(
    tmp_path: Path, fields: dict[str, object], problem: str
) -> None:
    with pytest.raises(InvalidInput, match=problem):
        export_version(
            tmp_path / "out", "trl", {"train": ItemStreams(tasks=[record(**fields)])}, {}
        )


def test_a_name_that_keys_the_environments_state_is_redacted_alike_everywhere(
    on_test_database: sessionmaker[Session], acme: Caller
) -> None:
    """A state keyed by a person's name (BFCL's message API maps users by name): the key was
    left as it was while the prompt and the ground truth got a surrogate, so the stored task
    kept the name and its ground truth failed (KeyError)."""
    environment = {
        "source": "class Messages:\n    def __init__(self):\n        self.user_map = {}\n",
        "classes": {"Messages": {"user_map": {"Michael Thompson": "USR002"}}},
        "turns": [[{"role": "user", "content": "Message Michael Thompson."}]],
        "ground_truth": [[{"name": "get_user_id", "arguments": {"user": "Michael Thompson"}}]],
    }
    (group,) = groups_in("train", domain_of(on_test_database, acme), 1)
    task = TaskCandidate(
        Provenance("task_file", "msg-1", group),
        "Message Michael Thompson.",
        None,
        None,
        None,
        task_kind="environment",
        tools=TOOLS,
        environment=environment,
    )
    store(on_test_database, acme, [task])

    with on_test_database() as session:
        stored = session.scalars(select(VerifiableTask)).one()
    assert stored.environment is not None
    assert "Michael Thompson" not in json.dumps(stored.environment) + stored.prompt
    (surrogate,) = stored.environment["classes"]["Messages"]["user_map"]
    assert stored.environment["ground_truth"][0][0]["arguments"]["user"] == surrogate
    assert surrogate in stored.prompt
