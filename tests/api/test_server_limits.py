"""A real `flywheel serve` process, attacked with raw sockets: bounded request heads (431 or
closed), a body read deadline (408 or cut), idle and head-read deadlines, a connection cap.

The server runs with small timeouts (FLYWHEEL_* variables) so the whole file takes seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

FLYWHEEL = [sys.executable, "-m", "flywheel"]
IDLE_TIMEOUT_S = 2.0  # under uvicorn's own 5 s keep-alive (plus slack), so it is ours
HEADER_READ_TIMEOUT_S = 2.0
BODY_READ_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 8
MAX_HEAD_BYTES = 32 * 1024
MAX_HEADER_BYTES = 8 * 1024
MAX_HEADERS = 100
SLACK_S = 2.0  # a loaded two-core machine: how late a deadline may be seen to fire
RSS_BOUND_KB = 5 * 1024


@dataclass(frozen=True)
class Server:
    port: int
    pid: int

    def rss_kb(self) -> int:
        """VmRSS of the server process and of its worker processes, if any."""
        return sum(_rss_kb(pid) for pid in _process_tree(self.pid))


@dataclass(frozen=True)
class Reply:
    raw: bytes
    closed: bool  # the server closed (EOF or reset) rather than left the connection open

    @property
    def status(self) -> int | None:
        if not self.raw.startswith(b"HTTP/1."):
            return None
        return int(self.raw.split(b" ", 2)[1])

    @property
    def error_code(self) -> str:
        body = self.raw.partition(b"\r\n\r\n")[2]
        return str(json.loads(body)["error"]["code"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _process_tree(pid: int) -> list[int]:
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            found.extend(_process_tree(int(child)))
    return found


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _wait_ready(process: subprocess.Popen[str], base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.terminate()
    output = process.communicate(timeout=30)[0]
    raise AssertionError(f"server did not start: {output}")


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLYWHEEL_")}
    env.update(
        FLYWHEEL_DATABASE_URL=database_url,
        FLYWHEEL_HOME=str(tmp_path_factory.mktemp("serve")),
        FLYWHEEL_IDLE_TIMEOUT_S=str(IDLE_TIMEOUT_S),
        FLYWHEEL_HEADER_READ_TIMEOUT_S=str(HEADER_READ_TIMEOUT_S),
        FLYWHEEL_BODY_READ_TIMEOUT_S=str(BODY_READ_TIMEOUT_S),
        FLYWHEEL_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        FLYWHEEL_MAX_HEAD_BYTES=str(MAX_HEAD_BYTES),
        FLYWHEEL_MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
        FLYWHEEL_MAX_HEADERS=str(MAX_HEADERS),
    )
    port = _free_port()
    process = subprocess.Popen(
        [*FLYWHEEL, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        _wait_ready(process, f"http://127.0.0.1:{port}")
        yield Server(port, process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _connect(server: Server, timeout_s: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _send(sock: socket.socket, data: bytes) -> bool:
    """Send what the server lets through; False once it closed the connection."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def _reply(sock: socket.socket, timeout_s: float) -> Reply:
    """One response (by its Content-Length), or what came before the server closed; a
    connection still open and silent after `timeout_s` gives what it sent, not closed."""
    sock.settimeout(timeout_s)
    raw = b""
    try:
        while not _complete(raw):
            chunk = sock.recv(65536)
            if not chunk:
                return Reply(raw, closed=True)
            raw += chunk
    except ConnectionResetError:
        return Reply(raw, closed=True)
    except TimeoutError:
        return Reply(raw, closed=False)
    return Reply(raw, closed=False)


def _complete(raw: bytes) -> bool:
    head, separator, body = raw.partition(b"\r\n\r\n")
    if not separator:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def _closed_after(sock: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the server closes the connection (reading and dropping what it sends),
    or None if it is still open after `timeout_s`."""
    started = time.monotonic()
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return time.monotonic() - started


def _healthz_is_ok(server: Server) -> bool:
    return httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5).status_code == 200


def _assert_head_refused(reply: Reply) -> None:
    """431 with the JSON error body, or a connection closed without any other answer."""
    if reply.raw:
        assert reply.status == 431, reply.raw[:300]
        assert reply.error_code == "request_header_fields_too_large"
    else:
        assert reply.closed, "the server neither answered nor closed the connection"


def test_an_8_mib_header_is_refused(server: Server) -> None:
    with _connect(server, timeout_s=30) as sock:
        _send(sock, b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
        for _ in range(8 * 16):  # 8 MiB in 64 KiB pieces, until the server closes
            if not _send(sock, b"a" * 65536):
                break
        _send(sock, b"\r\n\r\n")
        reply = _reply(sock, timeout_s=5)

    _assert_head_refused(reply)
    assert _healthz_is_ok(server)


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([f"X-H{index}: v" for index in range(MAX_HEADERS + 1)], id="too-many"),
        pytest.param(["X-Long: " + "a" * MAX_HEADER_BYTES], id="one-too-long"),
        pytest.param([f"X-H{index}: " + "a" * 4000 for index in range(9)], id="head-too-long"),
    ],
)
def test_too_many_or_too_long_headers_get_431_json(server: Server, headers: list[str]) -> None:
    head = "GET /healthz HTTP/1.1\r\nHost: t\r\n" + "".join(f"{h}\r\n" for h in headers)
    with _connect(server) as sock:
        _send(sock, head.encode() + b"\r\n")
        reply = _reply(sock, timeout_s=5)

    _assert_head_refused(reply)
    assert _healthz_is_ok(server)


def test_a_head_at_the_limits_is_served(server: Server) -> None:
    headers = [f"X-H{index}: v" for index in range(MAX_HEADERS - 1)]
    head = "GET /healthz HTTP/1.1\r\nHost: t\r\n" + "".join(f"{h}\r\n" for h in headers)
    with _connect(server) as sock:
        _send(sock, head.encode() + b"\r\n")
        reply = _reply(sock, timeout_s=5)

    assert reply.status == 200, reply.raw[:300]


def _head_of(length: int) -> bytes:
    """A GET /healthz head of exactly `length` bytes, in headers of 4000 bytes or less."""
    head = b"GET /healthz HTTP/1.1\r\nHost: t\r\n"
    while len(head) + 2 < length:
        room = length - 2 - len(head) - len(b"X-Pad: \r\n")
        head += b"X-Pad: " + b"a" * max(1, min(4000, room)) + b"\r\n"
    return head + b"\r\n"


@pytest.mark.parametrize(("extra", "status"), [(0, 200), (1, 431)])
def test_the_head_cap_is_exact(server: Server, extra: int, status: int) -> None:
    head = _head_of(MAX_HEAD_BYTES + extra)
    assert len(head) == MAX_HEAD_BYTES + extra
    with _connect(server) as sock:
        _send(sock, head)
        reply = _reply(sock, timeout_s=5)

    assert reply.status == status, reply.raw[:300]


def test_pipelined_requests_are_all_answered_then_the_connection_idles_out(
    server: Server,
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
    with _connect(server) as sock:
        _send(sock, request * 3)
        raw = b""
        while raw.count(b"HTTP/1.1 200") < 3:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {raw.count(b'HTTP/1.1 200')} answers"
            raw += chunk
        elapsed = _closed_after(sock, timeout_s=IDLE_TIMEOUT_S + SLACK_S)

    assert elapsed is not None


def _stream_unfinished_head(server: Server, seconds: float, closed: list[bool]) -> None:
    """Stream one endless header for `seconds` (32 MiB at most); record whether the server
    closed the connection (a server that stops reading has not closed it)."""
    with _connect(server, timeout_s=seconds) as sock:
        alive = _send(sock, b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Stream: ")
        deadline = time.monotonic() + seconds
        sent = 0
        try:
            while alive and time.monotonic() < deadline and sent < 32 * 1024 * 1024:
                alive = _send(sock, b"a" * 65536)
                sent += 65536
            if alive:
                alive = _closed_after(sock, timeout_s=SLACK_S) is None
        except TimeoutError:
            alive = True
        closed.append(not alive)


def test_streaming_unfinished_heads_cannot_grow_the_server(server: Server) -> None:
    assert _healthz_is_ok(server)  # warm
    before = server.rss_kb()
    closed: list[bool] = []
    streams = [
        threading.Thread(target=_stream_unfinished_head, args=(server, 3.0, closed))
        for _ in range(4)
    ]
    for stream in streams:
        stream.start()
    peak = before
    while any(stream.is_alive() for stream in streams):
        peak = max(peak, server.rss_kb())
        time.sleep(0.05)
    for stream in streams:
        stream.join()
    after = server.rss_kb()

    print(f"streaming heads: RSS {before} kB before, peak {peak} kB, {after} kB after")
    assert closed == [True] * 4
    assert peak - before < RSS_BOUND_KB, f"RSS {before} kB -> peak {peak} kB"
    assert after - before < RSS_BOUND_KB, f"RSS {before} kB -> {after} kB after"
    assert _healthz_is_ok(server)


def _post_head(length: int) -> bytes:
    return (
        b"POST /v1/feedback HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(length).encode() + b"\r\n\r\n"
    )


def _assert_cut(sock: socket.socket, reply: Reply) -> None:
    """408 with the JSON error body and then closed, or closed without an answer."""
    if reply.raw:
        assert (reply.status, reply.error_code) == (408, "request_timeout"), reply.raw[:300]
    assert reply.closed or _closed_after(sock, timeout_s=1) is not None, "left open"


def test_a_stalled_body_is_cut_at_the_deadline(server: Server) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        _send(sock, _post_head(1000) + b'{"kind": ')
        reply = _reply(sock, timeout_s=BODY_READ_TIMEOUT_S + SLACK_S)
        elapsed = time.monotonic() - started
        _assert_cut(sock, reply)

    assert elapsed < BODY_READ_TIMEOUT_S + SLACK_S


def test_a_trickled_body_is_cut_at_the_deadline(server: Server) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        alive = _send(sock, _post_head(1000))
        while alive and time.monotonic() - started < BODY_READ_TIMEOUT_S + SLACK_S:
            alive = _send(sock, b" ")  # one byte at a time keeps a per-read timeout happy
            time.sleep(0.1)
        reply = _reply(sock, timeout_s=0.5)
        _assert_cut(sock, reply)


def test_a_silent_connection_is_closed_after_the_idle_timeout(server: Server) -> None:
    with _connect(server) as sock:
        elapsed = _closed_after(sock, timeout_s=IDLE_TIMEOUT_S + SLACK_S)

    assert elapsed is not None, "a connection that sent nothing was kept open"


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(server: Server) -> None:
    with _connect(server) as sock:
        _send(sock, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = _reply(sock, timeout_s=5)
        elapsed = _closed_after(sock, timeout_s=IDLE_TIMEOUT_S + SLACK_S)

    assert reply.status == 200
    assert not reply.closed
    assert elapsed is not None, "an idle keep-alive connection was kept open"


def test_a_head_sent_slowly_is_cut_at_the_header_deadline(server: Server) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        alive = _send(sock, b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        while alive and time.monotonic() - started < HEADER_READ_TIMEOUT_S + SLACK_S:
            alive = _send(sock, b"X-Slow: v\r\n")  # well under every size cap
            time.sleep(0.2)
        reply = _reply(sock, timeout_s=0.5)
        _assert_cut(sock, reply)


def test_connections_beyond_the_cap_are_refused(server: Server) -> None:
    time.sleep(0.3)  # the server sees earlier tests' connections go
    held = [_connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:  # each one served: the server has accepted and counts it
            _send(sock, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert _reply(sock, timeout_s=5).status == 200
        with _connect(server) as extra:
            _send(extra, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            refused = _reply(extra, timeout_s=5)
    finally:
        for sock in held:
            sock.close()

    assert refused.closed or refused.status == 503, refused.raw[:300]
    if refused.raw:
        assert (refused.status, refused.error_code) == (503, "server_busy")
    time.sleep(0.2)  # the server sees the held connections go
    assert _healthz_is_ok(server)
