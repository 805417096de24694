"""The stand-in's replies honour `stop` as a model server does: the text ends before the first
stop string it would contain, with finish_reason "stop"."""

from __future__ import annotations

from typing import Any

from flywheel.inference.standin_replies import compose_reply

MODEL = "standin-base"


def request(text: str, **options: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **options}


def test_the_reply_ends_before_the_earliest_stop_string() -> None:
    reply = compose_reply(request("one. two, three", stop=[",", "."]), MODEL)
    assert reply.content == f"reply from {MODEL} to: one"
    assert reply.finish_reason == "stop"
    assert reply.completion_tokens == 5


def test_a_single_stop_string_works_as_a_list_of_one() -> None:
    reply = compose_reply(request("alpha beta gamma", stop=" beta"), MODEL)
    assert (reply.content, reply.finish_reason) == (f"reply from {MODEL} to: alpha", "stop")


def test_stop_strings_not_in_the_reply_change_nothing() -> None:
    plain = compose_reply(request("alpha beta"), MODEL)
    stopped = compose_reply(request("alpha beta", stop=["zzz", "\n"]), MODEL)
    assert stopped == plain


def test_the_token_limit_still_applies_before_a_later_stop() -> None:
    reply = compose_reply(request("a b c d e f", stop=" e", max_tokens=3), MODEL)
    assert (reply.content, reply.finish_reason) == ("reply from standin-base", "length")


def test_a_stop_before_the_token_limit_is_a_stop() -> None:
    reply = compose_reply(request("a b c d e f", stop=" b", max_tokens=6), MODEL)
    assert (reply.content, reply.finish_reason) == (f"reply from {MODEL} to: a", "stop")
