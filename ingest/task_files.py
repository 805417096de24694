"""Task files: HumanEval- and MBPP-style JSONL in, Flywheel's own task JSONL in and out.

Flywheel's format, one task per line (what `export_tasks` writes and `flywheel` reads):

    {"task_id": "...", "kind": "code" | "answer", "prompt": "...", "entry_point": "f",
     "reference_solution": "...", "hidden_tests": "...", "visible_tests": null,
     "answer": null, "language": "python", "group": "...", "verifier_status": "usable",
     "tags": ["topic:strings"]}
    {"task_id": "...", "kind": "tool_call", "prompt": "...", "messages": [...]?,
     "tools": [OpenAI function tools], "expected_calls": [{"name", "arguments": {arg: [ok
     values]}}], "group": "...", "tags": [...]}
    {"task_id": "...", "kind": "environment", "prompt": "...", "tools": [...],
     "environment": {"source", "classes", "turns", "ground_truth", "max_steps"?}, ...}

(the new kinds' fields are those of `flywheel.signals.candidates.TaskCandidate`.)

`prompt` is all a model sees; the hidden tests and the reference never appear in it. `tags`
(optional in every format, a list of strings) label the task for the evaluation's slices;
HumanEval and MBPP files have none of their own, but a curated copy may add them.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from flywheel.errors import InvalidInput
from flywheel.feedback.values import MAX_NAME_CHARS, check_clean_text
from flywheel.sandbox.environment import spec_problem
from flywheel.sandbox.toolcalls import expected_calls_problem, tools_problem
from flywheel.signals.candidates import Candidate, Provenance, TaskCandidate
from flywheel.signals.service import stream_tasks

if TYPE_CHECKING:  # a type only: ingest reads and writes rows through flywheel's services
    from flywheel.signals.models import VerifiableTask
from ingest.bfcl import BfclIngestor
from ingest.framework import SourceRecord
from ingest.jsonl import file_sha256, read_objects

TASK_FORMATS = ("flywheel", "humaneval", "mbpp", "bfcl")
KINDS = ("code", "answer", "tool_call", "environment")


def make_task_ingestor(
    path: Path,
    source_format: str = "flywheel",
    *,
    answers: Path | None = None,
    environments: Path | None = None,
) -> TaskFileIngestor | BfclIngestor:
    """The ingestor of a task file in `source_format`; BFCL's alone takes answers and
    environment classes (see ingest.bfcl)."""
    if source_format == "bfcl":
        return BfclIngestor(path, answers=answers, environments=environments)
    if answers is not None or environments is not None:
        raise InvalidInput("--answers and --environments go with --format bfcl only")
    return TaskFileIngestor(path, source_format)


class TaskFileIngestor:
    source_kind = "task_file"
    version = "task-jsonl/1"
    records_are_groups = False

    def __init__(self, path: Path, source_format: str = "flywheel") -> None:
        if source_format not in CONVERTERS:
            raise InvalidInput(
                f"unknown task format {source_format!r}; known: {', '.join(TASK_FORMATS)}"
            )
        self.path = path
        self.source_format = source_format
        self._convert: Callable[[dict[str, Any], str], TaskCandidate] = CONVERTERS[source_format]

    @property
    def source_ref(self) -> str:
        return str(self.path)

    def fingerprint(self) -> str:
        return file_sha256(self.path)

    def records(self) -> Iterator[SourceRecord]:
        for position, (line, data) in enumerate(read_objects(self.path)):
            yield SourceRecord(position, f"{self.path.name} line {line}", data)

    def convert(self, record: SourceRecord) -> list[Candidate]:
        try:
            return [self._convert(record.payload, self.path.stem)]
        except KeyError as error:
            raise InvalidInput(
                f"{record.ref}: missing {error.args[0]!r} for --format {self.source_format}"
            ) from error
        except (TypeError, ValueError) as error:
            raise InvalidInput(f"{record.ref}: {error}") from error


def _text(data: dict[str, Any], key: str, max_chars: int | None = None) -> str:
    """A string field: no lone surrogates (nothing can store them), within `max_chars`."""
    value = data[key]
    if not isinstance(value, str):
        raise TypeError(f"{key!r} must be a string, not {type(value).__name__}")
    if max_chars is not None and len(value) > max_chars:
        raise ValueError(f"{key!r} is longer than {max_chars} characters")
    try:
        return check_clean_text(value.replace("\x00", ""))
    except ValueError as error:
        raise ValueError(f"{key!r}: {error}") from error


def _optional_text(data: dict[str, Any], key: str, max_chars: int | None = None) -> str | None:
    return _text(data, key, max_chars) if data.get(key) is not None else None


def _provenance(task_id: str, group: str, data: dict[str, Any]) -> Provenance:
    return Provenance("task_file", source_ref=task_id, group_key=group, tags=_tags(data))


def _tags(data: dict[str, Any]) -> tuple[str, ...]:
    tags = data.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise TypeError("'tags' must be a list of strings")
    return tuple(check_clean_text(tag) for tag in tags)


def from_humaneval(data: dict[str, Any], file_stem: str) -> TaskCandidate:
    """HumanEval: the prompt is the stub; the reference is prompt + canonical_solution."""
    task_id = str(data["task_id"])
    prompt = _text(data, "prompt")
    return TaskCandidate(
        provenance=_provenance(task_id, f"{file_stem}:{task_id}", data),
        prompt=prompt,
        entry_point=_text(data, "entry_point", MAX_NAME_CHARS),
        reference_solution=prompt + _text(data, "canonical_solution"),
        hidden_tests=_text(data, "test"),
    )


def from_mbpp(data: dict[str, Any], file_stem: str) -> TaskCandidate:
    """MBPP: a description and asserts. The first assert is shown (as MBPP prompts do),
    all of them run, wrapped in one test function; the entry point is the code's first
    function."""
    task_id = str(data["task_id"])
    code, asserts = _text(data, "code"), data["test_list"]
    if not isinstance(asserts, list) or not asserts:
        raise ValueError("'test_list' must be a non-empty list of asserts")
    setup = data.get("test_setup_code") or ""
    tests = setup + "\n\ndef test_mbpp():\n" + "".join(f"    {line}\n" for line in asserts)
    return TaskCandidate(
        provenance=_provenance(task_id, f"{file_stem}:{task_id}", data),
        prompt=f"{_text(data, 'text')}\nYour code should pass this test:\n{asserts[0]}\n",
        entry_point=_first_function(code),
        reference_solution=code,
        hidden_tests=tests,
        visible_tests=None,
    )


def _first_function(code: str) -> str:
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        raise ValueError(f"'code' does not parse: {error.msg} (line {error.lineno})") from error
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            return node.name
    raise ValueError("'code' defines no function to call")


def from_flywheel(data: dict[str, Any], file_stem: str) -> TaskCandidate:
    kind = data.get("kind", "code")
    if kind not in KINDS:
        raise ValueError(f"'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
    task_id = str(data.get("task_id") or uuid.uuid4())
    if kind in ("tool_call", "environment"):
        return _tool_task(data, kind, task_id, file_stem)
    if kind == "answer" and data.get("answer") is None:
        raise KeyError("answer")
    return TaskCandidate(
        provenance=_provenance(task_id, str(data.get("group") or f"{file_stem}:{task_id}"), data),
        prompt=_text(data, "prompt"),
        entry_point=_optional_text(data, "entry_point", MAX_NAME_CHARS)
        if kind == "answer"
        else _text(data, "entry_point", MAX_NAME_CHARS),
        reference_solution=_optional_text(data, "reference_solution"),
        hidden_tests=_text(data, "hidden_tests") if kind == "code" else None,
        visible_tests=_optional_text(data, "visible_tests"),
        task_kind=kind,
        answer=_optional_text(data, "answer"),
        language=_text({"language": "python"} | data, "language", 32),
    )


def _tool_task(data: dict[str, Any], kind: str, task_id: str, file_stem: str) -> TaskCandidate:
    """A tool_call task (its tools and expected calls) or an environment task (its tools and
    environment), as `task_record` writes them; verifier QA then checks that they work."""
    tools, messages = data.get("tools"), data.get("messages")
    if messages is not None and not (
        isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    ):
        raise TypeError("'messages' must be a list of chat messages")
    if kind == "tool_call":
        problem = expected_calls_problem(data.get("expected_calls"), tools)
        if problem:
            raise ValueError(f"a tool_call task needs 'tools' and 'expected_calls': {problem}")
    else:
        if problem := spec_problem(data.get("environment")):
            raise ValueError(problem)
        if problem := tools_problem(tools):
            raise ValueError(
                f"an environment task needs 'tools', the functions it offers: {problem}"
            )
    return TaskCandidate(
        provenance=_provenance(task_id, str(data.get("group") or f"{file_stem}:{task_id}"), data),
        prompt=_text(data, "prompt"),
        entry_point=None,
        reference_solution=None,
        hidden_tests=None,
        task_kind=kind,
        messages=messages,
        tools=tools,
        expected_calls=data.get("expected_calls") if kind == "tool_call" else None,
        environment=data.get("environment") if kind == "environment" else None,
    )


CONVERTERS: dict[str, Callable[[dict[str, Any], str], TaskCandidate]] = {
    "flywheel": from_flywheel,
    "humaneval": from_humaneval,
    "mbpp": from_mbpp,
}


def export_tasks(
    *, session: Session, domain_id: uuid.UUID, out: IO[str], status: str | None = None
) -> int:
    """Write the domain's tasks (only those with `status`, if given) in Flywheel's format;
    the number written. Streams: memory does not grow with the number of tasks."""
    written = 0
    for task in stream_tasks(session=session, domain_id=domain_id, status=status):
        out.write(json.dumps(task_record(task), ensure_ascii=False) + "\n")
        written += 1
    return written


def task_record(task: VerifiableTask) -> dict[str, Any]:
    return {
        "task_id": task.source_ref or str(task.id),
        "kind": task.task_kind,
        "prompt": task.prompt,
        "entry_point": task.entry_point,
        "reference_solution": task.reference_solution,
        "hidden_tests": task.hidden_tests,
        "visible_tests": task.visible_tests,
        "answer": task.answer,
        "language": task.language,
        "group": task.group_key,
        "verifier_status": task.verifier_status,
        "tags": list(task.tags),
        **{
            name: value
            for name in ("messages", "tools", "expected_calls", "environment")
            if (value := getattr(task, name)) is not None
        },
    }
