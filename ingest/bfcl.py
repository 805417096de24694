"""BFCL task files in: the Berkeley Function Calling Leaderboard's questions and answers.

BFCL (`bfcl-eval` on PyPI, Apache-2.0) ships one JSON-lines file per category,
`BFCL_v4_<category>.json` ({"id", "question": [turn, ...], "function": [tool doc, ...]}, a
turn being a list of chat messages), and the answers, paired by id, in
`possible_answer/BFCL_v4_<category>.json` ({"id", "ground_truth"}), which is where they are
looked for when `--answers` is not given. The category is the id's prefix, as BFCL reads it.

- Single-turn categories (simple_python, parallel, multiple, parallel_multiple and their
  live_* kin) become `tool_call` tasks: the tools in OpenAI's format (converted as BFCL's
  `convert_to_tool` does for OpenAI models: "dict" -> "object", "float" -> "number" noted in
  the description, "tuple" -> "array", "any" and unknown types -> "string"), and the expected
  calls with each argument's acceptable values. OpenAI allows no "." in a function name, so,
  as BFCL does for OpenAI models, every "." becomes "_" in the tools and in the expected calls
  alike (`math.factorial` -> `math_factorial`).
- Multi-turn categories (multi_turn_base, multi_turn_long_context, multi_turn_miss_param)
  become `environment` tasks: the involved classes' source (see ingest.bfcl_environments),
  each class's initial config ({} when the entry has none for it), the classes' tools (all of
  them: BFCL's `excluded_function` names tools its ground truth avoids, and BFCL itself still
  offers them), every turn's user messages and every turn's ground-truth calls, parsed from
  BFCL's Python call strings. The variants of one scenario (`multi_turn_base_31`,
  `multi_turn_long_context_31`, ...) share a group, so they never straddle train and eval.

What cannot be represented yet is rejected with a counted reason, never stored half-right:
irrelevance (the model must call nothing: `expects_no_call`), live_relevance (any call will
do: `expects_any_call`), Java and JavaScript (BFCL checks their arguments as source text of
those languages: `not_python`), multi_turn_miss_func (tools offered only from a later turn:
`tools_added_mid_episode`), memory and web_search (they need BFCL's memory snapshots or the
web: `needs_external_service`). So is every line that is no entry (`malformed_line`), a
question without an answer (`no_answer`), an answer without a question
(`answer_without_question`), and an entry or answer of the wrong shape.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.errors import InvalidInput
from flywheel.feedback.values import check_clean_text
from flywheel.signals.candidates import Candidate, Provenance, TaskCandidate
from ingest.bfcl_environments import (
    CLASS_MODULES,
    ENVIRONMENTS_HELP,
    STATELESS_CLASSES,
    EnvironmentCatalog,
    default_environments_dir,
    parse_call,
)
from ingest.framework import Rejected, SourceRecord
from ingest.jsonl import MAX_LINE_BYTES, file_sha256, open_source

SINGLE_TURN = {
    "simple_python",
    "parallel",
    "multiple",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
}
MULTI_TURN = {"multi_turn_base", "multi_turn_long_context", "multi_turn_miss_param"}
UNSUPPORTED = {
    "irrelevance": "expects_no_call",
    "live_irrelevance": "expects_no_call",
    "live_relevance": "expects_any_call",
    "simple_java": "not_python",
    "simple_javascript": "not_python",
    "multi_turn_miss_func": "tools_added_mid_episode",
    "memory": "needs_external_service",
    "web_search": "needs_external_service",
}
# BFCL's constants.type_mappings.GORILLA_TO_OPENAPI
OPENAI_TYPES = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # what OpenAI accepts as a function name
ROLES = ("system", "user", "assistant")
MISSING: Any = object()  # a question the answers have nothing for


@dataclass(frozen=True)
class BfclEntry:
    """A question with its answer (MISSING if none), or a line or answer that is no task,
    with its (reason, detail)."""

    question: dict[str, Any] | None
    answer: Any = MISSING
    problem: tuple[str, str] | None = None


class BfclIngestor:
    source_kind = "task_file"
    source_format = "bfcl"
    version = "bfcl/1"
    records_are_groups = False

    def __init__(
        self, path: Path, answers: Path | None = None, environments: Path | None = None
    ) -> None:
        self.path = path
        self.answers = answers if answers is not None else _default_answers(path)
        self._environments = environments
        self._catalog: EnvironmentCatalog | None = None

    @property
    def source_ref(self) -> str:
        return str(self.path)

    def fingerprint(self) -> str:
        """Of the questions, the answers and the environment classes together."""
        parts = [file_sha256(self.path), file_sha256(self.answers) if self.answers else "-"]
        directory = self._environments or default_environments_dir()
        parts.append(self.catalog().fingerprint() if directory and directory.is_dir() else "-")
        return hashlib.sha256(" ".join(parts).encode()).hexdigest()

    def catalog(self) -> EnvironmentCatalog:
        if self._catalog is None:
            directory = self._environments or default_environments_dir()
            if directory is None:
                raise InvalidInput(
                    f"{self.path.name}: multi-turn tasks need their environment classes and "
                    f"the bfcl_eval package is not installed: {ENVIRONMENTS_HELP}"
                )
            self._catalog = EnvironmentCatalog(directory)
        return self._catalog

    def records(self) -> Iterator[SourceRecord]:
        """The answer lines that are none, the questions, then the answers no question asked.
        Questions stream; the answers are held by id (BFCL's largest file has 1,053)."""
        answers, problems = _read_answers(self.answers) if self.answers else ({}, [])
        entries = itertools.chain(problems, _entries(self.path, answers))
        for position, (ref, entry) in enumerate(entries):
            yield SourceRecord(position, ref, entry)

    def convert(self, record: SourceRecord) -> list[Candidate]:
        entry: BfclEntry = record.payload
        if entry.problem is not None:
            raise Rejected(*entry.problem)
        assert entry.question is not None  # an entry without a problem has its question
        try:
            return [to_candidate(entry.question, entry.answer, self.catalog)]
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise Rejected("malformed_entry", f"{record.ref}: {error!r}") from error


def _default_answers(path: Path) -> Path | None:
    """BFCL's layout: the answers of data/X.json are in data/possible_answer/X.json."""
    candidate = path.parent / "possible_answer" / path.name
    return candidate if candidate.is_file() else None


def _lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(ref, object or None) for every non-blank line: None when it is no JSON object."""
    with open_source(path) as source:
        number = 0
        while raw := source.readline(MAX_LINE_BYTES + 1):
            number += 1
            if raw.strip():
                yield f"{path.name} line {number}", _parse(raw)


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _read_answers(path: Path) -> tuple[dict[str, Any], list[tuple[str, BfclEntry]]]:
    """The answers' ground truth by id, and the answer lines that are none."""
    answers: dict[str, Any] = {}
    problems = []
    for ref, data in _lines(path):
        if data is None or not isinstance(data.get("id"), str) or "ground_truth" not in data:
            problems.append((ref, _problem("malformed_answer_line", ref)))
        elif data["id"] in answers:
            problems.append((ref, _problem("duplicate_id", f"{ref}: {data['id']}")))
        else:
            answers[data["id"]] = data["ground_truth"]
    return answers, problems


def _entries(path: Path, answers: dict[str, Any]) -> Iterator[tuple[str, BfclEntry]]:
    """Every question line paired with its answer, then the answers no question asked."""
    seen: set[str] = set()
    for ref, data in _lines(path):
        task_id = data.get("id") if data is not None else None
        if data is None or not isinstance(task_id, str):
            yield ref, _problem("malformed_line", ref)
        elif task_id in seen:
            yield ref, _problem("duplicate_id", f"{ref}: {task_id}")
        else:
            seen.add(task_id)
            yield ref, BfclEntry(data, answers.get(task_id, MISSING))
    for task_id in answers.keys() - seen:
        yield f"answer {task_id}", _problem("answer_without_question", task_id)


def _problem(reason: str, detail: str) -> BfclEntry:
    return BfclEntry(None, problem=(reason, detail))


def category_of(task_id: str) -> str:
    """BFCL's category of an id: `simple_python_0`, `live_simple_3-2-1` -> its prefix.

    >>> category_of("live_parallel_multiple_0-0-0"), category_of("multi_turn_base_31")
    ('live_parallel_multiple', 'multi_turn_base')
    """
    match = re.match(r"([a-z_]+?)_\d", task_id)
    return match.group(1) if match else task_id


def to_candidate(
    question: dict[str, Any], answer: Any, catalog: Callable[[], EnvironmentCatalog]
) -> TaskCandidate:
    """The task of one BFCL entry; Rejected, with the reason, when it makes none."""
    task_id = question["id"]
    category = category_of(task_id)
    if category in UNSUPPORTED:
        raise Rejected(UNSUPPORTED[category], task_id)
    if category not in SINGLE_TURN | MULTI_TURN:
        raise Rejected("unknown_category", task_id)
    if answer is MISSING:
        raise Rejected("no_answer", task_id)
    if category in SINGLE_TURN:
        return tool_call_task(question, answer, category)
    return environment_task(question, answer, category, catalog())


def tool_call_task(question: dict[str, Any], answer: Any, category: str) -> TaskCandidate:
    turns = question["question"]
    if not isinstance(turns, list) or len(turns) != 1:
        raise Rejected("malformed_entry", f"{question['id']}: not one turn")
    messages = chat(turns[0])
    tools, names = openai_tools(question["function"])
    calls = expected_calls(answer, names)
    tags = [f"bfcl.category:{category}", *(f"tool:{call['name']}" for call in calls)]
    common = _common(question["id"], f"bfcl:{question['id']}", messages, tags)
    return TaskCandidate(**common, task_kind="tool_call", tools=tools, expected_calls=calls)


def environment_task(
    question: dict[str, Any], answer: Any, category: str, catalog: EnvironmentCatalog
) -> TaskCandidate:
    classes = question["involved_classes"]
    if not isinstance(classes, list) or not classes or not set(classes) <= CLASS_MODULES.keys():
        raise Rejected("unknown_environment", f"{question['id']}: {classes!r}")
    turns = [chat(turn) for turn in question["question"]]
    if not isinstance(answer, list) or len(answer) != len(turns):
        raise Rejected("malformed_answer", f"{question['id']}: not one call list per turn")
    signatures = catalog.signatures(classes)
    config = question.get("initial_config") or {}
    environment = {
        "source": catalog.source(classes, long_context=category == "multi_turn_long_context"),
        "classes": {name: _config(config, name) for name in classes},
        "turns": turns,
        "ground_truth": [[parse_call(str(call), signatures) for call in turn] for turn in answer],
    }
    tools = openai_tools([doc for name in classes for doc in catalog.func_docs(name)])[0]
    group = "bfcl:multi_turn_" + question["id"].rsplit("_", 1)[-1]  # the scenario's variants
    tags = [f"bfcl.category:{category}", *(f"environment:{name}" for name in classes)]
    common = _common(question["id"], group, turns[0], tags)
    return TaskCandidate(**common, task_kind="environment", tools=tools, environment=environment)


def _config(config: dict[str, Any], class_name: str) -> dict[str, Any]:
    """A class's initial config; none for the stateless ones, whose config BFCL never loads
    (MathAPI has no `_load_scenario`: a config would become attributes of it)."""
    return {} if class_name in STATELESS_CLASSES else dict(config.get(class_name) or {})


def _common(
    task_id: str, group: str, messages: list[dict[str, str]], tags: list[str]
) -> dict[str, Any]:
    """The fields both kinds share: the first turn is the prompt (`messages` when it is more
    than one user message)."""
    return {
        "provenance": Provenance(
            "task_file", source_ref=task_id, group_key=group, tags=tuple(dict.fromkeys(tags))
        ),
        "prompt": _prompt(messages, task_id),
        "messages": None if [m["role"] for m in messages] == ["user"] else messages,
        "entry_point": None,
        "reference_solution": None,
        "hidden_tests": None,
    }


def chat(turn: Any) -> list[dict[str, str]]:
    """A turn's messages as plain chat messages (roles system, user, assistant)."""
    if not isinstance(turn, list) or not turn:
        raise Rejected("empty_turn", "a turn without messages")
    messages = []
    for message in turn:
        role, content = message["role"], message["content"]
        if role not in ROLES or not isinstance(content, str):
            raise Rejected("malformed_entry", f"a message of role {role!r}")
        messages.append({"role": role, "content": check_clean_text(content.replace("\x00", ""))})
    return messages


def _prompt(messages: list[dict[str, str]], task_id: str) -> str:
    users = [message["content"] for message in messages if message["role"] == "user"]
    if not users:
        raise Rejected("no_user_message", task_id)
    return users[-1]


def openai_tools(functions: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """BFCL's tool docs as OpenAI tools, and each BFCL name's OpenAI name ("." -> "_")."""
    if not isinstance(functions, list) or not functions:
        raise Rejected("malformed_entry", "no tools")
    tools: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for function in functions:
        name = function["name"].replace(".", "_")
        if not TOOL_NAME.fullmatch(name):
            raise Rejected("invalid_tool_name", repr(function["name"]))
        if name in names.values():
            raise Rejected("tool_name_collision", repr(function["name"]))
        names[function["name"]] = name
        parameters = dict(function.get("parameters") or {})
        parameters["properties"] = _properties(parameters.get("properties") or {})
        description = function.get("description") or ""
        parameters = parameters | {"type": "object"}
        tools.append(
            {
                "type": "function",
                "function": {"name": name, "description": description, "parameters": parameters},
            }
        )
    return tools, names


def _properties(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type`: every property gets an OpenAI type (a missing one is
    "string"); a float is said to be one in its description."""
    converted = {}
    for name, schema in properties.items():
        schema = _schema(schema)
        if properties[name].get("type") == "float":
            schema["format"] = "float"
            schema["description"] = schema.get("description", "") + " This is a float type value."
        converted[name] = schema
    return converted


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    """One property's schema with OpenAI types, its nested properties and items too."""
    schema = dict(schema)
    bfcl_type = schema.get("type")
    schema["type"] = (
        OPENAI_TYPES.get(bfcl_type, "string") if isinstance(bfcl_type, str) else "string"
    )
    if isinstance(schema.get("properties"), dict):
        schema["properties"] = _properties(schema["properties"])
    if isinstance(schema.get("items"), dict):
        schema["items"] = _schema(schema["items"])
    return schema


def expected_calls(ground_truth: Any, names: dict[str, str]) -> list[dict[str, Any]]:
    """BFCL's possible answer ([{name: {argument: [acceptable values]}}, ...]) as the
    contract's call set, under the tools' OpenAI names."""
    if not isinstance(ground_truth, list):
        raise Rejected("malformed_answer", "the ground truth is no list of calls")
    if not ground_truth:
        raise Rejected("expects_no_call", "an empty ground truth")
    calls = []
    for call in ground_truth:
        if not isinstance(call, dict) or len(call) != 1:
            raise Rejected("malformed_answer", f"{call!r} is not one call")
        ((name, arguments),) = call.items()
        if name not in names:
            raise Rejected("answer_unknown_tool", f"{name!r} is none of the task's tools")
        if not isinstance(arguments, dict) or not all(
            isinstance(values, list) for values in arguments.values()
        ):
            raise Rejected("malformed_answer", f"{name}: arguments without lists of values")
        calls.append({"name": names[name], "arguments": arguments})
    return calls
