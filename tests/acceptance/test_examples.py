"""Every file under examples/ goes through the real parser of what it is an example of (a
training config, a domain config, an export, a task file, a repository...), and the README's
domain-config block is `examples/billing.yaml`. A file nobody checks fails the first test.
(test_readme.py then runs the README's commands on them.)"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from finetune.config import load_config
from flywheel.evaluation.gate import GatePolicy
from flywheel.evaluation.slices import slice_rules
from flywheel.redaction import redact
from flywheel.registry.release import ReleaseConfig
from flywheel.sandbox import run_tests
from flywheel.sandbox.qa import check_task, load_task_file
from flywheel.scheduling.config import cycle_settings
from flywheel.signals.candidates import PairCandidate, SftCandidate, TaskCandidate
from flywheel.signals.verification import ToolCallSpec, check_tool_call_task
from flywheel.tenancy.models import Domain
from ingest.bfcl import BfclIngestor
from ingest.feedback_file import FeedbackFileIngestor
from ingest.framework import Ingestor, Rejected
from ingest.repo.ingestor import RepositoryIngestor
from ingest.task_files import TaskFileIngestor
from ingest.tickets import make_ticket_ingestor
from tests.acceptance.readme import ROOT, readme_blocks

pytestmark = pytest.mark.no_database

EXAMPLES = ROOT / "examples"
CSV_MAPPING = "id=Ticket ID,body=Description,resolution=Resolution,status=Status"
TRAINING_CONFIGS = ("sft", "dpo", "kto", "grpo")


def _candidates(ingestor: Ingestor) -> list[object]:
    """What the ingestor makes of each record; a record it rejects (with its reason) adds
    the `Rejected` error instead."""
    found: list[object] = []
    for record in ingestor.records():
        try:
            found += ingestor.convert(record)
        except Rejected as rejected:
            found.append(rejected)
    return found


def check_training_config(path: Path) -> None:
    config = load_config(path.stem, path, [])
    assert config.method == path.stem


def check_domain_config(path: Path) -> None:
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    settings = cycle_settings(Domain(name="billing", config=config))  # the cycle's own parser
    for method in settings.methods:
        training = settings.configs[method]  # relative to the checkout, as the README runs it
        load_config(method, ROOT / training, list(settings.overrides.get(method, [])))
    settings.dataset_recipe()
    slice_rules(config)
    known = {field.name for field in dataclasses.fields(GatePolicy)}
    assert set(config["gate"]) <= known
    GatePolicy(primary_metric=config["primary_metric"], **config["gate"])


def check_zendesk(path: Path) -> None:
    found = _candidates(make_ticket_ingestor("zendesk", path))
    assert any(isinstance(item, SftCandidate) for item in found), found
    assert any(isinstance(item, PairCandidate) for item in found), found  # 4712: reopened


def check_csv(path: Path) -> None:
    found = _candidates(make_ticket_ingestor("csv", path, CSV_MAPPING))
    assert sum(isinstance(item, SftCandidate) for item in found) == 2
    (rejected,) = [item for item in found if isinstance(item, Rejected)]
    assert rejected.reason == "unresolved"  # T-1003 is still open


def check_feedback(path: Path) -> None:
    assert len(_candidates(FeedbackFileIngestor(path, "billing"))) == 3


def check_tasks(path: Path) -> None:
    found = _candidates(TaskFileIngestor(path, "humaneval"))
    assert len(found) == 2
    assert all(isinstance(item, TaskCandidate) for item in found)
    for spec in load_task_file(path):  # verifier QA in the sandbox: each task usable
        assert check_task(spec).status == "usable", spec.task_id


def check_solution_and_tests(path: Path) -> None:
    """solution.py passes tests.py in the sandbox (`flywheel sandbox run`'s example)."""
    solution, tests = (
        (path.parent / name).read_text(encoding="utf-8") for name in ("solution.py", "tests.py")
    )
    verdict = run_tests(solution, tests, entry_point="add")
    assert verdict.is_passed, verdict
    assert len(verdict.tests) == 2


def check_notes(path: Path) -> None:
    counts = redact(path.read_text(encoding="utf-8")).counts
    for kind in ("EMAIL", "PHONE", "CARD"):
        assert counts.get(kind), (kind, counts)
    assert "python@3.11" in redact(path.read_text(encoding="utf-8")).text  # code survives


def check_repository(path: Path) -> None:
    with RepositoryIngestor(str(path)) as repository:
        found = _candidates(repository)
    names = {item.entry_point for item in found if isinstance(item, TaskCandidate)}
    assert {"vat_amount", "apply_discount", "split_evenly", "format_cents"} <= names, names


def check_bfcl(path: Path) -> None:
    """Three BFCL entries with their answers (found beside them), each a tool-call task that
    passes verifier QA."""
    tasks = _candidates(BfclIngestor(path / "BFCL_v4_simple_python.json"))
    assert len(tasks) == 3
    for task in tasks:
        assert isinstance(task, TaskCandidate)
        assert task.task_kind == "tool_call"
        qa = check_tool_call_task(ToolCallSpec("t", task.expected_calls, task.tools))
        assert qa.status == "usable", qa


CHECKS: dict[str, Callable[[Path], None]] = {
    **{f"{method}.yaml": check_training_config for method in TRAINING_CONFIGS},
    "billing.yaml": check_domain_config,
    "zendesk-export.json": check_zendesk,
    "tickets.csv": check_csv,
    "feedback.jsonl": check_feedback,
    "tasks.jsonl": check_tasks,
    "solution.py": check_solution_and_tests,
    "tests.py": check_solution_and_tests,
    "notes.txt": check_notes,
    "myproject": check_repository,
    "bfcl": check_bfcl,
}


def test_every_example_is_checked() -> None:
    present = {path.name for path in EXAMPLES.iterdir()}
    assert present - set(CHECKS) == set(), "examples nothing checks"
    assert set(CHECKS) - present == set(), "checked examples that are gone"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_example_parses_as_what_it_is(name: str) -> None:
    CHECKS[name](EXAMPLES / name)


def test_the_readmes_domain_config_is_the_example() -> None:
    configs = [yaml.safe_load(block.text) for block in readme_blocks() if block.language == "yaml"]
    (config,) = [config for config in configs if set(config) != {"release"}]
    example = yaml.safe_load((EXAMPLES / "billing.yaml").read_text(encoding="utf-8"))
    assert config == example


def test_the_readmes_release_section_is_a_valid_release_config() -> None:
    configs = [yaml.safe_load(block.text) for block in readme_blocks() if block.language == "yaml"]
    (release,) = [config["release"] for config in configs if set(config) == {"release"}]
    assert ReleaseConfig.model_validate(release).challenger_share > 0


def test_every_file_the_readme_names_exists() -> None:
    named = {path.rstrip(".") for path in re.findall(r"examples/[\w./-]+", _readme())}
    assert len(named) >= 10, named
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")
