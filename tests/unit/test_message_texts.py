"""The texts of an OpenAI chat message that redaction reaches, and what it leaves alone."""

from __future__ import annotations

import orjson

from flywheel.signals.message_texts import map_arguments, map_texts

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_jane",
            "type": "function",
            "function": {
                "name": "email_customer",
                "arguments": '{"to": "jane", "cc": ["jane", 3], "body": {"text": "hi jane"}}',
            },
        }
    ],
}


def upper(text: str) -> str:
    return text.upper()


def test_every_string_inside_the_arguments_is_changed_and_they_stay_a_json_object() -> None:
    mapped = map_texts(CALL, upper)

    call = mapped["tool_calls"][0]
    assert call["id"] == "call_jane"  # ids, types, function names and keys are structure
    assert call["type"] == "function"
    assert call["function"]["name"] == "email_customer"
    assert orjson.loads(call["function"]["arguments"]) == {
        "to": "JANE",
        "cc": ["JANE", 3],
        "body": {"text": "HI JANE"},
    }
    assert mapped["content"] is None
    assert CALL["tool_calls"][0]["function"]["arguments"].startswith('{"to": "jane"')  # type: ignore[index]


def test_unchanged_arguments_are_kept_byte_for_byte() -> None:
    arguments = '{ "n" : 1,  "s": "same" }'
    assert map_arguments(arguments, lambda text: text) == arguments


def test_tool_results_text_parts_and_names_are_texts() -> None:
    tool = {"role": "tool", "tool_call_id": "call_jane", "content": "sent to jane"}
    parts = {"role": "user", "name": "jane", "content": [{"type": "text", "text": "i am jane"}]}

    assert map_texts(tool, upper) == {**tool, "content": "SENT TO JANE"}
    assert map_texts(parts, upper) == {
        "role": "user",
        "name": "JANE",
        "content": [{"type": "text", "text": "I AM JANE"}],
    }
