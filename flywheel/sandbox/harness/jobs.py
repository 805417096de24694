"""How a job travels over a Unix socket (stdlib only: the harness scripts import it from
/harness, and the host from this package): an 8-byte big-endian length with the job's pipe
ends attached (SCM_RIGHTS), then that many bytes of JSON."""

import json
import socket
from typing import Any

MAX_FDS = 3  # request, response and results/output pipe ends


def send(channel: socket.socket, job: dict[str, Any], fds: tuple[int, ...]) -> None:
    payload = json.dumps(job).encode()
    socket.send_fds(channel, [len(payload).to_bytes(8, "big")], list(fds))
    channel.sendall(payload)


def receive(channel: socket.socket) -> tuple[Any, tuple[int, ...]]:
    """(job, its descriptors), or (None, ()) once the other side has closed."""
    header, fds, _, _ = socket.recv_fds(channel, 8, MAX_FDS)
    if not header:
        return None, ()
    size, payload = int.from_bytes(header, "big"), b""
    while len(payload) < size:
        chunk = channel.recv(size - len(payload))
        if not chunk:
            return None, ()
        payload += chunk
    return json.loads(payload), tuple(fds)
