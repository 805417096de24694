"""The demo's tool domain (`orders`, flywheel.demo.tools): its files are what the ordinary
commands read, its tasks are judged by the real sandbox, and the chain it runs learns: SFT on a
few demonstrations lifts held-out environment success over the base (which has never cancelled
an order), and GRPO in the sandboxed environment keeps it.

The learning test runs tests/finetune/tool_chain.py's chain (bench/calibrate_tools.py runs it
over the calibration seeds and prints each threshold's margin) for one seed, chosen as the
other learning tests choose theirs (tests/finetune/learning_seed.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter

from finetune.environments import is_judged, sandbox_backend
from flywheel.demo import orders, tools
from flywheel.feedback.values import FeedbackCreate
from flywheel.sandbox import environment
from ingest.jsonl import read_objects
from tests.finetune import learning_seed, tool_chain


def lines(path: Path) -> list[dict[str, Any]]:
    return [row for _, row in read_objects(path)]


def pairs(path: Path) -> set[tuple[str, str]]:
    """(tool, item) of each task's ground-truth call."""
    calls = [row["environment"]["ground_truth"][0][0] for row in lines(path)]
    return {(call["name"], call["arguments"]["item"]) for call in calls}


def pairs_of_calls(path: Path) -> set[tuple[str, str]]:
    """(tool, item) of each call in a file of conversations."""
    calls = [call["function"] for row in lines(path) for message in row["messages"]
             for call in message.get("tool_calls") or ()]  # fmt: skip
    return {(call["name"], call["arguments"]["item"]) for call in calls}


@pytest.mark.no_database
def test_the_files_are_deterministic_and_held_out_pairs_are_never_trained(tmp_path: Path) -> None:
    first = tools.write_tools(tmp_path / "a", quick=False)
    second = tools.write_tools(tmp_path / "b", quick=False)
    for name in ("base_conversations", "held_out_tasks", "train_tasks", "demonstrations"):
        assert getattr(first, name).read_bytes() == getattr(second, name).read_bytes()
    held_out, train = pairs(first.held_out_tasks), pairs(first.train_tasks)
    demos = {(r.tool, r.item) for r in orders.requests("demo")[: tools.DEMONSTRATIONS]}
    assert len(lines(first.held_out_tasks)) == tools.HELD_OUT
    assert demos <= train
    # no held-out order is cancelled in training; the base looked every one of them up
    held_items, train_items = {item for _, item in held_out}, {item for _, item in train}
    assert not held_items & train_items
    looked_up = {item for _, item in pairs_of_calls(first.base_conversations)}
    assert held_items | train_items == looked_up == set(orders.ITEMS)


@pytest.mark.no_database
def test_the_base_never_sees_a_cancel(tmp_path: Path) -> None:
    files = tools.write_tools(tmp_path, quick=True)
    calls = [message["tool_calls"][0]["function"]["name"]
             for row in lines(files.base_conversations) for message in row["messages"]
             if message.get("tool_calls")]  # fmt: skip
    assert set(calls) == {"lookup_order"}


@pytest.mark.no_database
def test_the_demonstrations_are_feedback_the_api_accepts(tmp_path: Path) -> None:
    files = tools.write_tools(tmp_path, quick=True)
    events = [
        TypeAdapter(FeedbackCreate).validate_python(row) for row in lines(files.demonstrations)
    ]
    assert len(events) == 2 * tools.DEMONSTRATIONS
    assert all(event.kind == "correction" for event in events)
    called = [event for event in events if event.value.tool_calls]  # type: ignore[union-attr]
    assert len(called) == tools.DEMONSTRATIONS


@pytest.mark.no_database
def test_each_task_is_judged_by_its_final_state_in_the_sandbox() -> None:
    request = orders.requests("held_out")[0]
    spec = orders.environment_spec(request)
    truth = environment.ground_truth_state(spec)
    assert truth[orders.CLASS_NAME]["orders"][request.item] in ("cancelled", "refunded")
    assert is_judged(spec, sandbox_backend())
    with environment.open_environment(spec) as session:
        other = next(item for item in orders.ITEMS if item not in request.orders)
        wrong = session.call(request.tool, {"item": other})
        assert wrong.is_error
        assert environment.final_state_reward(spec, session.state()) == 0.0
        right = session.call(request.tool, {"item": request.item})
        assert right.content == request.result()
        assert environment.final_state_reward(spec, session.state()) == 1.0


@pytest.mark.no_database
def test_the_summary_rows_read_base_sft_and_grpo() -> None:
    evaluate = {
        "version": 2,
        "summary": {"environment_success": 0.9},
        "against_summary": {"environment_success": 0.0},
        "is_promotable": True,
    }
    cycle = {"steps": {"evaluate": {"result": evaluate},
                       "promote": {"result": {"promoted": True}}}}  # fmt: skip
    sft = {"version": 1, "summary": {"environment_success": 0.6}}
    rows = tools.tool_rows({"cycle": cycle, "sft_eval": sft})
    assert [row["held_out_success"] for row in rows] == [0.0, 0.6, 0.9]
    assert [row["version"] for row in rows] == ["base", "v1", "v2"]
    assert rows[-1]["promoted"] is True
    assert tools.tool_rows({}) == []


@pytest.mark.filterwarnings(
    "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
)
@pytest.mark.no_database
def test_the_chain_learns_the_new_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """base -> SFT -> GRPO on held-out orders (about 5 minutes of one core)."""
    seed, note = learning_seed.chosen_seed()
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as calibrated
    try:
        found = tool_chain.run_chain(tmp_path, seed)
    finally:
        torch.set_num_threads(threads)
    limits = tool_chain.THRESHOLDS

    print(f"tool chain, seed {seed} ({note}): {found}")
    assert found["base"] <= limits.base_success_max  # a lookup changes nothing
    assert found["sft"] - found["base"] >= limits.sft_lift_min
    assert found["grpo"] - found["sft"] >= limits.grpo_lift_min
    assert abs(found["grpo_off"] - found["sft"]) <= limits.disabled_tolerance
