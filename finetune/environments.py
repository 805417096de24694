"""Environment tasks as TRL environments: one class per tool set, one sandboxed episode per rollout.

TRL's `GRPOTrainer(environment_factory={name: factory, ...})` gives each rollout an instance of
the environment its row's `environment` column names; the instance's public methods are the
tools the model may call, `reset(**row)` starts an episode and `get_reward()` scores it (TRL
logs that reward under the class's name). Here:

- `route_environments(rows)` moves each environment task's spec (the export's JSON text in
  `environment`) to `environment_spec` — TRL reserves `environment` for the routing name — and
  names one class per distinct tool set after the spec's environment classes
  (`GorillaFileSystem`, `GorillaFileSystem_TwitterAPI`, ...: the per-environment reward
  columns read as what was trained). Rows of other kinds route to `None`, a class with no
  tools and no reward, so a run can mix them.
- `environment_class(name, tools)` builds the class: each tool of the OpenAI JSON schema
  becomes a method whose signature and Google-style docstring reproduce the schema through
  `transformers.utils.get_json_schema` (for what Python hints can say: scalar types, lists,
  dicts, enums as `(choices: ...)`; nested object properties are not). The method forwards
  every argument as given to the episode's sandboxed session (`flywheel.sandbox.environment`)
  and returns its tool message; bad arguments and unknown tools are the session's "Error: ..."
  answers, never an exception in the trainer.
- `reset` starts opening the episode (`open_environment(spec)`) in a background thread and
  returns: TRL resets a batch's rollouts one after another, then generates their first turns,
  so the batch's sandboxes start side by side while the model generates (a session start is
  most of an episode's environment time: bench/grpo_environment.py). The first tool call or
  `get_reward` waits for it. `get_reward` is `final_state_reward(played spec,
  session.state())`, 0.0 for an episode that ended early, did not start, or was cut off by
  the token or tool-call budget (the trainer marks those), and closes the session. A sandbox
  that cannot run (SandboxUnavailable), or any other failure to open that is not a refused
  spec, is raised by `get_reward`, so the run stops rather than scoring zeros.

Multi-turn (`max_turns`): an episode plays up to `max_turns` of its task's user turns in one
session. The row's prompt holds the first; when the model has answered turn k (a reply without
tool calls), the trainer appends turn k+1's user messages and the model goes on
(finetune.multiturn, inside TRL's tool loop). The reward compares the final state with the state
the played turns' ground truth reaches (`played_spec`, cut to `planned_turns`: the task's turns,
at most `max_turns`); an episode that did not play all of them (the token budget, the round
limit) is cut off: scored 0 and masked. `max_turns=1` plays the first turn only, as before. A
task whose played turns' ground truth changes no state (it only reads) is left out of training
(`is_judged`): doing nothing would reach its state. An episode scored 0 says why in
`zero_reason`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import keyword
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from types import GenericAlias
from typing import Any, ClassVar, Literal, Protocol

from finetune.errors import TrainingInputError
from finetune.rewards import json_cell
from flywheel.errors import FlywheelError, SandboxUnavailable

SPEC_COLUMN = "environment_spec"
ROUTE_COLUMN = "environment"
TURNS_PLAYED = 1
"""Turns an episode plays by default (the GRPO config's `max_turns`)."""
OPENING_THREADS = 8
"""Sessions opened at once in the background (more wait their turn)."""
_RESERVED = frozenset({"reset", "get_reward"})
_HINTS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


class ToolMessage(Protocol):
    content: str


class Session(Protocol):
    """What an episode needs of `flywheel.sandbox.environment.EnvironmentSession`."""

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolMessage: ...
    def state(self) -> dict[str, dict[str, Any]]: ...
    def close(self) -> None: ...


class Backend(Protocol):
    """Where episodes run: `flywheel.sandbox.environment` (the module satisfies this).
    `open_environment` is called from background threads, several at once."""

    def open_environment(self, spec: Mapping[str, Any]) -> Session: ...
    def final_state_reward(self, spec: Mapping[str, Any], state: Mapping[str, Any]) -> float: ...
    def ground_truth_state(self, spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]: ...


def sandbox_backend() -> Backend:
    """The real backend: sandboxed episodes of flywheel.sandbox.environment."""
    backend: Backend = importlib.import_module("flywheel.sandbox.environment")  # a module
    return backend


def is_judged(spec: Mapping[str, Any], backend: Backend, max_turns: int = TURNS_PLAYED) -> bool:
    """Whether the played turns' ground truth changes the state: when it does not (a first
    turn that only reads, `ls` and `cat`), doing nothing would be paid in full. Verifier QA
    checks the whole ground truth; training plays at most `max_turns`, so it checks again.
    A ground truth that does not run is not judged either."""
    played = played_spec(spec, planned_turns(spec, max_turns))
    untouched = {**played, "ground_truth": []}
    try:
        return backend.ground_truth_state(played) != backend.ground_truth_state(untouched)
    except FlywheelError:
        return False


@cache
def _opener() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(OPENING_THREADS, thread_name_prefix="flywheel-episode-open")


def planned_turns(spec: Mapping[str, Any], max_turns: int = TURNS_PLAYED) -> int:
    """How many user turns an episode of `spec` plays: its turns, at most `max_turns` (a spec
    without `turns` has one, its prompt).

    >>> planned_turns({"turns": [["a"], ["b"], ["c"]]}, 2), planned_turns({}, 3)
    (2, 1)
    """
    turns = spec.get("turns")
    return max(1, min(max_turns, len(turns) if isinstance(turns, list) else 1))


def turn_messages(spec: Mapping[str, Any], turn: int) -> list[dict[str, Any]] | None:
    """The user messages of `spec`'s turn `turn` (0-based), None when it has none that a chat
    can take (a role and text content each).

    >>> turn_messages({"turns": [[], [{"role": "user", "content": "Back up."}]]}, 1)
    [{'role': 'user', 'content': 'Back up.'}]
    >>> turn_messages({"turns": [[], [{"role": "user"}]]}, 1) is None
    True
    """
    turns = spec.get("turns")
    messages = turns[turn] if isinstance(turns, list) and 0 <= turn < len(turns) else None
    if not isinstance(messages, list) or not messages:
        return None
    shaped = [
        {"role": str(message["role"]), "content": str(message["content"])}
        for message in messages
        if isinstance(message, Mapping)
        and message.get("role") in ("user", "system")
        and isinstance(message.get("content"), str)
    ]
    return shaped if len(shaped) == len(messages) else None


def played_spec(spec: Mapping[str, Any], turns: int = TURNS_PLAYED) -> dict[str, Any]:
    """The spec cut to the turns an episode plays: its ground truth (and turns) up to `turns`.

    >>> played_spec({"turns": [["a"], ["b"]], "ground_truth": [[1], [2]], "source": ""})
    {'turns': [['a']], 'ground_truth': [[1]], 'source': ''}
    """
    played = dict(spec)
    for key in ("turns", "ground_truth"):
        if isinstance(played.get(key), list):
            played[key] = played[key][:turns]
    return played


# --- tools as methods ---------------------------------------------------------------------


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    function = tool.get("function", tool)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise TrainingInputError(f"a tool without a name: {json.dumps(tool)[:200]}")
    return function


def _is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _hint(schema: Any) -> Any:
    """A Python type hint get_json_schema reads back as `schema`'s type."""
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return GenericAlias(list, (_hint(items),)) if _is_typed(items) else list
    if kind == "object":
        extra = schema.get("additionalProperties")
        return GenericAlias(dict, (str, _hint(extra))) if _is_typed(extra) else dict
    if "enum" in schema and kind is None:
        return Literal.__getitem__(tuple(schema["enum"]))
    return _HINTS.get(kind, str) if isinstance(kind, str) else str


def _is_typed(schema: object) -> bool:
    return isinstance(schema, Mapping) and "type" in schema


def _one_line(text: object) -> str:
    return " ".join(str(text or "").split())


def _docstring(function: Mapping[str, Any], properties: Mapping[str, Any]) -> str:
    lines = [_one_line(function.get("description")) or str(function["name"]), ""]
    if properties:
        lines.append("Args:")
    for name, schema in properties.items():
        described = _one_line(schema.get("description")) or name
        if "enum" in schema and schema.get("type") is not None:
            described += f" (choices: {json.dumps(schema['enum'])})"
        lines.append(f"    {name}: {described}")
    return "\n".join(lines)


def tool_method(tool: Mapping[str, Any]) -> Callable[..., str]:
    """A method for `tool` (an OpenAI tool definition) that forwards its arguments, as the
    model wrote them, to the episode: `self._call(name, arguments)`."""
    function = _function(tool)
    name = str(function["name"])
    parameters = function.get("parameters") or {}
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    if not _is_identifier(name) or name.startswith("_") or name in _RESERVED:
        raise TrainingInputError(f"tool {name!r} cannot be an environment method name")
    bad = [arg for arg in properties if not _is_identifier(arg)]
    if bad:
        raise TrainingInputError(f"tool {name!r}: argument names {bad} are not identifiers")

    def method(self: EnvironmentEpisode, **arguments: Any) -> str:
        return self._call(name, arguments)

    hints = {arg: _hint(schema) for arg, schema in properties.items()}
    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(
            arg,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=hints[arg],
            default=inspect.Parameter.empty if arg in required else None,
        )
        for arg in properties
    ]
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    method.__annotations__ = hints
    method.__doc__ = _docstring(function, properties)
    return method


# --- episodes -------------------------------------------------------------------------------


class EnvironmentEpisode:
    """Base of the generated environment classes: one sandboxed episode per `reset`.

    Public methods of a subclass are tools (TRL lists them), so every method here but `reset`
    and `get_reward` is private (the properties are not functions, so TRL lists none). The
    trainer sets `is_cut_off` (data, not a tool) before rewards: an episode its token or
    tool-call budget stopped is scored 0, as is one that has turns left (`turns_left`).
    """

    _backend: ClassVar[Callable[[], Backend] | None] = None  # None: sandbox_backend
    _tools: ClassVar[list[dict[str, Any]]] = []
    _max_turns: ClassVar[int] = TURNS_PLAYED

    def __init__(self) -> None:
        self._session: Session | None = None
        self._opening: Future[Session] | None = None
        self._raised: BaseException | None = None  # by the open: get_reward raises it
        self._spec: dict[str, Any] | None = None
        self._failure: str | None = None
        self._planned = self._played = 0
        self.is_cut_off = False
        self.zero_reason: str | None = None

    def reset(
        self, *, environment_spec: str | Mapping[str, Any] | None = None, **_row: Any
    ) -> None:
        """Start the row's episode (the prompt already holds its first turn): its session
        opens in the background."""
        self._close()
        self.is_cut_off, self._failure, self._raised, self.zero_reason = False, None, None, None
        self._planned = self._played = 0
        spec = (
            json.loads(environment_spec) if isinstance(environment_spec, str) else environment_spec
        )
        if not isinstance(spec, Mapping):
            self._failure = "the row has no environment spec"
            return None
        self._planned, self._played = planned_turns(spec, type(self)._max_turns), 1
        self._spec = played_spec(spec, self._planned)
        self._opening = _opener().submit(self._the_backend().open_environment, spec)
        return None

    @property
    def turns_played(self) -> int:
        """User turns the episode has begun (the prompt's first included)."""
        return self._played

    @property
    def turns_left(self) -> int:
        """User turns the episode has still to play (0 once all planned turns are under way)."""
        return self._planned - self._played

    def get_reward(self) -> float:
        """1.0 when the episode's final state is the played turns' ground truth's (see
        `played_spec`); 0.0, with `zero_reason` said, otherwise."""
        try:
            reward, self.zero_reason = self._scored()
            return reward
        finally:
            self._close()

    def _scored(self) -> tuple[float, str | None]:
        session = self._started()
        if self._raised is not None:
            raise self._raised
        if session is None or self._spec is None:
            return 0.0, f"the environment did not start ({self._failure or 'no episode'})"
        if self.is_cut_off or self.turns_left:
            where = f"turn {self._played} of {self._planned}"
            return 0.0, f"cut off by the token or round budget (at {where})"
        try:
            state = session.state()
        except FlywheelError as error:  # the episode ended early (crash, budget, exit)
            return 0.0, f"the episode ended early: {error}"
        reward = float(self._the_backend().final_state_reward(self._spec, state))
        return reward, None if reward else "the final state is not the ground truth's"

    def _next_turn(self) -> list[dict[str, Any]] | None:
        """The next user turn's messages (None: no turn left, or one that is no chat messages,
        which leaves the episode with a turn left: cut off)."""
        if self._spec is None or not self.turns_left:
            return None
        return turn_messages(self._spec, self._played)

    def _begin_turn(self) -> None:
        self._played += 1

    def _the_backend(self) -> Backend:
        return (type(self)._backend or sandbox_backend)()

    def _started(self) -> Session | None:
        """The episode's session, once its open is done (None: it did not start)."""
        opening, self._opening = self._opening, None
        if opening is not None:
            try:
                self._session = opening.result()
            except SandboxUnavailable as error:
                self._raised = error
            except FlywheelError as error:  # a spec the sandbox refuses: the episode scores 0
                self._failure = str(error)
            except Exception as error:  # not the episode's doing: get_reward raises it
                self._raised = error
        return self._session

    def _call(self, name: str, arguments: Mapping[str, Any]) -> str:
        session = self._started()
        if session is None:
            reason = self._failure or (str(self._raised) if self._raised else "no episode")
            return f"Error: the environment did not start ({reason})"
        return str(session.call(name, dict(arguments)).content)

    def _close(self) -> None:
        """Close the episode's session (waiting for it to open, if it is still opening)."""
        self._started()
        session, self._session = self._session, None
        if session is not None:
            session.close()


def next_turn(episode: EnvironmentEpisode) -> list[dict[str, Any]] | None:
    """The episode's next user turn's messages, if it has one (finetune.multiturn)."""
    return episode._next_turn()


def begin_turn(episode: EnvironmentEpisode) -> None:
    """Count the episode's next user turn as played: it has been appended."""
    episode._begin_turn()


class NoEnvironment:
    """The route of rows that are not environment tasks: no tools, no reward."""

    def reset(self, **_row: Any) -> None:
        return None


def environment_class(
    name: str,
    tools: Sequence[Mapping[str, Any]],
    backend: Callable[[], Backend] | None = None,
    max_turns: int = TURNS_PLAYED,
) -> type[EnvironmentEpisode]:
    """A class named `name` whose public methods are `tools`, each forwarding to the episode,
    whose episodes play up to `max_turns` user turns."""
    methods: dict[str, Any] = {}
    for tool in tools:
        method = tool_method(tool)
        if method.__name__ in methods:
            raise TrainingInputError(f"environment {name}: tool {method.__name__!r} twice")
        methods[method.__name__] = method
    namespace: dict[str, Any] = {**methods, "_tools": [dict(tool) for tool in tools]}
    namespace["_max_turns"] = max_turns
    namespace["__doc__"] = f"Episodes of {name}: tools {', '.join(methods)}."
    if backend is not None:
        namespace["_backend"] = staticmethod(backend)
    return type(name, (EnvironmentEpisode,), namespace)


def _tool_set_key(tools: Sequence[Mapping[str, Any]]) -> str:
    ordered = sorted(tools, key=lambda tool: str(_function(tool)["name"]))
    return json.dumps(ordered, sort_keys=True)


def _class_name(spec: Mapping[str, Any], taken: set[str]) -> str:
    classes = spec.get("classes")
    parts = [str(part) for part in classes] if isinstance(classes, Mapping) else []
    base = re.sub(r"\W", "_", "_".join(parts)) or "Environment"
    base = base if base[0].isalpha() else f"Env_{base}"
    name, number = base, 2
    while name in taken:
        name, number = f"{base}_{number}", number + 1
    return name


def route_environments(
    rows: Sequence[Mapping[str, Any]],
    backend: Callable[[], Backend] | None = None,
    max_turns: int = TURNS_PLAYED,
) -> tuple[list[dict[str, Any]], dict[str | None, type] | None]:
    """The rows with environment specs moved to `environment_spec` and `environment` set to
    their class's name (None for other kinds), and TRL's `environment_factory` dict (episodes
    of up to `max_turns` user turns) — None when no row is an environment task (the rows are
    then returned with the spec column only).
    An environment task whose played turns change nothing (`is_judged`) is left out, said on
    stderr: its reward would pay an episode that does nothing."""
    routed: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool set -> class name
    factories: dict[str | None, type] = {None: NoEnvironment}
    unjudged: list[str] = []
    for row in rows:
        out = {key: value for key, value in row.items() if key != ROUTE_COLUMN}
        out[SPEC_COLUMN], out[ROUTE_COLUMN] = row.get(ROUTE_COLUMN), None
        if row.get("task_kind") == "environment":
            spec, tools = json_cell(row.get(ROUTE_COLUMN)), json_cell(row.get("tools"))
            if not isinstance(spec, Mapping) or not isinstance(tools, list) or not tools:
                raise TrainingInputError(f"task {row.get('task_id')}: no environment or tools")
            if not is_judged(spec, (backend or sandbox_backend)(), max_turns):
                unjudged.append(str(row.get("task_id")))
                continue
            key = _tool_set_key(tools)
            if key not in names:
                names[key] = _class_name(spec, set(names.values()))
                factories[names[key]] = environment_class(names[key], tools, backend, max_turns)
            out[ROUTE_COLUMN] = names[key]
        routed.append(out)
    if unjudged:
        print(
            f"warning: {len(unjudged)} environment tasks left out: their played turns' ground "
            f"truth changes no state, so doing nothing would be rewarded ({', '.join(unjudged[:5])}"
            f"{', ...' if len(unjudged) > 5 else ''})",
            file=sys.stderr,
        )
    return routed, (factories if names else None)


def preflight_environments(rows: Sequence[Mapping[str, Any]]) -> None:
    """Before any model loads: environment tasks need a working sandbox."""
    if any(row.get("task_kind") == "environment" for row in rows):
        from flywheel.sandbox import check_available

        try:
            check_available()
        except SandboxUnavailable as error:
            raise TrainingInputError(f"environment tasks need the sandbox: {error}") from error


def row_tools(cell: Any) -> list[dict[str, Any]] | None:
    """A row's `tools` cell as a list of tool definitions (None without any).

    >>> row_tools('[{"type": "function", "function": {"name": "f"}}]')
    [{'type': 'function', 'function': {'name': 'f'}}]
    >>> row_tools(None) is None
    True
    """
    tools = json_cell(cell)
    return tools if isinstance(tools, list) and tools else None
