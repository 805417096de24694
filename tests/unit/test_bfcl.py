"""BFCL's question and answer files read into tool_call and environment tasks (no database).

The fixture is a few of BFCL's own lines and classes (tests/fixtures/bfcl/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from flywheel.errors import InvalidInput
from flywheel.signals.candidates import TaskCandidate
from ingest.bfcl import BfclIngestor, category_of, openai_tools
from ingest.bfcl_environments import default_environments_dir, parse_call
from ingest.framework import Rejected

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bfcl"
SINGLE = FIXTURE / "BFCL_v4_single_turn.json"
MULTI = FIXTURE / "BFCL_v4_multi_turn.json"
ENVIRONMENTS = FIXTURE / "environments"


def read(ingestor: BfclIngestor) -> tuple[dict[str, TaskCandidate], Counter[str]]:
    """The tasks by BFCL id and the rejections by reason, as the runner would count them."""
    tasks, rejected = {}, Counter[str]()
    for record in ingestor.records():
        try:
            (task,) = ingestor.convert(record)
        except Rejected as error:
            rejected[error.reason] += 1
        else:
            assert isinstance(task, TaskCandidate)
            tasks[task.provenance.source_ref] = task
    return tasks, rejected


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, items: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (item if isinstance(item, str) else json.dumps(item) for item in items)
    path.write_text("".join(line + "\n" for line in text))
    return path


def copy_of(tmp_path: Path, questions: list[Any], answers: list[Any]) -> BfclIngestor:
    """A BFCL file and its answers in BFCL's layout (the answers found beside it)."""
    path = write(tmp_path / "BFCL_v4_x.json", questions)
    write(tmp_path / "possible_answer" / "BFCL_v4_x.json", answers)
    return BfclIngestor(path, environments=ENVIRONMENTS)


def test_single_turn_categories_import_and_the_unrepresentable_are_counted() -> None:
    tasks, rejected = read(BfclIngestor(SINGLE))

    assert sorted(tasks) == [
        "live_multiple_27-7-0",
        "live_parallel_3-0-3",
        "live_simple_0-0-0",
        "multiple_0",
        "parallel_0",
        "parallel_multiple_0",
        "simple_python_0",
        "simple_python_1",
    ]
    assert rejected == {"expects_no_call": 1, "expects_any_call": 1, "not_python": 1}
    assert {task.task_kind for task in tasks.values()} == {"tool_call"}


def test_a_simple_task_has_openai_tools_and_the_possible_answer_as_its_call_set() -> None:
    task = read(BfclIngestor(SINGLE))[0]["simple_python_0"]

    assert task.prompt == (
        "Find the area of a triangle with a base of 10 units and height of 5 units."
    )
    assert task.messages is None  # one plain user turn
    assert task.tools is not None
    (tool,) = task.tools
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "calculate_triangle_area"
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object"  # BFCL's "dict"
    assert parameters["required"] == ["base", "height"]
    assert parameters["properties"]["base"]["type"] == "integer"
    assert task.expected_calls == [
        {
            "name": "calculate_triangle_area",
            "arguments": {"base": [10], "height": [5], "unit": ["units", ""]},
        }
    ]
    assert (task.entry_point, task.hidden_tests, task.reference_solution) == (None, None, None)
    assert task.provenance.source_kind == "task_file"
    assert task.provenance.group_key == "bfcl:simple_python_0"
    assert task.provenance.tags == ("bfcl.category:simple_python", "tool:calculate_triangle_area")


def test_dotted_names_become_underscored_in_the_tools_and_the_calls_alike() -> None:
    tasks = read(BfclIngestor(SINGLE))[0]

    factorial = tasks["simple_python_1"]
    assert factorial.tools is not None
    assert [tool["function"]["name"] for tool in factorial.tools] == ["math_factorial"]
    assert factorial.expected_calls == [{"name": "math_factorial", "arguments": {"number": [5]}}]
    parallel = tasks["parallel_0"]  # two calls of spotify.play
    assert parallel.expected_calls is not None
    assert [call["name"] for call in parallel.expected_calls] == ["spotify_play"] * 2


def test_a_float_is_a_number_said_to_be_a_float_and_optional_answers_stay() -> None:
    task = read(BfclIngestor(SINGLE))[0]["multiple_0"]
    assert task.tools is not None

    circle = next(t for t in task.tools if t["function"]["name"] == "circle_properties_get")
    radius = circle["function"]["parameters"]["properties"]["radius"]
    assert (radius["type"], radius["format"]) == ("number", "float")
    assert radius["description"].endswith(" This is a float type value.")
    assert task.expected_calls is not None
    assert task.expected_calls[0]["arguments"]["get_area"] == ["", True]


def test_nested_types_are_converted_as_bfcl_converts_them() -> None:
    doc = {
        "name": "plan.trip",
        "description": "Plan.",
        "parameters": {
            "type": "dict",
            "properties": {
                "stops": {
                    "type": "array",
                    "items": {"type": "dict", "properties": {"at": {"type": "tuple"}}},
                },
                "options": {"type": "dict", "properties": {"speed": {"type": "float"}}},
                "anything": {"type": "any"},
                "untyped": {"description": "no type"},
                "grid": {"type": "array", "items": {"type": "array", "items": {"type": "long"}}},
            },
        },
    }

    (tool,), names = openai_tools([doc])

    assert names == {"plan.trip": "plan_trip"}
    properties = tool["function"]["parameters"]["properties"]
    assert properties["stops"]["items"] == {
        "type": "object",
        "properties": {"at": {"type": "array"}},
    }
    assert properties["options"]["properties"]["speed"]["type"] == "number"
    assert properties["anything"]["type"] == "string"
    assert properties["untyped"]["type"] == "string"
    assert properties["grid"]["items"]["items"]["type"] == "integer"
    assert doc["parameters"]["type"] == "dict"  # the BFCL doc itself is left as it was


def test_a_system_message_makes_the_prompt_messages() -> None:
    task = read(BfclIngestor(SINGLE))[0]["live_multiple_27-7-0"]

    assert task.messages is not None
    assert [message["role"] for message in task.messages] == ["system", "user"]
    assert task.prompt == task.messages[-1]["content"]


ID = "simple_python_0"  # the fixture's first line; 0 below stands for its question or answer
USER = [[{"role": "user", "content": "Find the area."}]]
TOOL = [{"name": "calculate_triangle_area"}]


@pytest.mark.parametrize(
    ("questions", "answers", "reason"),
    [
        (["{not json"], [], "malformed_line"),
        ([["a list"]], [], "malformed_line"),
        ([{"question": []}], [], "malformed_line"),  # no id
        ([0], [], "no_answer"),
        ([], [0], "answer_without_question"),
        ([0, 0], [0], "duplicate_id"),
        ([0], [0, 0], "duplicate_id"),
        ([0], ["{oops", 0], "malformed_answer_line"),
        ([0], [{"id": ID, "ground_truth": [{"area": {"base": [10]}}]}], "answer_unknown_tool"),
        ([0], [{"id": ID, "ground_truth": []}], "expects_no_call"),
        ([0], [{"id": ID, "ground_truth": [{TOOL[0]["name"]: {"base": 10}}]}], "malformed_answer"),
        ([0], [{"id": ID, "ground_truth": "calculate_triangle_area(10)"}], "malformed_answer"),
        ([{"id": ID, "question": USER}], [0], "malformed_entry"),  # no tools
        ([{"id": ID, "question": USER * 2, "function": TOOL}], [0], "malformed_entry"),
        ([{"id": ID, "question": [[{"role": "tool", "content": "4"}]], "function": TOOL}], [0],
         "malformed_entry"),
        ([{"id": ID, "question": [[{"role": "system", "content": "Hi"}]], "function": TOOL}], [0],
         "no_user_message"),
        ([{"id": ID, "question": [[]], "function": TOOL}], [0], "empty_turn"),
        ([{"id": "poetry_0", "question": USER}], [], "unknown_category"),
    ],
)  # fmt: skip
def test_every_entry_that_makes_no_task_is_rejected_with_its_reason(
    tmp_path: Path, questions: list[Any], answers: list[Any], reason: str
) -> None:
    question = lines(SINGLE)[0]
    answer = lines(SINGLE.parent / "possible_answer" / SINGLE.name)[0]
    ingestor = copy_of(
        tmp_path,
        [question if item == 0 else item for item in questions],
        [answer if item == 0 else item for item in answers],
    )

    tasks, rejected = read(ingestor)

    assert rejected == {reason: 1}
    assert len(tasks) == (reason in ("duplicate_id", "malformed_answer_line"))  # the good one


@pytest.mark.parametrize(
    ("names", "reason"),
    [(["a.b", "a_b"], "tool_name_collision"), (["send email"], "invalid_tool_name")],
)
def test_tool_names_openai_cannot_take_are_rejected(
    tmp_path: Path, names: list[str], reason: str
) -> None:
    functions = [{"name": name, "parameters": {"type": "dict", "properties": {}}} for name in names]
    question = {"id": "simple_python_9", "question": [[{"role": "user", "content": "Go."}]]}
    answer = {"id": "simple_python_9", "ground_truth": [{names[0]: {}}]}

    assert read(copy_of(tmp_path, [question | {"function": functions}], [answer]))[1] == {reason: 1}


def test_a_file_without_answers_rejects_each_question(tmp_path: Path) -> None:
    path = write(tmp_path / "BFCL_v4_simple_python.json", lines(SINGLE)[:2])

    assert read(BfclIngestor(path))[1] == {"no_answer": 2}


def test_multi_turn_entries_become_environment_tasks() -> None:
    tasks, rejected = read(BfclIngestor(MULTI, environments=ENVIRONMENTS))

    assert sorted(tasks) == [
        "multi_turn_base_31",
        "multi_turn_base_32",
        "multi_turn_long_context_31",
        "multi_turn_miss_param_31",
    ]
    assert rejected == {"tools_added_mid_episode": 1}  # multi_turn_miss_func_31
    task = tasks["multi_turn_base_31"]
    assert task.task_kind == "environment"
    environment = task.environment
    assert environment is not None
    question = lines(MULTI)[0]
    assert environment["classes"] == {
        "GorillaFileSystem": question["initial_config"]["GorillaFileSystem"],
        "MathAPI": {},  # in involved_classes, with no config
    }
    assert environment["turns"] == question["question"]
    assert task.prompt == question["question"][0][0]["content"]
    assert environment["ground_truth"][0][0] == {
        "name": "mkdir",
        "arguments": {"dir_name": "Reports"},
    }
    assert environment["ground_truth"][1] == [  # cd('Reports'), wc(...), mean([37])
        {"name": "cd", "arguments": {"folder": "Reports"}},
        {"name": "wc", "arguments": {"file_name": "summary.doc", "mode": "c"}},
        {"name": "mean", "arguments": {"numbers": [37]}},
    ]
    assert task.tools is not None
    assert len(task.tools) == 18 + 17  # GorillaFileSystem's and MathAPI's docs
    assert {tool["function"]["parameters"]["type"] for tool in task.tools} == {"object"}
    assert task.provenance.tags == (
        "bfcl.category:multi_turn_base",
        "environment:GorillaFileSystem",
        "environment:MathAPI",
    )


def test_the_variants_of_one_scenario_share_a_group() -> None:
    tasks = read(BfclIngestor(MULTI, environments=ENVIRONMENTS))[0]

    groups = {task_id: task.provenance.group_key for task_id, task in tasks.items()}
    assert groups == {
        "multi_turn_base_31": "bfcl:multi_turn_31",
        "multi_turn_long_context_31": "bfcl:multi_turn_31",
        "multi_turn_miss_param_31": "bfcl:multi_turn_31",
        "multi_turn_base_32": "bfcl:multi_turn_32",
    }
    miss_param = tasks["multi_turn_miss_param_31"].environment
    assert miss_param is not None
    assert miss_param["ground_truth"][1] == []  # the turn where the model must ask


def test_a_stateless_class_gets_no_config_as_bfcl_loads_none(tmp_path: Path) -> None:
    question, answer = lines(MULTI)[0], lines(MULTI.parent / "possible_answer" / MULTI.name)[0]
    question["initial_config"]["MathAPI"] = {"precision": 8}

    task = read(copy_of(tmp_path, [question], [answer]))[0]["multi_turn_base_31"]

    assert task.environment is not None
    assert task.environment["classes"]["MathAPI"] == {}


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("sort('final_report.pdf')", {"name": "sort", "arguments": {"file": "final_report.pdf"}}),
        ("f('a', b=(1, 2))", {"name": "f", "arguments": {"file": "a", "b": [1, 2]}}),
        ("f(b={'k': [None, True]})", {"name": "f", "arguments": {"b": {"k": [None, True]}}}),
    ],
)
def test_ground_truth_calls_take_positional_names_from_the_signature(
    call: str, expected: dict[str, Any]
) -> None:
    assert parse_call(call, {"sort": ["file"], "f": ["file", "b"]}) == expected


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        ("sort(", "unparsable_ground_truth"),
        ("os.system('ls')", "unparsable_ground_truth"),
        ("sort(open('x'))", "unparsable_ground_truth"),
        ("sort('a', 'b')", "unparsable_ground_truth"),
        ("sort('a', file='b')", "unparsable_ground_truth"),
        ("sort(**options)", "unparsable_ground_truth"),
        ("rm(file='x')", "ground_truth_unknown_tool"),
    ],
)
def test_ground_truth_that_is_no_literal_call_of_a_tool_is_rejected(call: str, reason: str) -> None:
    with pytest.raises(Rejected) as rejected:
        parse_call(call, {"sort": ["file"]})
    assert rejected.value.reason == reason


def test_the_bundled_source_runs_the_ground_truth_in_a_fresh_interpreter() -> None:
    """The bundle defines the classes (BFCL's modules importing each other) and its
    long-context variant loads the long scenario: the ground truth gives the same results."""
    tasks = read(BfclIngestor(MULTI, environments=ENVIRONMENTS))[0]
    results = {
        task_id: _run_ground_truth(tasks[task_id].environment)
        for task_id in ("multi_turn_base_31", "multi_turn_long_context_31")
    }

    base, long = results["multi_turn_base_31"], results["multi_turn_long_context_31"]
    assert not any(result.startswith("Error") for result in base + long)
    assert base[-1] == "{'result': 37.0}"  # MathAPI's mean([37])
    assert len(long[2]) > len(base[2])  # cat(data.txt): the long context's padding


def _run_ground_truth(environment: dict[str, Any] | None) -> list[str]:
    script = """
import json, sys
spec = json.load(sys.stdin)
namespace = {}
exec(compile(spec["source"], "environment", "exec"), namespace)
objects = {}
for name, config in spec["classes"].items():
    objects[name] = namespace[name]()
    if hasattr(objects[name], "_load_scenario"):
        objects[name]._load_scenario(config)
results = []
for turn in spec["ground_truth"]:
    for call in turn:
        owner = next(o for o in objects.values() if hasattr(o, call["name"]))
        try:
            results.append(repr(getattr(owner, call["name"])(**call["arguments"])))
        except Exception as error:
            results.append(f"Error: {error!r}")
print(json.dumps(results))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(environment),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    results: list[str] = json.loads(done.stdout)
    return results


def test_multi_turn_without_environment_classes_names_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # as if it were not installed
    ingestor = BfclIngestor(MULTI)
    record = next(iter(ingestor.records()))

    with pytest.raises(InvalidInput, match="--environments DIR"):
        ingestor.convert(record)


def test_the_installed_package_is_the_default_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bfcl_eval").mkdir()
    (tmp_path / "bfcl_eval" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bfcl_eval", raising=False)

    assert default_environments_dir() == (
        tmp_path / "bfcl_eval" / "eval_checker" / "multi_turn_eval" / "func_source_code"
    )


def test_a_missing_environments_directory_is_one_clear_error(tmp_path: Path) -> None:
    ingestor = BfclIngestor(MULTI, environments=tmp_path / "nowhere")

    with pytest.raises(InvalidInput, match="nowhere: no such directory"):
        ingestor.convert(next(iter(ingestor.records())))


def test_the_fingerprint_covers_answers_and_environments(tmp_path: Path) -> None:
    question, answer = lines(MULTI)[:1], lines(MULTI.parent / "possible_answer" / MULTI.name)[:1]
    with_answer = copy_of(tmp_path, question, answer).fingerprint()

    assert copy_of(tmp_path, question, []).fingerprint() != with_answer
    elsewhere = BfclIngestor(MULTI, environments=tmp_path)
    assert BfclIngestor(MULTI, environments=ENVIRONMENTS).fingerprint() != elsewhere.fingerprint()


def test_categories_are_the_ids_prefixes() -> None:
    assert category_of("simple_python_12") == "simple_python"
    assert category_of("live_simple_3-2-1") == "live_simple"
    assert category_of("multi_turn_miss_param_7") == "multi_turn_miss_param"
