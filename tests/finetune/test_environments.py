"""finetune.environments: tools as methods (their schemas read back by transformers), routing
of environment tasks to one class per tool set, and episodes over a session — an in-process
FakeSession here, the real sandboxed one where flywheel.sandbox.environment exists."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from transformers.utils import get_json_schema

from finetune import environments
from finetune.environments import (
    NoEnvironment,
    begin_turn,
    environment_class,
    next_turn,
    played_spec,
    route_environments,
    tool_method,
)
from finetune.errors import TrainingInputError
from flywheel.errors import SandboxUnavailable
from ingest.bfcl import BfclIngestor
from tests.finetune.agent_fixtures import CALL, SPEC, TOOLS, FakeBackend, FakeSession

RICH_TOOL = {
    "type": "function",
    "function": {
        "name": "book_flight",
        "description": "Book a flight between two airports.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "IATA code of the origin."},
                "seats": {"type": "integer", "description": "How many seats."},
                "budget": {"type": "number", "description": "Most to pay, in dollars."},
                "refundable": {"type": "boolean", "description": "Only refundable fares."},
                "stops": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Airports to stop at, in order.",
                },
                "cabin": {
                    "type": "string",
                    "enum": ["economy", "business"],
                    "description": "The cabin class.",
                },
                "extras": {"type": "object", "description": "Extra options."},
            },
            "required": ["origin", "seats"],
        },
    },
}


def env_row(spec: dict[str, Any] = SPEC, tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return {
        "task_id": "t",
        "task_kind": "environment",
        "tools": json.dumps(tools),
        "environment": json.dumps(spec),
    }


@pytest.mark.parametrize("tool", [RICH_TOOL, TOOLS[0]])
def test_a_tool_methods_schema_reads_back_as_the_tool(tool: dict[str, Any]) -> None:
    method = tool_method(tool)

    schema = get_json_schema(method)

    assert method.__name__ == tool["function"]["name"]
    required = schema["function"]["parameters"].pop("required")
    expected = json.loads(json.dumps(tool))
    assert set(required) == set(expected["function"]["parameters"].pop("required"))
    assert schema == expected


@pytest.mark.parametrize(
    ("name", "properties"),
    [("reset", {}), ("_hidden", {}), ("math.factorial", {}), ("f", {"class": {"type": "string"}})],
)
def test_a_tool_that_cannot_be_a_method_is_refused(name: str, properties: dict[str, Any]) -> None:
    tool = {
        "type": "function",
        "function": {"name": name, "parameters": {"properties": properties}},
    }

    with pytest.raises(TrainingInputError):
        tool_method(tool)


def test_rows_route_to_one_class_per_tool_set_named_after_its_environment() -> None:
    other_tools = [RICH_TOOL]
    travel = {
        **SPEC,
        "source": SPEC["source"]
        + "\n\nclass TravelAPI:\n    def book_flight(self, to):\n        self.to = to\n",
        "classes": {"TravelAPI": {}, "GorillaFileSystem": {}},
    }
    rows = [
        env_row(),
        {"task_id": "a", "task_kind": "answer"},
        env_row(),
        env_row(travel, other_tools),
    ]

    routed, factories = route_environments(rows)

    assert factories is not None
    assert [row["environment"] for row in routed] == [
        "GorillaFileSystem",
        None,
        "GorillaFileSystem",
        "TravelAPI_GorillaFileSystem",
    ]
    assert routed[0]["environment_spec"] == rows[0]["environment"]
    assert factories[None] is NoEnvironment
    assert factories["GorillaFileSystem"].__name__ == "GorillaFileSystem"
    assert hasattr(factories["TravelAPI_GorillaFileSystem"], "book_flight")


def test_a_run_without_environment_tasks_has_no_factories() -> None:
    routed, factories = route_environments([{"task_kind": "tool_call", "environment": None}])

    assert factories is None
    assert routed == [{"task_kind": "tool_call", "environment_spec": None, "environment": None}]


def test_an_episode_forwards_calls_and_is_rewarded_by_its_first_turns_final_state() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=FakeBackend)()

    episode.reset(environment_spec=json.dumps(SPEC), task_id="t", prompt=[])
    message = episode.cd(folder="docs")  # type: ignore[attr-defined]
    session = FakeSession.opened[-1]
    reward = episode.get_reward()

    assert message == "ok: /docs"
    assert session.calls == [("cd", {"folder": "docs"})]
    assert reward == 1.0  # the first turn's ground truth; the second is not played
    assert session.is_closed


def test_wrong_calls_bad_arguments_and_cut_off_episodes_score_zero() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=FakeBackend)()

    episode.reset(environment_spec=json.dumps(SPEC))
    bad = episode.cd(directory="docs")  # type: ignore[attr-defined]
    wrong = episode.get_reward()
    episode.reset(environment_spec=SPEC)
    episode.cd(folder="docs")  # type: ignore[attr-defined]
    episode.is_cut_off = True
    cut = episode.get_reward()

    assert bad.startswith("Error: TypeError")
    assert (wrong, cut) == (0.0, 0.0)


def test_a_two_turn_episode_is_rewarded_by_both_turns_ground_truth() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=FakeBackend, max_turns=2)()

    episode.reset(environment_spec=json.dumps(SPEC))
    episode.cd(folder="docs")  # type: ignore[attr-defined]
    left = episode.turns_left
    turn = next_turn(episode)
    begin_turn(episode)
    episode.cd(folder="..")  # type: ignore[attr-defined]
    both = episode.get_reward()
    episode.reset(environment_spec=SPEC)
    episode.cd(folder="docs")  # type: ignore[attr-defined]
    first_only = episode.get_reward()

    assert (left, turn) == (1, [{"role": "user", "content": "Back up."}])
    assert (both, episode.turns_left) == (1.0, 1)
    assert first_only == 0.0  # the first turn's state, one turn short: cut off
    assert episode.zero_reason == "cut off by the token or round budget (at turn 1 of 2)"


def test_max_turns_past_the_tasks_turns_plays_them_all() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=FakeBackend, max_turns=5)()
    one_turn = {**SPEC, "turns": SPEC["turns"][:1], "ground_truth": SPEC["ground_truth"][:1]}

    episode.reset(environment_spec=one_turn)
    episode.cd(folder="docs")  # type: ignore[attr-defined]

    assert (episode.turns_left, next_turn(episode)) == (0, None)
    assert episode.get_reward() == 1.0
    assert episode.zero_reason is None


def test_a_wrong_final_state_and_an_ended_episode_say_why_they_score_zero() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=FakeBackend)()

    episode.reset(environment_spec=SPEC)
    episode.cd(folder="src")  # type: ignore[attr-defined]
    wrong = (episode.get_reward(), episode.zero_reason)
    episode.reset(environment_spec=None)
    unstarted = (episode.get_reward(), episode.zero_reason)

    assert wrong == (0.0, "the final state is not the ground truth's")
    assert unstarted == (0.0, "the environment did not start (the row has no environment spec)")


def test_tasks_are_judged_by_the_turns_played(capsys: pytest.CaptureFixture[str]) -> None:
    """A first turn that changes nothing is left out of one-turn training, kept in two-turn."""
    spec = {**SPEC, "ground_truth": [[], SPEC["ground_truth"][1]]}

    one, _ = route_environments([env_row(spec)], backend=FakeBackend)
    two, factories = route_environments([env_row(spec)], backend=FakeBackend, max_turns=2)

    assert (len(one), len(two)) == (0, 1)
    assert "1 environment tasks left out" in capsys.readouterr().err
    assert factories is not None
    assert factories["GorillaFileSystem"]._max_turns == 2  # type: ignore[attr-defined]


def test_an_episode_without_a_spec_answers_errors_and_scores_zero() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=FakeBackend)()

    episode.reset(environment_spec=None)

    assert episode.cd(folder="docs").startswith("Error: the environment did not start")  # type: ignore[attr-defined]
    assert episode.get_reward() == 0.0


class MeetingBackend(FakeBackend):
    """Sessions that open only once two opens are under way at the same time."""

    meeting = threading.Barrier(2, timeout=5)

    @staticmethod
    def open_environment(spec: Mapping[str, Any]) -> FakeSession:
        MeetingBackend.meeting.wait()
        return FakeSession(spec)


def test_a_batchs_sessions_open_side_by_side_while_reset_returns() -> None:
    episode_class = environment_class("GorillaFileSystem", TOOLS, backend=MeetingBackend)
    episodes = [episode_class(), episode_class()]
    MeetingBackend.meeting.reset()

    for episode in episodes:  # as TRL resets a batch: one after another
        episode.reset(environment_spec=SPEC)
    messages = [episode.cd(folder="docs") for episode in episodes]  # type: ignore[attr-defined]
    rewards = [episode.get_reward() for episode in episodes]

    assert messages == ["ok: /docs"] * 2
    assert rewards == [1.0, 1.0]


class UnavailableBackend(FakeBackend):
    @staticmethod
    def open_environment(spec: Mapping[str, Any]) -> FakeSession:
        raise SandboxUnavailable("bwrap cannot create a user namespace")


def test_a_sandbox_that_cannot_run_stops_the_run_at_the_episodes_reward() -> None:
    episode = environment_class("GorillaFileSystem", TOOLS, backend=UnavailableBackend)()

    episode.reset(environment_spec=SPEC)
    message = episode.cd(folder="docs")  # type: ignore[attr-defined]

    assert message.startswith("Error: the environment did not start (bwrap cannot")
    with pytest.raises(SandboxUnavailable):
        episode.get_reward()


def test_played_spec_keeps_the_first_turn() -> None:
    played = played_spec(SPEC)

    assert played["ground_truth"] == [[CALL]]
    assert len(played["turns"]) == 1
    assert played["source"] == SPEC["source"]


def test_an_episode_in_the_real_sandbox() -> None:
    routed, factories = route_environments([env_row()])
    assert factories is not None
    episode = factories["GorillaFileSystem"]()
    assert type(episode)._the_backend is not None
    assert environments.sandbox_backend().__name__ == "flywheel.sandbox.environment"  # type: ignore[attr-defined]

    episode.reset(**routed[0])
    unknown = episode.cd(directory="docs")
    episode.cd(folder="docs")
    right = episode.get_reward()
    episode.reset(**routed[0])
    episode.cd(folder="src")
    wrong = episode.get_reward()

    assert unknown.startswith("Error")
    assert (right, wrong) == (1.0, 0.0)


def test_an_environment_that_loops_in_its_second_turn_scores_zero_in_the_real_sandbox() -> None:
    looping = SPEC["source"].replace(
        "    def cd(self, folder):\n",
        "    def cd(self, folder):\n        while folder == 'loop':\n            pass\n",
    )
    assert looping != SPEC["source"]
    routed, factories = route_environments([env_row({**SPEC, "source": looping})], max_turns=2)
    assert factories is not None
    episode = factories["GorillaFileSystem"]()

    episode.reset(**routed[0])
    first = episode.cd(folder="docs")
    begin_turn(episode)
    second = episode.cd(folder="loop")  # past the call's wall clock: the episode ends
    reward = episode.get_reward()

    assert first == "ok: /docs"
    assert second.startswith("Error: the environment has ended (timeout")
    assert reward == 0.0
    assert str(episode.zero_reason).startswith("the episode ended early")


def test_a_task_whose_played_turn_changes_nothing_is_left_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """BFCL's multi_turn_base_1 passes QA (its whole ground truth moves files), but its first
    turn only lists the directory (`ls`): trained on that turn alone, an episode that does
    nothing reached the ground-truth state and was paid 1.0."""
    (task,) = [
        candidate
        for record in BFCL.records()
        for candidate in BFCL.convert(record)
        if candidate.provenance.source_ref == "multi_turn_base_1"
    ]
    assert task.environment is not None
    reads_first = bfcl_row(task.environment, task.tools)
    assert task.environment["ground_truth"][0] == [{"name": "ls", "arguments": {"a": True}}]
    moves_first = bfcl_row(
        {**task.environment, "ground_truth": task.environment["ground_truth"][1:]}, task.tools
    )

    routed, factories = route_environments([reads_first, moves_first])

    assert [row["task_id"] for row in routed] == ["moves_first"]
    assert "1 environment tasks left out" in capsys.readouterr().err
    assert factories is not None
    episode = factories[routed[0]["environment"]]()
    episode.reset(**routed[0])
    assert episode.get_reward() == 0.0  # doing nothing is not paid


BFCL = BfclIngestor(
    Path(__file__).parents[1] / "fixtures" / "bfcl" / "BFCL_v4_multi_turn_file_system.json",
    environments=Path(__file__).parents[1] / "fixtures" / "bfcl" / "environments",
)


def bfcl_row(spec: dict[str, Any], tools: Any) -> dict[str, Any]:
    name = "reads_first" if spec["ground_truth"][0][0]["name"] == "ls" else "moves_first"
    return {
        "task_id": name,
        "task_kind": "environment",
        "environment": json.dumps(spec),
        "tools": json.dumps(tools),
    }
