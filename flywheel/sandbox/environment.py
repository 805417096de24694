"""Environment tasks: an episode's environment in a sandboxed process, its final-state check
and verifier QA.

An environment is Python source defining classes with tool methods (BFCL's multi-turn
environments are such classes). One episode is one candidate child of a warm zygote (see
harness/candidate.py: its own namespaces, seccomp filter, rlimits and cgroup budget), which
runs harness/environment.py and holds the instances for the whole episode; each tool call goes to
it as one line of the literal channel (harness/literals.py) and its tool message comes back
as one line. Nothing of the environment's runs here; only plain values cross.

The spec (a task's `environment` field):

    {"source": "<module source>", "classes": {"ClassName": {<initial config>}, ...},
     "turns": [[{"role": "user", "content": "..."}], ...],
     "ground_truth": [[{"name": "cd", "arguments": {"folder": "document"}}, ...], ...],
     "max_steps": 20}                                     # optional: tool calls per episode

An environment that raises answers "Error: ..." and the episode goes on; one that loops past
a call's wall clock, overruns its CPU, memory or output budget, or exits, ends the episode:
its calls answer "Error: the environment has ended (<reason>: ...)" and `state()` raises
EnvironmentFailed, which a trainer scores 0. Nothing here ever hangs or crashes the caller.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from flywheel.errors import EnvironmentFailed, InvalidInput
from flywheel.sandbox.episode import Episode
from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import check_available, refuse_unsafe_local

GROUND_TRUTH_RUNS = 3
ENVIRONMENT_LIMITS = Limits(wall_s=900.0, call_timeout_s=5.0, cpu_s=60, memory_mb=512)
"""An episode's limits. The wall clock covers the whole episode, the model's generation
between calls included; each call has its own `call_timeout_s`; `cpu_s` and `memory_mb` are
the environment's for the episode."""
MAX_RESULT_CHARS = 8192
"""A tool message longer than this is cut (in the sandbox) and says by how much."""
MAX_ARGUMENT_BYTES = 1024 * 1024
CACHED_GROUND_TRUTHS = 256
DRIVER = "environment.py"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolResult:
    """One tool call's answer: the tool message's text, and whether it is an error
    (an unknown function, bad arguments, an exception, an ended episode)."""

    content: str
    is_error: bool = False


@dataclass(frozen=True)
class EnvironmentQa:
    status: Literal["usable", "unusable"]
    reason: str
    is_flaky: bool = False


@dataclass(frozen=True)
class _Spec:
    source: str
    classes: dict[str, dict[str, Any]]
    ground_truth: list[tuple[str, dict[str, Any]]]
    max_steps: int | None


class EnvironmentSession:
    """One episode's environment, in its own sandboxed process until `close` (or the end of a
    `with` block, or the session's collection). One call at a time (calls from several threads
    are serialised)."""

    def __init__(self, episode: Episode, *, max_steps: int | None) -> None:
        self._episode = episode
        self._max_steps = max_steps
        self._lock = threading.Lock()
        self._is_closed = False
        # A session dropped without `close` still hands its sandbox back when collected.
        self._release = weakref.finalize(self, episode.release)
        self.tool_names: list[str] = []
        """The environment's tools (public methods), known once it has started."""
        self.steps = 0
        """Tool calls made so far (those refused before reaching the environment excluded)."""

    @property
    def ended(self) -> str | None:
        """Why the episode ended early ("timeout: ...", "memory: ...", "load_error: ..."),
        or None while it runs (and after a plain `close`)."""
        return self._episode.ended

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Call the tool `name` with keyword `arguments`; never raises for what the model or
        the environment does."""
        with self._lock:
            refusal = self._refusal(name, arguments)
            if refusal is not None:
                return ToolResult("Error: " + refusal, is_error=True)
            self.steps += 1
            reply = self._episode.ask("call", (name, dict(arguments)))
            if reply is not None:
                match reply:
                    case ("ok", str(text)):
                        return ToolResult(text)
                    case ("error", str(text)):
                        return ToolResult(text, is_error=True)
                self._episode.end("harness_error", "the environment's reply is not a result")
            return ToolResult(f"Error: the environment has ended ({self.ended})", is_error=True)

    def _refusal(self, name: object, arguments: object) -> str | None:
        """Why a call is not sent to the environment at all, or None."""
        if self._is_closed:
            return "the environment's session is closed"
        if self.ended is not None:
            return f"the environment has ended ({self.ended})"
        if not isinstance(name, str) or not name:
            return "a tool call needs a function name"
        if not isinstance(arguments, Mapping):
            return f"the arguments of {name} must be an object, not {type(arguments).__name__}"
        if self._max_steps is not None and self.steps >= self._max_steps:
            return f"the episode's {self._max_steps} tool calls are spent"
        return self._episode.argument_problem(dict(arguments), MAX_ARGUMENT_BYTES)

    def state(self) -> dict[str, dict[str, Any]]:
        """Each class's public instance attributes, as plain values: an object as its class
        name and public attributes, recursively (never as repr text, which a tool argument
        could forge); see harness/environment.py `_plain`.
        Raises EnvironmentFailed if the episode has ended early or is closed."""
        with self._lock:
            if self._is_closed:
                raise EnvironmentFailed("the environment's session is closed")
            reply = self._episode.ask("state", ()) if self.ended is None else None
            if reply is not None:
                if _is_state(reply):
                    return reply  # type: ignore[no-any-return]
                self._episode.end("harness_error", "the environment's state is not a state")
            raise EnvironmentFailed(f"the environment has ended ({self.ended})")

    def close(self) -> None:
        """End the episode: its process is stopped and its sandbox made ready for another."""
        with self._lock:
            if not self._is_closed:
                self._is_closed = True
                self._release()

    def __enter__(self) -> EnvironmentSession:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _is_state(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(name, str) and isinstance(attributes, dict) for name, attributes in value.items()
    )


def open_environment(
    spec: Mapping[str, Any], *, limits: Limits | None = None
) -> EnvironmentSession:
    """Start one episode of `spec`'s environment in a sandbox of its own; a context manager.

    Raises InvalidInput for a spec that is not an environment spec and SandboxUnavailable
    where sandboxes cannot run (or under the unsafe-local override: an environment never runs
    unsandboxed). An environment that does not load gives a session that has ended
    (`ended` starts with "load_error"), not an exception.
    """
    parsed = _parse(spec)
    refuse_unsafe_local("an environment episode")
    check_available()
    episode = Episode.start(
        resources.files("flywheel.sandbox.harness").joinpath(DRIVER).read_text(),
        limits or ENVIRONMENT_LIMITS,
    )
    session = EnvironmentSession(episode, max_steps=parsed.max_steps)
    options = {"max_result_chars": MAX_RESULT_CHARS}
    names = episode.ask("start", (parsed.source, parsed.classes, options), on_raise="load_error")
    if isinstance(names, list) and all(isinstance(name, str) for name in names):
        session.tool_names = names
    elif episode.ended is None:
        episode.end("harness_error", "the environment's start answered no tool names")
    return session


def ground_truth_state(
    spec: Mapping[str, Any], *, limits: Limits | None = None
) -> dict[str, dict[str, Any]]:
    """The state `spec`'s ground-truth calls produce from its initial config, run in a
    sandbox (the last CACHED_GROUND_TRUTHS are kept: QA found them deterministic). Raises
    EnvironmentFailed when a ground-truth call errors or the episode ends early."""
    key = _key(spec)
    with _CACHE_LOCK:
        cached = _GROUND_TRUTHS.get(key)
        if cached is not None:
            _GROUND_TRUTHS.move_to_end(key)
            return copy.deepcopy(cached)
    state = _run_calls(spec, _parse(spec).ground_truth, limits)
    with _CACHE_LOCK:
        _GROUND_TRUTHS[key] = copy.deepcopy(state)
        while len(_GROUND_TRUTHS) > CACHED_GROUND_TRUTHS:
            _GROUND_TRUTHS.popitem(last=False)
    return state


def final_state_reward(spec: Mapping[str, Any], state: Mapping[str, Any] | None) -> float:
    """1.0 if an episode's final `state` equals the ground truth's, else 0.0; 0.0 for an
    episode without a state (None: it ended early) and when the ground truth does not run.

    >>> final_state_reward({"source": "", "classes": {}, "ground_truth": []}, None)
    0.0
    """
    if state is None:
        return 0.0
    try:
        expected = ground_truth_state(spec)
    except (EnvironmentFailed, InvalidInput) as error:
        log.warning("environment: no ground-truth state, reward 0: %s", error)
        return 0.0
    return 1.0 if state == expected else 0.0


def check_environment_task(
    spec: Mapping[str, Any], *, limits: Limits | None = None
) -> EnvironmentQa:
    """Verifier QA: usable iff the ground-truth calls reach one state in each of
    GROUND_TRUTH_RUNS runs, and doing nothing does not reach it."""
    try:
        calls = _parse(spec).ground_truth
        states = [_run_calls(spec, calls, limits) for _ in range(GROUND_TRUTH_RUNS)]
        untouched = _run_calls(spec, [], limits)
    except (EnvironmentFailed, InvalidInput) as error:
        return EnvironmentQa("unusable", str(error)[:500])
    if any(state != states[0] for state in states[1:]):
        agreeing = max(states.count(state) for state in states)
        return EnvironmentQa(
            "unusable",
            f"flaky: the ground truth reached one state in {agreeing} of {GROUND_TRUTH_RUNS} runs",
            is_flaky=True,
        )
    if untouched == states[0]:
        return EnvironmentQa("unusable", "doing nothing reaches the ground-truth state")
    return EnvironmentQa(
        "usable",
        f"the ground truth reaches its state in {GROUND_TRUTH_RUNS} of {GROUND_TRUTH_RUNS} "
        "runs; doing nothing does not",
    )


def _run_calls(
    spec: Mapping[str, Any], calls: Sequence[tuple[str, dict[str, Any]]], limits: Limits | None
) -> dict[str, dict[str, Any]]:
    with open_environment(spec, limits=limits) as session:
        if session.ended is not None:
            raise EnvironmentFailed(f"the environment does not start: {session.ended}")
        for number, (name, arguments) in enumerate(calls, 1):
            result = session.call(name, arguments)
            if result.is_error:
                raise EnvironmentFailed(
                    f"ground-truth call {number} ({name}) failed: {result.content[:300]}"
                )
        return session.state()


_GROUND_TRUTHS: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def spec_problem(spec: object) -> str | None:
    """What is wrong with an environment spec as a task's (its source, classes and ground truth
    present and well formed), or None: the check a task gets before it is stored.

    >>> spec_problem({"source": "class Shop: ...", "classes": {"Shop": {}}, "ground_truth": []})
    >>> spec_problem({"source": 1, "classes": {}, "ground_truth": []})
    "'environment.source' must be a str"
    """
    if not isinstance(spec, Mapping):
        return "an environment task needs 'environment': source, classes, ground_truth"
    for key, kind in (("source", str), ("classes", dict), ("ground_truth", list)):
        if not isinstance(spec.get(key), kind):
            return f"'environment.{key}' must be a {kind.__name__}"
    try:
        _parse(spec)
    except InvalidInput as error:
        return str(error)
    return None


def _key(spec: Mapping[str, Any]) -> str:
    """What the ground-truth state depends on, hashed."""
    relevant = {field: spec.get(field) for field in ("source", "classes", "ground_truth")}
    text = json.dumps(relevant, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _parse(spec: Mapping[str, Any]) -> _Spec:
    """The parts of an environment spec, or InvalidInput saying what is wrong with it."""
    if not isinstance(spec, Mapping):
        raise InvalidInput("an environment spec must be an object")
    source, classes = spec.get("source"), spec.get("classes")
    if not isinstance(source, str):
        raise InvalidInput("an environment spec needs its source (a string)")
    if not isinstance(classes, Mapping) or not all(
        isinstance(name, str) and isinstance(config, Mapping) for name, config in classes.items()
    ):
        raise InvalidInput("an environment spec's classes must map class names to configs")
    max_steps = spec.get("max_steps")
    if max_steps is not None and (type(max_steps) is not int or max_steps < 1):
        raise InvalidInput("an environment spec's max_steps must be a positive integer")
    return _Spec(
        source,
        {name: dict(config) for name, config in classes.items()},
        _ground_truth(spec.get("ground_truth", [])),
        max_steps,
    )


def _ground_truth(turns: object) -> list[tuple[str, dict[str, Any]]]:
    """The ground truth's calls, turn after turn."""
    if not isinstance(turns, list) or not all(isinstance(turn, list) for turn in turns):
        raise InvalidInput("an environment spec's ground_truth must be a list of turns")
    calls = []
    for turn in turns:
        for call in turn:
            if not (
                isinstance(call, Mapping)
                and isinstance(call.get("name"), str)
                and isinstance(call.get("arguments", {}), Mapping)
            ):
                raise InvalidInput(f"a ground-truth call is not a {{name, arguments}}: {call!r}")
            calls.append((call["name"], dict(call.get("arguments", {}))))
    return calls
