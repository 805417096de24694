"""Verifier QA of tool-call tasks: the reference calls must match, empty and wrong calls not,
and expected calls that cannot be checked make the task unusable, with the reason."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from flywheel.signals.models import VerifiableTask
from flywheel.signals.verification import (
    ToolCallSpec,
    check_all,
    check_tool_call_task,
    task_spec,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate_triangle_area",
            "parameters": {
                "type": "object",
                "properties": {
                    "base": {"type": "integer"},
                    "height": {"type": "integer"},
                    "unit": {"type": "string"},
                },
                "required": ["base", "height"],
            },
        },
    }
]
EXPECTED = [
    {
        "name": "calculate_triangle_area",
        "arguments": {"base": [10], "height": [5], "unit": ["units", ""]},
    }
]


def qa(expected: Any, tools: Any = TOOLS) -> tuple[str, str]:
    result = check_tool_call_task(ToolCallSpec("t", expected, tools))
    return result.status, result.reason


def test_a_task_whose_reference_matches_is_usable() -> None:
    assert qa(EXPECTED) == ("usable", "reference calls match; empty and wrong calls do not")


@pytest.mark.parametrize(
    ("expected", "tools", "reason"),
    [
        (EXPECTED, None, "no tools offered"),
        ([], TOOLS, "no expected calls"),
        (None, TOOLS, "no expected calls"),
        (
            [{"name": "calculate_triangle_area", "arguments": {"base": 10}}],
            TOOLS,
            "malformed expected call: {'name': 'calculate_triangle_area', 'arguments': "
            "{'base': 10}}",
        ),
        (
            [{"name": "area", "arguments": {}}],
            TOOLS,
            "expected calls name a tool not offered: 'area'",
        ),
        (
            [{"name": "calculate_triangle_area", "arguments": {"base": [10]}}],
            TOOLS,
            "reference calls fail: calculate_triangle_area: missing argument 'height'",
        ),
        (
            [{"name": "calculate_triangle_area", "arguments": {"base": [], "height": [5]}}],
            TOOLS,
            "malformed expected call: {'name': 'calculate_triangle_area', 'arguments': "
            "{'base': [], 'height': [5]}}",
        ),
    ],
)
def test_a_task_that_cannot_be_checked_is_unusable_with_the_reason(
    expected: Any, tools: Any, reason: str
) -> None:
    assert qa(expected, tools) == ("unusable", reason)


def test_qa_of_a_mixed_batch_dispatches_by_spec() -> None:
    done: list[str] = []
    specs = [ToolCallSpec("a", EXPECTED, TOOLS), ToolCallSpec("b", [], TOOLS)]
    results = check_all(specs, workers=2, on_done=lambda result: done.append(result.task_id))
    assert [(result.task_id, result.status) for result in results] == [
        ("a", "usable"),
        ("b", "unusable"),
    ]
    assert sorted(done) == ["a", "b"]


def test_a_stored_tool_call_task_becomes_a_tool_call_spec() -> None:
    task = VerifiableTask(id=uuid.uuid4(), task_kind="tool_call", prompt="Area of a triangle?")
    spec = task_spec(task)
    assert isinstance(spec, ToolCallSpec)
    assert spec.task_id == str(task.id)
