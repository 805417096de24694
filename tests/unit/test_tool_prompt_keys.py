"""Prompt keys and near-duplicate texts of OpenAI-format messages (tool calls, text parts)."""

from __future__ import annotations

from typing import Any

from flywheel.signals.content import digest, message_text, prompt_key

USER = {"role": "user", "content": "Why was INV-7 charged twice?"}


def call(arguments: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": arguments},
            }
        ],
    }


def test_plain_messages_keep_the_keys_they_had() -> None:
    # The encoding items were keyed with before tool calls existed: [role, normalised content].
    assert prompt_key([USER]) == digest("prompt", [["user", "Why was INV-7 charged twice?"]])


def test_text_parts_key_as_the_same_text_does() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": USER["content"]}]}
    assert prompt_key([parts]) == prompt_key([USER])
    assert message_text(parts) == USER["content"]


def test_prompts_that_differ_only_in_a_calls_arguments_are_different_prompts() -> None:
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "2 charges"}
    first = prompt_key([USER, call('{"n": "INV-7"}'), tool])
    second = prompt_key([USER, call('{"n": "INV-8"}'), tool])
    assert first != second
    assert message_text(call('{"n": "INV-7"}')) == ""  # no content: a call is no text
