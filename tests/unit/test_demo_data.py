"""The demo's sample data: deterministic writers, batches that never share a prompt, and files
that the project's own readers accept (no database: the ingestors' parse and convert steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from finetune.config import load_config
from flywheel.demo.arithmetic_feedback import SIZES
from flywheel.demo.data import arithmetic_plan, write_arithmetic, write_repository, write_support
from flywheel.evaluation.gate import GatePolicy
from flywheel.scheduling.config import CycleSettings
from ingest.feedback_file import FeedbackFileIngestor
from ingest.framework import Ingestor, Rejected
from ingest.jsonl import read_objects
from ingest.repo import RepositoryIngestor
from ingest.tickets import make_ticket_ingestor


def convert_all(ingestor: Ingestor) -> Counter[str]:
    """Every record through the ingestor: candidates by type, rejections by reason."""
    found: Counter[str] = Counter()
    for record in ingestor.records():
        try:
            found.update(type(candidate).__name__ for candidate in ingestor.convert(record))
        except Rejected as rejected:
            found[f"rejected:{rejected.reason}"] += 1
    return found


def file_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts
    }


def prompts(path: Path) -> list[str]:
    """The question each feedback line is about."""
    found = []
    for _, event in read_objects(path):
        messages = event["value"]["messages"] if event["kind"] == "comparison" else None
        found.append(messages[-1]["content"] if messages else event["prompt"])
    return found


def head(repository: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.parametrize("quick", [False, True])
def test_arithmetic_batches_are_deterministic_and_never_share_a_prompt(
    tmp_path: Path, quick: bool
) -> None:
    [first] = write_arithmetic(tmp_path / "a", batch=1, quick=quick)
    [second] = write_arithmetic(tmp_path / "a", batch=2, quick=quick)
    [first_again] = write_arithmetic(tmp_path / "b", batch=1, quick=quick)
    [second_again] = write_arithmetic(tmp_path / "b", batch=2, quick=quick)

    assert first.read_bytes() == first_again.read_bytes()
    assert second.read_bytes() == second_again.read_bytes()
    one, two = prompts(first), prompts(second)
    assert len(set(one)) == len(one)  # one event per prompt: each prompt its own group
    assert len(set(two)) == len(two)
    assert not set(one) & set(two)


@pytest.mark.parametrize("quick", [False, True])
def test_arithmetic_feedback_is_what_the_feedback_ingestor_reads(
    tmp_path: Path, quick: bool
) -> None:
    for batch in (1, 2):
        [path] = write_arithmetic(tmp_path, batch=batch, quick=quick)
        size = SIZES[quick, batch]
        events = [event for _, event in read_objects(path)]

        found = convert_all(FeedbackFileIngestor(path, "arithmetic"))

        assert found == {"EventCandidate": len(events)}
        kinds = Counter(event["kind"] for event in events)
        assert kinds == {
            "correction": size.carry_corrections + size.plain_corrections,
            "comparison": size.carry_comparisons + size.plain_comparisons,
            "rating": size.thumbs_up,
        }
        assert all(event["rater"].startswith("rater-") for event in events)
        assert len({event["event_id"] for event in events}) == len(events)


def sums(path: Path) -> list[tuple[int, int, dict[str, Any]]]:
    rows = []
    for _, event in read_objects(path):
        prompt = event.get("prompt") or event["value"]["messages"][-1]["content"]
        a, b = (int(part) for part in prompt.removesuffix("=").split("+"))
        rows.append((a, b, event))
    return rows


def test_arithmetic_corrections_fix_the_carry_and_batch_two_carries_into_the_hundreds(
    tmp_path: Path,
) -> None:
    for batch in (1, 2):
        [path] = write_arithmetic(tmp_path, batch=batch, quick=False)
        for a, b, event in sums(path):
            carries = a % 10 + b % 10 >= 10
            if event["kind"] == "correction":
                assert event["value"]["text"] == str(a + b)
                assert event["response"] == str(a + b + (-10 if carries else 10))
            elif event["kind"] == "rating":
                assert (event["response"], carries) == (str(a + b), False)
            else:
                value = event["value"]
                assert value["responses"][value["preferred"]] == str(a + b)
            if carries:
                assert (a + b >= 100) == (batch == 2)


def test_support_files_are_deterministic_and_read_by_the_ticket_and_feedback_readers(
    tmp_path: Path,
) -> None:
    tickets, feedback = write_support(tmp_path / "a")
    again = write_support(tmp_path / "b")

    assert [path.read_bytes() for path in again] == [tickets.read_bytes(), feedback.read_bytes()]
    assert convert_all(make_ticket_ingestor("csv", tickets)) == {
        "SftCandidate": 15,
        "PairCandidate": 4,
        "InteractionCandidate": 22,
        "rejected:unresolved": 2,
    }
    assert convert_all(FeedbackFileIngestor(feedback, "support")) == {"EventCandidate": 15}


def test_the_repository_is_deterministic_and_yields_tasks(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "a")
    again = write_repository(tmp_path / "b")

    assert file_bytes(repository) == file_bytes(again)
    assert head(repository) == head(again)
    with RepositoryIngestor(str(repository), history=2) as ingestor:
        found = convert_all(ingestor)
    assert found == {
        "TaskCandidate": 8,  # 7 tested functions and the commit that added split_evenly
        "rejected:no_tests": 1,
        "rejected:method": 2,
        "rejected:root_commit": 1,
    }


def test_writing_the_repository_again_replaces_it(tmp_path: Path) -> None:
    repository = write_repository(tmp_path)
    (repository / "stray.py").write_text("x = 1\n")

    assert write_repository(tmp_path) == repository
    assert not (repository / "stray.py").exists()


@pytest.mark.parametrize("quick", [False, True])
def test_the_arithmetic_plan_is_a_valid_cycle_gate_and_training_config(quick: bool) -> None:
    plan = arithmetic_plan(quick=quick)

    cycle = CycleSettings.model_validate(plan["cycle"])
    config = load_config("sft", None, cycle.overrides["sft"])
    policy = GatePolicy(primary_metric=plan["primary_metric"], **plan["gate"])

    assert cycle.methods == ["sft"]
    assert (config.max_steps, config.learning_rate, config.lora.r) == (100, 0.005, 16)
    assert cycle.dataset_recipe().eval_fraction == (0.2 if quick else 0.1)
    assert policy.min_items == 30  # the gate's default
    assert plan["pretrain_steps"] > 0


def test_the_arithmetic_domain_finetune_shares_loads_only_the_standard_library() -> None:
    """`finetune.synthetic` imports `flywheel.demo.arithmetic`: that must bring neither the
    database, the CLI, rich, nor the rest of the demo with it (import-linter sees the imports
    it names; this sees what really loads, the package's `__init__` included)."""
    probe = (
        "import json, sys; before = set(sys.modules); import flywheel.demo.arithmetic; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )

    loaded = json.loads(result.stdout)
    assert [name for name in loaded if name.split(".")[0] not in sys.stdlib_module_names] == [
        "flywheel",
        "flywheel.demo",
        "flywheel.demo.arithmetic",
    ]


def test_the_arithmetic_skill_rules_label_exactly_the_carries_and_the_rest() -> None:
    import re

    from flywheel.demo.arithmetic import SKILL_RULES, problems

    carry, plain = (re.compile(SKILL_RULES[name]) for name in ("skill:carry", "skill:no-carry"))
    for problem in problems():
        assert bool(carry.search(problem.prompt)) == problem.carries, problem.prompt
        assert bool(plain.search(problem.prompt)) == (not problem.carries), problem.prompt
    assert arithmetic_plan(quick=True)["slice_rules"] == SKILL_RULES


def test_the_arithmetic_sum_rules_label_exactly_the_sums_into_the_hundreds_and_the_rest() -> None:
    import re

    from flywheel.demo.arithmetic import SKILL_RULES, problems

    three, two = (re.compile(SKILL_RULES[name]) for name in ("sum:three-digit", "sum:two-digit"))
    for problem in problems():
        is_three = problem.a + problem.b >= 100
        assert bool(three.search(problem.prompt)) == is_three, problem.prompt
        assert bool(two.search(problem.prompt)) == (not is_three), problem.prompt
