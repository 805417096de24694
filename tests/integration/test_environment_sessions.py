"""Environment episodes in the real bwrap sandbox: tool calls, state, the final-state reward
and verifier QA, on an order desk written here and on BFCL's (trimmed) file system."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from flywheel.errors import EnvironmentFailed, SandboxUnavailable
from flywheel.sandbox import Limits
from flywheel.sandbox.environment import (
    check_environment_task,
    final_state_reward,
    ground_truth_state,
    open_environment,
)
from flywheel.sandbox.episode import ENVIRONMENT_ZYGOTES
from ingest.bfcl_environments import EnvironmentCatalog

BFCL_ENVIRONMENTS = Path(__file__).parents[1] / "fixtures" / "bfcl" / "environments"
LIMITS = Limits(wall_s=30.0, call_timeout_s=3.0, cpu_s=10, memory_mb=256)

ORDER_DESK = '''
class OrderDesk:
    """A support desk: look an order up, refund it (once, at most its total)."""

    def __init__(self):
        self.orders = {}
        self.refunds = []
        self._audit = []

    def _load_scenario(self, config):
        self.orders = {order["id"]: dict(order) for order in config["orders"]}

    def lookup_order(self, order_id: str) -> dict:
        self._audit.append(("lookup", order_id))
        order = self.orders.get(order_id)
        return dict(order) if order else {"error": f"no order {order_id}"}

    def issue_refund(self, order_id: str, amount: float) -> dict:
        order = self.orders.get(order_id)
        if order is None:
            return {"error": f"no order {order_id}"}
        if order["status"] == "refunded" or amount > order["total"]:
            return {"error": "refund refused"}
        order["status"] = "refunded"
        self.refunds.append((order_id, amount))
        return {"refunded": amount, "order_id": order_id}

    def list_orders(self):
        return sorted(self.orders)

    def note(self, text: str) -> str:
        return "noted: " + text


class Mailer:
    """No _load_scenario: its config's keys become attributes."""

    def send_email(self, to: str, body: str) -> dict:
        self.sent = [*getattr(self, "sent", []), (to, body)]
        return {"sent": True}

    def note(self, text: str) -> str:
        return "the mailer's note"
'''

ORDERS = {
    "orders": [
        {"id": "A-1", "total": 30.0, "status": "delivered"},
        {"id": "B-2", "total": 12.5, "status": "delivered"},
    ]
}
REFUND_B2 = [
    [{"name": "lookup_order", "arguments": {"order_id": "B-2"}}],
    [{"name": "issue_refund", "arguments": {"order_id": "B-2", "amount": 12.5}}],
]


def desk_spec(**overrides: Any) -> dict[str, Any]:
    spec = {
        "source": ORDER_DESK,
        "classes": {"OrderDesk": ORDERS, "Mailer": {"sender": "desk@example.com"}},
        "turns": [[{"role": "user", "content": "Refund my order B-2, please."}]],
        "ground_truth": REFUND_B2,
    }
    return {**spec, **overrides}


def file_system_spec() -> dict[str, Any]:
    root = {
        "alex": {
            "type": "directory",
            "contents": {
                "document": {
                    "type": "directory",
                    "contents": {"notes.txt": {"type": "file", "content": "buy milk"}},
                },
                "archive": {"type": "directory", "contents": {}},
            },
        }
    }
    return {
        # BFCL's own file system, as `flywheel ingest tasks --format bfcl` bundles it.
        "source": EnvironmentCatalog(BFCL_ENVIRONMENTS).source(
            ["GorillaFileSystem"], long_context=False
        ),
        "classes": {"GorillaFileSystem": {"root": root}},
        "turns": [[{"role": "user", "content": "Make a todo.txt in document saying 'call bob'."}]],
        "ground_truth": [
            [
                {"name": "cd", "arguments": {"folder": "document"}},
                {"name": "touch", "arguments": {"file_name": "todo.txt"}},
                {"name": "echo", "arguments": {"content": "call bob", "file_name": "todo.txt"}},
            ]
        ],
    }


def test_an_episode_calls_tools_and_gets_tool_messages() -> None:
    with open_environment(desk_spec(), limits=LIMITS) as session:
        assert session.ended is None
        assert {"lookup_order", "issue_refund", "send_email"} <= set(session.tool_names)
        looked_up = session.call("lookup_order", {"order_id": "B-2"})
        listed = session.call("list_orders", {})
        missing = session.call("lookup_order", {"order_id": "Z-9"})
    assert not looked_up.is_error
    assert json.loads(looked_up.content) == {"id": "B-2", "total": 12.5, "status": "delivered"}
    assert listed.content == "['A-1', 'B-2']"  # not a dict: str(), as BFCL does
    assert json.loads(missing.content) == {"error": "no order Z-9"}  # the tool's own error
    assert not missing.is_error


def test_the_first_class_with_a_tool_answers_and_a_config_without_loader_sets_attributes() -> None:
    with open_environment(desk_spec(), limits=LIMITS) as session:
        assert session.call("note", {"text": "hi"}).content == "noted: hi"
        session.call("send_email", {"to": "kim@example.com", "body": "refunded"})
        state = session.state()
    sent = [("kim@example.com", "refunded")]
    assert state["Mailer"] == {"sender": "desk@example.com", "sent": sent}
    assert set(state["OrderDesk"]) == {"orders", "refunds"}  # _audit is private


def test_the_right_calls_earn_the_reward_and_wrong_or_no_calls_do_not() -> None:
    spec = desk_spec()
    with open_environment(spec, limits=LIMITS) as session:
        session.call("lookup_order", {"order_id": "B-2"})
        session.call("issue_refund", {"order_id": "B-2", "amount": 12.5})
        right = session.state()
    with open_environment(spec, limits=LIMITS) as session:
        session.call("issue_refund", {"order_id": "A-1", "amount": 12.5})  # the wrong order
        wrong = session.state()
    with open_environment(spec, limits=LIMITS) as session:
        untouched = session.state()
    assert right == ground_truth_state(spec, limits=LIMITS)
    assert right["OrderDesk"]["refunds"] == [("B-2", 12.5)]
    assert final_state_reward(spec, right) == 1.0
    assert final_state_reward(spec, wrong) == 0.0
    assert final_state_reward(spec, untouched) == 0.0
    assert final_state_reward(spec, None) == 0.0  # an episode that ended early


def test_lookups_do_not_change_the_state_but_the_order_of_calls_within_it_can() -> None:
    spec = desk_spec()
    with open_environment(spec, limits=LIMITS) as session:
        session.call("issue_refund", {"order_id": "B-2", "amount": 12.5})  # no lookup first
        state = session.state()
    assert final_state_reward(spec, state) == 1.0  # the final state is what is checked


def test_the_ground_truth_state_is_cached_as_a_copy() -> None:
    spec = desk_spec()
    first = ground_truth_state(spec, limits=LIMITS)
    first["OrderDesk"]["refunds"].clear()
    assert ground_truth_state(spec, limits=LIMITS)["OrderDesk"]["refunds"] == [("B-2", 12.5)]


def test_bfcl_file_system_state_compares_its_directories_by_structure() -> None:
    spec = file_system_spec()
    with open_environment(spec, limits=LIMITS) as session:
        assert session.call("cd", {"folder": "document"}).content == (
            '{"current_working_directory": "document"}'
        )
        assert session.call("touch", {"file_name": "todo.txt"}).content == "None"
        session.call("echo", {"content": "call bob", "file_name": "todo.txt"})
        assert json.loads(session.call("cat", {"file_name": "todo.txt"}).content) == {
            "file_content": "call bob"
        }
        state = session.state()
    document = state["GorillaFileSystem"]["root"]["contents"]["document"]
    assert document["contents"]["todo.txt"] == {
        "__object__": "File",
        "name": "todo.txt",
        "content": "call bob",
    }
    assert document["parent"] == {"__cycle__": "Directory"}  # a cycle is a marker
    assert final_state_reward(spec, state) == 1.0
    with open_environment(spec, limits=LIMITS) as session:
        session.call("cd", {"folder": "document"})
        session.call("touch", {"file_name": "todo.txt"})
        session.call("echo", {"content": "call Bob", "file_name": "todo.txt"})  # a typo
        assert final_state_reward(spec, session.state()) == 0.0


def test_qa_finds_bfcl_file_system_and_the_order_desk_usable() -> None:
    for spec in (file_system_spec(), desk_spec()):
        qa = check_environment_task(spec, limits=LIMITS)
        assert qa.status == "usable", qa.reason
        assert "3 of 3" in qa.reason


def test_qa_refuses_a_ground_truth_whose_call_errors() -> None:
    spec = desk_spec(
        ground_truth=[[{"name": "issue_refund", "arguments": {"order": "B-2", "amount": 1}}]]
    )
    qa = check_environment_task(spec, limits=LIMITS)
    assert qa.status == "unusable"
    assert "ground-truth call 1 (issue_refund) failed" in qa.reason
    assert "bad arguments" in qa.reason


def test_qa_refuses_a_ground_truth_that_changes_nothing() -> None:
    lookups_only = [[{"name": "lookup_order", "arguments": {"order_id": "B-2"}}]]
    qa = check_environment_task(desk_spec(ground_truth=lookups_only), limits=LIMITS)
    assert (qa.status, qa.reason) == ("unusable", "doing nothing reaches the ground-truth state")


def test_qa_refuses_a_ground_truth_whose_state_differs_between_runs() -> None:
    source = """
import random

class Dice:
    def roll(self):
        self.last = random.random()
        return self.last
"""
    spec = {
        "source": source,
        "classes": {"Dice": {}},
        "ground_truth": [[{"name": "roll", "arguments": {}}]],
    }
    qa = check_environment_task(spec, limits=LIMITS)
    assert qa.status == "unusable"
    assert qa.is_flaky
    assert qa.reason.startswith("flaky: the ground truth reached one state in 1 of 3 runs")


def test_qa_refuses_a_spec_that_is_not_an_environment() -> None:
    qa = check_environment_task({"source": ORDER_DESK, "classes": ["OrderDesk"]})
    assert qa.status == "unusable"
    assert "classes" in qa.reason


def test_max_steps_bounds_the_calls_of_an_episode() -> None:
    with open_environment(desk_spec(max_steps=2), limits=LIMITS) as session:
        session.call("list_orders", {})
        session.call("list_orders", {})
        third = session.call("list_orders", {})
        assert session.ended is None  # the episode goes on; only the call is refused
        state = session.state()
    assert third.is_error
    assert third.content == "Error: the episode's 2 tool calls are spent"
    assert "OrderDesk" in state


def test_a_closed_session_answers_errors_and_has_no_state() -> None:
    session = open_environment(desk_spec(), limits=LIMITS)
    session.close()
    session.close()  # twice is fine
    result = session.call("list_orders", {})
    assert result.is_error
    assert "closed" in result.content
    with pytest.raises(EnvironmentFailed, match="closed"):
        session.state()


def test_a_session_dropped_without_close_hands_its_sandbox_back() -> None:
    session = open_environment(desk_spec(), limits=LIMITS)
    session.call("list_orders", {})
    assert not ENVIRONMENT_ZYGOTES.wait_returned(0.0)  # lent
    del session
    gc.collect()
    assert ENVIRONMENT_ZYGOTES.wait_returned(5.0)


def test_the_environment_runs_in_the_sandbox() -> None:
    source = """
import os, socket

class Probe:
    def look(self):
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=1).close()
            network = "reachable"
        except OSError as error:
            network = type(error).__name__
        return {"uid": os.getuid(), "environ": dict(os.environ), "network": network,
                "home": os.path.exists("/root"), "cwd": os.getcwd()}
"""
    spec = {"source": source, "classes": {"Probe": {}}, "ground_truth": []}
    with open_environment(spec, limits=LIMITS) as session:
        seen = json.loads(session.call("look", {}).content)
    assert seen["uid"] >= 200_000  # its own unprivileged uid
    assert set(seen["environ"]) <= {"PWD", "LC_CTYPE"}  # nothing of the host's (bwrap's and
    # Python's own locale coercion only)
    assert seen["network"] != "reachable"
    assert seen["home"] is False
    assert seen["cwd"] == "/work"


def test_an_environment_never_runs_unsandboxed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_SANDBOX", "unsafe-local")
    with pytest.raises(SandboxUnavailable, match="unsafe-local"):
        open_environment(desk_spec(), limits=LIMITS)


def test_a_state_cannot_be_forged_through_a_string_nor_lost_to_the_order_of_calls() -> None:
    """The state used to be compared as repr text: a file whose content imitated another
    file's repr passed for that file, and two files made in the other order did not match."""
    spec = file_system_spec()
    made = [("touch", {"file_name": "b.txt"}), ("touch", {"file_name": "c.txt"})]
    spec["ground_truth"] = [[{"name": name, "arguments": args} for name, args in made]]
    assert play(spec, list(reversed(made))) == 1.0
    spec["ground_truth"] = [
        [
            {"name": "touch", "arguments": {"file_name": "b.txt"}},
            {"name": "echo", "arguments": {"content": "y", "file_name": "b.txt"}},
        ]
    ]
    forged = "x>>, 'b.txt': <<File: b.txt, Content: y"
    assert play(spec, [("echo", {"content": forged, "file_name": "notes.txt"})]) == 0.0


def play(spec: dict[str, Any], calls: list[tuple[str, dict[str, Any]]]) -> float:
    with open_environment(spec, limits=LIMITS) as session:
        for name, arguments in calls:
            assert not session.call(name, arguments).is_error
        return final_state_reward(spec, session.state())
