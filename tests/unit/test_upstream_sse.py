"""The upstream's SSE decoding and error messages, on bytes as a network delivers them."""

from __future__ import annotations

import orjson
import pytest

from flywheel.inference.backends import BackendError
from flywheel.inference.upstream import (
    MAX_MESSAGE_CHARS,
    SseEvents,
    is_already_loaded,
    parse_chunk,
    upstream_error,
)


def test_events_split_anywhere_across_pieces_come_out_whole() -> None:
    stream = (
        b'data: {"a": 1}\r\n\r\n: a comment\n\ndata: {"b":\ndata: 2}\n\n'
        b"event: x\n\ndata: [DONE]\n\n"
    )
    for cut in range(1, len(stream)):
        events = SseEvents()
        out = events.feed(stream[:cut]) + events.feed(stream[cut:])
        assert out == [b'{"a": 1}', b'{"b":\n2}', b"[DONE]"], cut


def test_an_event_waits_for_the_blank_line_that_ends_it() -> None:
    events = SseEvents()
    assert events.feed(b'data: {"a": 1}\n') == []
    assert events.feed(b"\n") == [b'{"a": 1}']


def test_an_error_event_mid_stream_is_an_upstream_error() -> None:
    event = b'{"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}'
    with pytest.raises(BackendError) as caught:
        parse_chunk(event)
    assert (caught.value.kind, caught.value.message) == ("upstream_error", "engine died")
    with pytest.raises(BackendError, match="invalid JSON"):
        parse_chunk(b"{not json")


def test_the_upstreams_message_is_cut_and_a_non_json_body_is_never_passed_on() -> None:
    long = orjson.dumps({"error": {"message": "x" * 5000}})
    assert len(upstream_error(500, long).message) < MAX_MESSAGE_CHARS + 40
    html = b"<html>nginx internal 10.0.0.7</html>"
    assert upstream_error(502, html).message == "the upstream answered 502: HTTP 502"
    flat = orjson.dumps({"object": "error", "message": "bad", "code": 400})
    assert upstream_error(400, flat).message == "the upstream answered 400: bad"


def test_only_vllms_already_loaded_400_counts_as_loaded() -> None:
    loaded = orjson.dumps({"error": {"message": "The lora adapter 'a' has already been loaded."}})
    assert is_already_loaded(400, loaded)
    old_vllm = {"object": "error", "message": "The lora adapter 'a' has already been loaded."}
    assert is_already_loaded(400, orjson.dumps(old_vllm))
    other = {"error": {"message": "Both 'lora_name' and 'lora_path' must be provided."}}
    assert not is_already_loaded(400, orjson.dumps(other))
    assert not is_already_loaded(500, loaded)
