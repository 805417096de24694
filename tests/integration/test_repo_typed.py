"""Repositories written the way current libraries are: `from __future__ import annotations`,
names imported under `if TYPE_CHECKING:`, functions returning iterators. Every task ingest
accepts from such a module passes verifier QA; a function whose value cannot cross the
sandbox is rejected at ingest, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.sandbox.qa import TaskSpec, check_task
from flywheel.signals.candidates import TaskCandidate
from ingest.framework import Rejected
from ingest.repo import RepositoryIngestor

TYPEDKIT = Path(__file__).parent.parent / "fixtures" / "repos" / "typedkit"


@pytest.fixture(scope="module")
def ingested() -> tuple[dict[str, str], dict[str, TaskCandidate]]:
    """Each function's outcome ("task" or the rejection as `reason: detail`), and the tasks."""
    outcomes: dict[str, str] = {}
    tasks: dict[str, TaskCandidate] = {}
    with RepositoryIngestor(str(TYPEDKIT)) as ingestor:
        for record in ingestor.records():
            name = record.ref.rsplit("::", 1)[-1]
            try:
                (task,) = ingestor.convert(record)
            except Rejected as rejected:
                outcomes[name] = f"{rejected.reason}: {rejected.detail}"
                continue
            assert isinstance(task, TaskCandidate)
            outcomes[name], tasks[name] = "task", task
    return outcomes, tasks


def qa_status(task: TaskCandidate) -> tuple[str, str]:
    spec = TaskSpec(
        task.provenance.source_ref,
        task.prompt,
        task.reference_solution or "",
        task.hidden_tests or "",
        task.entry_point or "",
    )
    result = check_task(spec)
    return result.status, result.reason


def test_functions_returning_iterators_are_rejected_with_the_reason(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    outcomes, _ = ingested

    assert outcomes == {
        "clamp": "task",
        "scaled": "task",
        "evens": "returns_iterator: evens returns filter(...), which cannot cross the "
        "sandbox as a value",
        "running_total": "returns_iterator: running_total returns itertools.accumulate(...), "
        "which cannot cross the sandbox as a value",
        "windows": "returns_iterator: windows returns windowed (a generator), which cannot "
        "cross the sandbox as a value",
        "pad": "mutates_argument: pad changes its argument values in place, which its caller "
        "cannot see across the sandbox (only values cross)",
        "initials": "task",
        "join_words": "task",
        "Token.__init__": "method: Token.__init__: only module-level functions become tasks",
        "tokens": "returns_object: tokens returns found (a collection holding a Token object), "
        "which cannot cross the sandbox as a value",
        "labelled": "task",  # it changes **fields, which is its own
    }


def test_type_only_names_never_stop_a_task_from_loading(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    _, tasks = ingested
    clamp = tasks["clamp"]

    reference = clamp.reference_solution or ""
    assert reference.startswith('"""Numbers: annotations name')
    assert "from __future__ import annotations\n" in reference
    assert "typedkit.kinds" not in reference  # an in-repo import only a type checker runs
    assert clamp.prompt in reference
    assert "from collections.abc import Sequence" in (tasks["join_words"].prompt or "")


def test_every_accepted_task_passes_verifier_qa(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    _, tasks = ingested

    results = {name: qa_status(task) for name, task in tasks.items()}

    assert {name: status for name, (status, _) in results.items()} == {
        "clamp": "usable",
        "scaled": "usable",
        "initials": "usable",
        "join_words": "usable",
        "labelled": "usable",
    }, results


def test_an_object_of_a_test_class_is_not_passed_to_the_candidate(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    _, tasks = ingested

    hidden = tasks["scaled"].hidden_tests or ""
    assert "def test_scaled():" in hidden
    assert "Pair()" not in hidden


def test_a_case_whose_value_cannot_cross_is_left_out(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    _, tasks = ingested

    hidden = tasks["clamp"].hidden_tests or ""
    assert "for value, expected in [(-3, 0), (4, 4), (12, 10)]:" in hidden
    assert "Decimal" not in hidden


def test_tests_only_a_type_checker_runs_are_left_out_and_pytest_aliases_understood(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    _, tasks = ingested

    hidden = tasks["initials"].hidden_tests or ""
    assert "def test_initials_of():" in hidden
    assert "for name, expected in [('grace hopper', 'GH'), ('alan', 'A')]:" in hidden
    assert "reveal_type" not in hidden


def test_a_unittest_assert_raises_runs_without_pytest_imported(
    ingested: tuple[dict[str, str], dict[str, TaskCandidate]],
) -> None:
    _, tasks = ingested

    hidden = tasks["clamp"].hidden_tests or ""
    assert "def test_ClampTest_test_refuses_text():\n    with pytest.raises(TypeError):" in hidden
    assert hidden.startswith("import pytest\n")
