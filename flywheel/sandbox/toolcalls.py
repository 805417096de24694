"""A model's tool calls against a task's expected calls, compared as BFCL compares them.

Pure: no database, no torch, nothing executed. A tool-call task's `expected_calls` lists the
call set the model must make, order-free, one entry per call, each argument mapped to its list
of acceptable values (BFCL's possible-answer convention; an acceptable "" means the argument
may be omitted):

    {"name": "calculate_triangle_area", "arguments": {"base": [10], "unit": ["units", ""]}}

The comparison follows BFCL's AST checker (`bfcl_eval.eval_checker.ast_eval.ast_checker`),
typed by the tool's JSON schema (`tools`, OpenAI format or BFCL's bare function objects):

- a call must name a tool offered (when `tools` is given) and carry no argument its expected
  call does not list; a required parameter (schema `required`) must be given, and so must any
  argument without "" among its acceptable values;
- types are strict as in Python: an integer for a `number`/`float` parameter is fine (BFCL's
  int -> float allowance), a float or "5" for an `integer` is not, a bool is never a number;
  an acceptable value whose type is not the schema's (BFCL's "variable" answers) is compared
  by its own type;
- strings compare after BFCL's standardisation: spaces and `,./-_*^` removed, case folded,
  `'` read as `"` (so "April 1, 2024" matches "april 1 2024");
- a list must equal an acceptable list element by element (strings standardised); a dict's
  keys must be among its acceptable dict's keys, each value among that key's acceptable
  values, a missing key allowed only where "" is acceptable (lists of dicts: element-wise);
- parallel calls match order-free: the calls must pair one-to-one with the expected calls
  (a bipartite matching, where BFCL pairs greedily), as many calls as expected, no more;
- function names compare with "." read as "_" (OpenAI-style APIs refuse dots in names).

Reward: 1.0 for a matching call set, 0.0 otherwise; with `partial_credit` set, a call set
with the right names (as a multiset) but wrong arguments earns that much instead.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPTIONAL = ""
"""An acceptable value meaning "this argument may be omitted"."""

_STANDARDISE = re.compile(r"[ ,./\-_*^]")
_KINDS = {
    "string": "string", "str": "string", "char": "string",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer",
    "number": "number", "float": "number", "double": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "tuple": "array", "list": "array", "arraylist": "array",
    "object": "object", "dict": "object", "hashmap": "object",
    "null": "null",
}  # fmt: skip


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallMatch:
    """How a call set compared: `matched` (the reward's 1.0), `name_ok` (every expected name
    was called), `arguments_ok` (every expected call has a call of its name with acceptable
    arguments), `reason` (short, for people), `reward` and whether it was partial credit."""

    matched: bool
    name_ok: bool
    arguments_ok: bool
    reason: str
    reward: float
    is_partial: bool = False


class MalformedCall(ValueError):
    """A call that is not {"name": str, "arguments": object or JSON text of one}."""


def as_call(call: Mapping[str, Any] | ToolCall) -> ToolCall:
    """A call in any common shape — `{"name", "arguments"}`, OpenAI's `{"type": "function",
    "function": {...}}`, Llama's `"parameters"`, arguments as JSON text — as a `ToolCall`.

    >>> as_call({"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}})
    ToolCall(name='f', arguments={'x': 1})
    >>> try:
    ...     as_call({"name": "f", "arguments": "{x: 1}"})
    ... except MalformedCall as error:
    ...     print(error)
    f: arguments are not JSON (Expecting property name enclosed in double quotes)
    """
    if isinstance(call, ToolCall):
        return call
    body = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(body, Mapping) or not isinstance(body.get("name"), str):
        raise MalformedCall(f"a call without a function name: {str(call)[:80]}")
    name = body["name"]
    arguments = body.get("arguments", body.get("parameters"))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise MalformedCall(f"{name}: arguments are not JSON ({error.msg})") from error
        except (ValueError, RecursionError) as error:  # too many digits, nested too deep
            raise MalformedCall(
                f"{name}: arguments are undecodable ({type(error).__name__})"
            ) from error
    if not isinstance(arguments, dict):
        raise MalformedCall(f"{name}: arguments are not a JSON object")
    return ToolCall(name, arguments)


def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Each offered tool's parameters schema, by its name as compared ("." read as "_")."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function", tool)
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[_key(function["name"])] = (
                dict(parameters) if isinstance(parameters, Mapping) else {}
            )
    return schemas


def _key(name: str) -> str:
    return name.replace(".", "_")


def standardise_string(text: str) -> str:
    """BFCL's string standardisation.

    >>> standardise_string("April 1, 2024") == standardise_string("april 1 2024")
    True
    """
    return _STANDARDISE.sub("", text).lower().replace("'", '"')


# --- one value ----------------------------------------------------------------------------


def _kind_of(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else "other"


def _schema_kinds(schema: Mapping[str, Any] | None) -> set[str]:
    """The schema's types, normalised; empty for an untyped (or "any") parameter."""
    declared = (schema or {}).get("type")
    names = declared if isinstance(declared, list) else [declared]
    return {
        _KINDS[name.lower()] for name in names if isinstance(name, str) and name.lower() in _KINDS
    }


def _fits(kind: str, kinds: set[str]) -> bool:
    return kind in kinds or (kind == "integer" and "number" in kinds)


def value_matches(value: Any, candidate: Any, schema: Mapping[str, Any] | None = None) -> bool:
    """`value` equals the acceptable `candidate`, typed by `schema` (a JSON schema).

    >>> value_matches(5, 5.0, {"type": "number"}), value_matches(5.0, 5, {"type": "integer"})
    (True, False)
    >>> value_matches("5", 5, {"type": "integer"}), value_matches(True, 1, {"type": "integer"})
    (False, False)
    """
    kinds = _schema_kinds(schema)
    if not kinds or not _fits(_kind_of(candidate), kinds):  # untyped, or a BFCL "variable"
        kinds = {_kind_of(candidate)}
    kind = _kind_of(value)
    if not _fits(kind, kinds):
        return False
    if kind == "string":
        return isinstance(candidate, str) and standardise_string(value) == standardise_string(
            candidate
        )
    if kind == "array":
        return isinstance(candidate, list | tuple) and _list_matches(value, candidate, schema)
    if kind == "object":
        return isinstance(candidate, Mapping) and dict_problem(value, candidate, schema) is None
    return bool(value == candidate)  # the kinds agree, so True never equals 1 here


def _list_matches(
    value: Sequence[Any], candidate: Sequence[Any], schema: Mapping[str, Any] | None
) -> bool:
    items = (schema or {}).get("items")
    item_schema = items if isinstance(items, Mapping) else None
    return len(value) == len(candidate) and all(
        value_matches(got, want, item_schema) for got, want in zip(value, candidate, strict=True)
    )


def _acceptable(values: Any) -> list[Any]:
    """An argument's acceptable values as a list (BFCL always writes one; tolerate a bare value)."""
    return list(values) if isinstance(values, list) else [values]


def dict_problem(
    value: Mapping[str, Any], expected: Mapping[str, Any], schema: Mapping[str, Any] | None = None
) -> str | None:
    """Why the arguments (or dict value) `value` are not acceptable by `expected` (each key to
    its acceptable values), None when they are; `schema` types the keys (`properties`,
    `required`).

    >>> expected = {"base": [10], "unit": ["units", ""]}
    >>> dict_problem({"base": 10}, expected), dict_problem({"base": 10, "unit": "Units"}, expected)
    (None, None)
    >>> dict_problem({"unit": "units"}, expected)
    "missing argument 'base'"
    >>> dict_problem({"base": 10, "scale": 2}, expected)
    "unexpected argument 'scale'"
    """
    properties = (schema or {}).get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    for name, got in value.items():
        if name not in expected:
            return f"unexpected argument {name!r}"
        acceptable = _acceptable(expected[name])
        if not any(value_matches(got, candidate, properties.get(name)) for candidate in acceptable):
            return f"{name}={_short(got)} is not among {_short(acceptable)}"
    required = _required(schema)
    for name in [*expected, *required]:
        is_optional = name in expected and OPTIONAL in _acceptable(expected[name])
        if name not in value and (name in required or not is_optional):
            return f"missing argument {name!r}"
    return None


def _required(schema: Mapping[str, Any] | None) -> list[str]:
    required = (schema or {}).get("required")
    return (
        [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    )


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value, default=repr, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tools_problem(tools: Any) -> str | None:
    """Why `tools` are not OpenAI function tools with JSON-schema parameters, None when they
    are: each a function with a name, its parameters an object schema whose properties (and
    array items, nested) are schemas and whose `required` is a list of names.

    >>> tools_problem([{"type": "function", "function": {"name": "f", "parameters": {
    ...     "type": "object", "properties": {"x": "string"}}}}])
    "tool 'f': property 'x' is not a schema"
    """
    if not isinstance(tools, list) or not tools:
        return "no tools offered"
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return f"a tool without a function name: {str(tool)[:80]}"
        problem = _schema_problem(function.get("parameters", {}), "parameters")
        if problem:
            return f"tool {function['name']!r}: {problem}"
    return None


def _schema_problem(schema: Any, where: str, depth: int = 0) -> str | None:
    if not isinstance(schema, Mapping):
        return f"{where} is not a schema"
    if depth > 32:
        return f"{where} is nested too deeply"
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return f"the properties of {where} are not an object"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        return f"the required of {where} is not a list of names"
    for name, inner in properties.items():
        if problem := _schema_problem(inner, f"property {name!r}", depth + 1):
            return problem
    if "items" in schema and (problem := _schema_problem(schema["items"], "items", depth + 1)):
        return f"{where}: {problem}"
    return None


def expected_calls_problem(expected_calls: Any, tools: Any) -> str | None:
    """Why a task's expected calls and tools cannot be checked, None when they can."""
    if problem := tools_problem(tools):
        return problem
    if not isinstance(expected_calls, list) or not expected_calls:
        return "no expected calls"
    offered = tool_schemas(tools)
    for call in expected_calls:
        if not _is_expected_call(call):
            return f"malformed expected call: {str(call)[:120]}"
        if call["name"].replace(".", "_") not in offered:
            return f"expected calls name a tool not offered: {call['name']!r}"
    return None


def _is_expected_call(call: object) -> bool:
    """{"name": str, "arguments": {name: [acceptable values]}}."""
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        return False
    arguments = call.get("arguments", {})
    return isinstance(arguments, Mapping) and all(
        isinstance(values, list) and values for values in arguments.values()
    )


# --- call sets ----------------------------------------------------------------------------


def call_problem(
    call: ToolCall, expected: Mapping[str, Any], schemas: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """Why `call` does not satisfy one expected call, None when it does."""
    if _key(call.name) != _key(str(expected["name"])):
        return f"called {call.name!r}, not {expected['name']!r}"
    arguments = expected.get("arguments") or {}
    problem = dict_problem(call.arguments, arguments, schemas.get(_key(call.name)))
    return f"{call.name}: {problem}" if problem else None


def compare_calls(
    actual: Sequence[Mapping[str, Any] | ToolCall],
    expected: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    partial_credit: float = 0.0,
) -> CallMatch:
    """A model's calls against a task's expected calls (order-free), typed by `tools`.

    >>> tools = [{"type": "function", "function": {"name": "area", "parameters": {
    ...     "type": "object", "required": ["base"],
    ...     "properties": {"base": {"type": "number"}, "unit": {"type": "string"}}}}}]
    >>> expected = [{"name": "area", "arguments": {"base": [10.0], "unit": ["cm", ""]}}]
    >>> compare_calls([{"name": "area", "arguments": {"base": 10}}], expected, tools).reward
    1.0
    >>> result = compare_calls([{"name": "area", "arguments": {"base": 3}}], expected, tools,
    ...                        partial_credit=0.2)
    >>> result.matched, result.name_ok, result.arguments_ok, result.reward, result.reason
    (False, True, False, 0.2, 'area: base=3 is not among [10.0]')
    >>> compare_calls([], expected, tools).reason
    "no call to 'area'"
    """
    try:
        calls = [as_call(call) for call in actual]
    except MalformedCall as error:
        return CallMatch(False, False, False, f"malformed call: {error}", 0.0)
    schemas = tool_schemas(tools)
    wanted = Counter(_key(str(call["name"])) for call in expected)
    made = Counter(_key(call.name) for call in calls)
    name_ok = not wanted - made
    problems = [[call_problem(call, want, schemas) for call in calls] for want in expected]
    unmatched = _unmatched(problems)
    arguments_ok = name_ok and not unmatched
    reason = _reason(calls, expected, schemas, problems, unmatched)
    if reason is None:
        return CallMatch(True, True, True, "calls match", 1.0)
    is_partial = name_ok and wanted == made and partial_credit > 0
    return CallMatch(
        False, name_ok, arguments_ok, reason, partial_credit if is_partial else 0.0, is_partial
    )


def _reason(
    calls: list[ToolCall],
    expected: Sequence[Mapping[str, Any]],
    schemas: Mapping[str, Any],
    problems: list[list[str | None]],
    unmatched: list[int],
) -> str | None:
    """Why the call set does not match (the first thing wrong), None when it does."""
    unknown = [call.name for call in calls if schemas and _key(call.name) not in schemas]
    if unknown:
        return f"unknown function {unknown[0]!r}"
    for index in unmatched:
        name = str(expected[index]["name"])
        same_name = [
            problem for problem in problems[index] if problem and not problem.startswith("called ")
        ]
        return same_name[0] if same_name else f"no call to {name!r}"
    if len(calls) != len(expected):
        return f"{len(calls)} calls where {len(expected)} are expected"
    return None


def _unmatched(problems: list[list[str | None]]) -> list[int]:
    """The expected calls (rows) left without an acceptable call (no problem) in a maximum
    one-to-one matching of expected calls to calls."""
    return unmatched_rows([[problem is None for problem in row] for row in problems])


def unmatched_rows(fits: Sequence[Sequence[bool]]) -> list[int]:
    """The rows left unpaired by a largest one-to-one pairing of rows with columns where
    `fits[row][column]` (Kuhn's augmenting paths; call sets are small).

    >>> unmatched_rows([[True, True], [True, False]]), unmatched_rows([[True], [True]])
    ([], [1])
    """
    owner: dict[int, int] = {}  # column -> row

    def augment(row: int, seen: set[int]) -> bool:
        for column, fits_here in enumerate(fits[row]):
            if fits_here and column not in seen:
                seen.add(column)
                if column not in owner or augment(owner[column], seen):
                    owner[column] = row
                    return True
        return False

    return [row for row in range(len(fits)) if not augment(row, set())]


def reference_calls(
    expected: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The call set a correct model makes: each argument's first acceptable value, optional
    arguments (those with "" acceptable and not `required` by the schema) omitted.

    >>> reference_calls([{"name": "f", "arguments": {"a": [1, 2], "b": ["", "x"],
    ...                   "c": [{"k": ["v"], "o": [""]}]}}])
    [{'name': 'f', 'arguments': {'a': 1, 'c': {'k': 'v'}}}]
    """
    schemas = tool_schemas(tools)
    return [
        {
            "name": call["name"],
            "arguments": _first_values(
                call.get("arguments") or {}, schemas.get(_key(str(call["name"])))
            ),
        }
        for call in expected
    ]


def _first_values(arguments: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    required = _required(schema)
    properties = (schema or {}).get("properties") or {}
    chosen: dict[str, Any] = {}
    for name, values in arguments.items():
        acceptable = _acceptable(values)
        present = [value for value in acceptable if value != OPTIONAL]
        if present and (OPTIONAL not in acceptable or name in required):
            chosen[name] = _first_value(present[0], properties.get(name))
    return chosen


def _first_value(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """A concrete value of an acceptable one (its dicts map keys to acceptable values)."""
    if isinstance(value, Mapping):
        return _first_values(value, schema)
    if isinstance(value, list):
        items = (schema or {}).get("items")
        return [_first_value(item, items if isinstance(items, Mapping) else None) for item in value]
    return value


def wrong_calls(
    expected: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The reference calls made wrong: the first argument whose value can be changed to one
    no acceptable value matches is changed; with none, the first call's name is misspelt.

    >>> wrong_calls([{"name": "f", "arguments": {"a": [1, 8], "b": ["x"]}}])
    [{'name': 'f', 'arguments': {'a': 1, 'b': 'x zq'}}]
    """
    calls = reference_calls(expected, tools)
    schemas = tool_schemas(tools)
    for call, want in zip(calls, expected, strict=True):
        properties = schemas.get(_key(str(call["name"])), {}).get("properties") or {}
        for name, value in call["arguments"].items():
            changed = _perturbed(value)
            acceptable = _acceptable(want["arguments"][name])
            if not any(value_matches(changed, ok, properties.get(name)) for ok in acceptable):
                call["arguments"][name] = changed
                return calls
    if calls:
        calls[0]["name"] = f"{calls[0]['name']}_zq"
    return calls


def _perturbed(value: Any) -> Any:
    """`value` changed, same type: numbers + 7, text + " zq", booleans negated, lists longer."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if isinstance(value, str):
        return value + " zq"
    if isinstance(value, list):
        return [*value, value[0] if value else 1]
    if isinstance(value, dict):
        return {**value, "zq_extra": 1}
    return "zq"
