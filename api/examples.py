"""Request examples of every operation that takes a body, as `openapi_extra=` entries: shown
in /docs and /redoc, and each checked by the test suite to validate as its request model."""

from __future__ import annotations

from typing import Any


def body_examples(**examples: Any) -> dict[str, Any]:
    """`openapi_extra=` giving the request body named examples (FastAPI merges it in)."""
    named = {name: {"value": value} for name, value in examples.items()}
    return {"requestBody": {"content": {"application/json": {"examples": named}}}}


MESSAGES = [{"role": "user", "content": "Why was I charged twice this month?"}]
ANSWER = "You were charged once for May and once for June; the June charge is an early renewal."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_charges",
            "description": "The customer's charges in a month.",
            "parameters": {
                "type": "object",
                "properties": {"month": {"type": "string", "description": "YYYY-MM"}},
                "required": ["month"],
            },
        },
    }
]
TOOL_CALLING = [
    {"role": "system", "content": [{"type": "text", "text": "You are Acme's billing agent."}]},
    {"role": "user", "content": "Why was I charged twice this month?", "name": "u-42"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_7f3a",
                "type": "function",
                "function": {"name": "list_charges", "arguments": '{"month": "2026-06"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_7f3a",
        "content": '[{"for": "2026-05", "amount": 20}, {"for": "2026-06", "amount": 20}]',
    },
]


def _call(arguments: str) -> dict[str, Any]:
    """A response's call of `list_charges` (OpenAI's `tool_calls` item)."""
    function = {"name": "list_charges", "arguments": arguments}
    return {"id": "call_2", "type": "function", "function": function}


ABOUT_INTERACTION = {"interaction_id": "5f0c2f4e-8d7a-4c39-9b7e-1f2a3b4c5d6e", "kind": "rating"}

FEEDBACK_EVENTS: dict[str, dict[str, Any]] = {
    "thumbs": {**ABOUT_INTERACTION, "value": {"thumbs": "up"}, "rater": "u-42"},
    "stars": {**ABOUT_INTERACTION, "value": {"stars": 4}, "event_id": "app-evt-1001"},
    "correction": {
        **ABOUT_INTERACTION,
        "kind": "correction",
        "value": {"text": "Both charges are for May: the second one will be refunded."},
    },
    "tool_call_correction": {
        **ABOUT_INTERACTION,
        "kind": "correction",
        "value": {"tool_calls": [_call('{"month": "2026-05"}')]},
    },
    "outcome": {
        **ABOUT_INTERACTION,
        "kind": "outcome",
        "value": {"success": False, "reason": "ticket reopened"},
    },
    "comparison": {
        "domain": "billing",
        "kind": "comparison",
        "value": {
            "messages": MESSAGES,
            "responses": [ANSWER, "Please contact support."],
            "preferred": 0,
        },
    },
}

INTERACTION = body_examples(
    messages={
        "domain": "billing",
        "messages": MESSAGES,
        "response": ANSWER,
        "model": {"name": "acme.billing", "version": "3"},
        "session_id": "s-1234",
        "metadata": {"app": "help-center"},
    },
    prompt={"domain": "billing", "prompt": "How do I get an invoice?", "response": ANSWER},
    tool_calling={
        "domain": "billing",
        "messages": TOOL_CALLING,
        "tools": TOOLS,
        "response": ANSWER,
        "model": {"name": "acme.billing", "version": "3"},
    },
    calling_a_tool={
        "domain": "billing",
        "messages": TOOL_CALLING[:2],
        "tools": TOOLS,
        "response_tool_calls": [_call('{"month": "2026-06"}')],
    },
)
FEEDBACK = body_examples(**FEEDBACK_EVENTS)
FEEDBACK_BATCH = body_examples(
    batch={"events": [FEEDBACK_EVENTS["thumbs"], FEEDBACK_EVENTS["outcome"]]}
)
TASK = body_examples(
    code={
        "domain": "billing",
        "kind": "code",
        "task_id": "prorate-1",
        "prompt": "Write prorate(amount, days, period) returning the prorated amount.",
        "entry_point": "prorate",
        "reference_solution": (
            "def prorate(amount, days, period):\n    return round(amount * days / period, 2)\n"
        ),
        "hidden_tests": "assert prorate(30, 10, 30) == 10\n",
        "visible_tests": "assert prorate(0, 1, 30) == 0\n",
    },
    answer={"domain": "billing", "kind": "answer", "prompt": "12 * 7 = ?", "answer": "84"},
    tool_call={
        "domain": "billing",
        "kind": "tool_call",
        "prompt": "Refund order B-2 in full.",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "issue_refund",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "order_id": {"type": "string"},
                            "amount": {"type": "number"},
                        },
                        "required": ["order_id"],
                    },
                },
            }
        ],
        "expected_calls": [
            {"name": "issue_refund", "arguments": {"order_id": ["B-2"], "amount": ["", 12.5]}}
        ],
    },
)
RECIPE = body_examples(
    defaults={},
    recipe={
        "eval_fraction": 0.1,
        "replay_fraction": 0.25,
        "curriculum": "easy_first",
        "mix": {"general": 0.2},
        "source_weights": {"ticket": 0.5},
    },
)
PROMOTE = body_examples(
    gated={"version": "3", "reason": "beats v2 on the weekly eval"},
    forced={"version": "3", "reason": "hotfix, gate re-run pending", "force": True},
)
ROLLBACK = body_examples(
    previous={"reason": "complaints about v3"},
    to_version={"to": "1", "reason": "back to the last known good"},
)
RUN = body_examples(cycle={"domain": "billing"})
