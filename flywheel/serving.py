"""The HTTP protocol `flywheel serve` runs: uvicorn's httptools protocol, with bounds.

uvicorn bounds nothing of a request head: httptools buffers a header of any size and any
number of headers, a connection that never finishes its head (or never sends one) is kept
forever, and `limit_concurrency` only answers 503 once a head is complete. This protocol:

- counts each head's bytes before the parser sees them, and refuses it (431, JSON, connection
  closed) past `max_head_bytes`, past `max_headers` headers or a header over `max_header_bytes`;
- gives a connection `idle_timeout_s` to begin a request (after connecting, or after a
  response), `header_read_timeout_s` to finish a head once begun, and `body_read_timeout_s`
  for the body once the head is in (408, JSON, when nothing was answered yet; else it is cut);
- answers connections past `max_connections` of its process with 503 and closes them.

Every limit comes from `Settings` (`FLYWHEEL_*`), read once per server process.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from flywheel.settings import Settings

HEAD_TOO_LARGE = "request_header_fields_too_large"


@dataclass(frozen=True)
class ServerLimits:
    max_head_bytes: int
    max_header_bytes: int
    max_headers: int
    idle_timeout_s: float
    header_read_timeout_s: float
    body_read_timeout_s: float
    max_connections: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerLimits:
        return cls(
            max_head_bytes=settings.max_head_bytes,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            idle_timeout_s=settings.idle_timeout_s,
            header_read_timeout_s=settings.header_read_timeout_s,
            body_read_timeout_s=settings.body_read_timeout_s,
            max_connections=settings.max_connections,
        )


@functools.cache
def configured_limits() -> ServerLimits:
    """This process's limits (each uvicorn worker reads the same FLYWHEEL_* variables)."""
    return ServerLimits.from_settings(Settings())


class HeadRefused(Exception):
    """Raised from a parser callback: parsing stops, and the head is answered 431."""


def error_answer(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with the JSON error body; the connection closes after it."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """One connection. One deadline at a time: idle (no request begun), head (begun, not
    complete), body (head complete, body not); none while the app works on a whole request."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = configured_limits()
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # of the head being read, counted before the parser sees them
        self._header_count = 0
        self._in_message = False  # a request has begun and its body is not complete
        self._head_done = False  # ... and its head is complete
        self._turned_away = False  # refused at connect: nothing of it is read

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        if len(self.connections) >= self.limits.max_connections:
            self._turn_away(transport)
            return
        super().connection_made(transport)
        self._arm(self.limits.idle_timeout_s, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._turned_away:
            return
        self._unset_keepalive_if_required()
        view = memoryview(data)
        while view and not self.transport.is_closing():
            room = self._room()
            if room <= 0:
                self._refuse_head(f"request head exceeds {self.limits.max_head_bytes} bytes")
                return
            piece, view = view[:room], view[room:]
            if not self._head_done:
                self._head_bytes += len(piece)
            if not self._feed(piece):
                return

    # Parser callbacks (httptools calls them from `feed_data`).
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        self._header_count = 0
        self._arm(self.limits.header_read_timeout_s, self._head_timed_out)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise HeadRefused(f"more than {self.limits.max_headers} request headers")
        if len(name) + len(value) > self.limits.max_header_bytes:
            raise HeadRefused(f"a request header exceeds {self.limits.max_header_bytes} bytes")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._arm(self.limits.body_read_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_message = self._head_done = False
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        between_requests = not self.pipeline and not self._in_message
        super().on_response_complete()
        if between_requests and not self.transport.is_closing():
            self._arm(self.limits.idle_timeout_s, self.transport.close)

    # The limits.
    def _room(self) -> int:
        """How many bytes may be parsed now: what is left of the head's allowance while a head
        is read; else one allowance, so that a pipelined head starting inside a piece is
        counted from the next one."""
        if self._head_done:
            return self.limits.max_head_bytes
        return self.limits.max_head_bytes - self._head_bytes

    def _feed(self, piece: memoryview) -> bool:
        """Parse `piece`; False once the connection is answered and closing."""
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError as error:
            if isinstance(error.__context__, HeadRefused):
                self._refuse_head(str(error.__context__))
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return False
        return True

    def _turn_away(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._turned_away = True
        limit = self.limits.max_connections
        self.logger.warning("Connection limit of %d reached: connection refused.", limit)
        message = f"the server has {limit} open connections; retry shortly"
        transport.write(error_answer(503, "server_busy", message))
        transport.close()

    def _refuse_head(self, message: str) -> None:
        self.logger.warning("Request head refused: %s.", message)
        self._close_with(431, HEAD_TOO_LARGE, message, answer=self._nothing_in_flight())

    def _head_timed_out(self) -> None:
        seconds = self.limits.header_read_timeout_s
        message = f"the request head did not arrive within {seconds:g} s"
        self._close_with(408, "request_timeout", message, answer=self._nothing_in_flight())

    def _body_timed_out(self) -> None:
        cycle, answer = self.cycle, False
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the app's receive() returns a disconnect; its sends
            cycle.message_event.set()  # go nowhere, and the 408 below is the answer
            answer = True
        seconds = self.limits.body_read_timeout_s
        message = f"the request body did not arrive within {seconds:g} s"
        self._close_with(408, "request_timeout", message, answer=answer)

    def _nothing_in_flight(self) -> bool:
        """True when no earlier (pipelined) response is owed: an answer now comes in order."""
        return self.cycle is None or self.cycle.response_complete

    def _close_with(self, status: int, code: str, message: str, *, answer: bool) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        if answer:
            self.transport.write(error_answer(status, code, message))
        self.transport.close()

    def _arm(self, seconds: float, callback: Callable[[], object]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
