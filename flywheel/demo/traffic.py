"""The demo's live traffic: users asking the arithmetic domain through the gateway.

Between the demo's cycles, `flywheel serve` (the REST API) and `flywheel gateway --backend
local` (the OpenAI-compatible gateway in front of the local transformers + peft server) run as
the demo's own subprocesses, exactly as a user starts them. Simulated users ask additions
with `model: "arithmetic"` (the champion answers; the base before there is one), check each
answer against the sum and rate it through the REST API: thumbs up when it is right, a
correction carrying the right sum when it is wrong. That feedback hangs off the interactions
the gateway recorded, with the version that served each, so the next cycle trains on it and
the summary shows each version's live thumbs-up rate.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from flywheel.demo.arithmetic import Problem
from flywheel.errors import InvalidState

READY_TIMEOUT_S = 240.0  # the gateway loads the base model in its local server first
USERS = 6  # simulated end users, each asking from its own thread
FEEDBACK_RETRY_S = 30.0  # the gateway writes its records in batches, off the answer's path


@dataclass(frozen=True)
class Services:
    api_url: str  # the REST API's root
    gateway_url: str  # the gateway's OpenAI base URL (ends in /v1)


@dataclass(frozen=True)
class Answer:
    problem: Problem
    user: str
    interaction_id: str
    version: str  # the version that answered ("base" before a champion exists)
    text: str

    @property
    def is_right(self) -> bool:
        return self.text.strip() == self.problem.answer


@contextlib.contextmanager
def live_services(base_model: Path, logs: Path) -> Iterator[Services]:
    """`flywheel serve` and `flywheel gateway --backend local`, on free loopback ports, until
    the block ends; their logs go to `logs/`."""
    logs.mkdir(parents=True, exist_ok=True)
    api_port, gateway_port = _free_port(), _free_port()
    commands = {
        "api": ["serve", "--port", str(api_port), "--no-access-log"],
        "gateway": [
            *("gateway", "--port", str(gateway_port)),
            *("--backend", "local", "--base-model", str(base_model)),
        ],
    }
    with contextlib.ExitStack() as stack:
        processes = {
            name: stack.enter_context(_process(argv, logs / f"{name}.log"))
            for name, argv in commands.items()
        }
        services = Services(f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{gateway_port}/v1")
        _wait_ready(f"{services.api_url}/healthz", processes["api"], logs / "api.log")
        gateway_health = services.gateway_url.removesuffix("/v1") + "/healthz"
        _wait_ready(gateway_health, processes["gateway"], logs / "gateway.log")
        yield services


def ask_and_rate(
    services: Services, key: str, domain: str, problems: list[Problem]
) -> list[Answer]:
    """Each problem asked once by one of `USERS` users, each answer checked and rated."""
    users = [f"demo-user-{number}" for number in range(USERS)]
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(headers=headers, timeout=120.0) as client:

        def ask(index: int) -> Answer:
            return _ask(client, services, domain, problems[index], users[index % USERS])

        with ThreadPoolExecutor(max_workers=USERS) as pool:
            answers = list(pool.map(ask, range(len(problems))))
        _rate(client, services, answers)
    return answers


def _ask(
    client: httpx.Client, services: Services, domain: str, problem: Problem, user: str
) -> Answer:
    body = {
        "model": domain,
        "messages": [{"role": "user", "content": problem.prompt}],
        "max_tokens": 6,
        "temperature": 0,
        "user": user,
    }
    response = client.post(f"{services.gateway_url}/chat/completions", json=body)
    if response.status_code != 200:
        raise InvalidState(f"the gateway answered {response.status_code}: {response.text[:200]}")
    completion = response.json()
    served = completion["flywheel"]
    return Answer(
        problem=problem,
        user=user,
        interaction_id=served["interaction_id"],
        version=str(served.get("version") or "base"),
        text=completion["choices"][0]["message"].get("content") or "",
    )


def _rate(client: httpx.Client, services: Services, answers: list[Answer]) -> None:
    """One batch of feedback for the round; retried while the gateway's records are still on
    their way to the database (a 404 names an interaction not written yet)."""
    events = [_feedback(answer) for answer in answers]
    deadline = time.monotonic() + FEEDBACK_RETRY_S
    while True:
        response = client.post(f"{services.api_url}/v1/feedback/batch", json={"events": events})
        if response.status_code == 201:
            return
        if not _names_unwritten_interactions(response) or time.monotonic() > deadline:
            raise InvalidState(f"feedback was refused ({response.status_code}): {response.text}")
        time.sleep(0.5)


def _names_unwritten_interactions(response: httpx.Response) -> bool:
    """A refusal only because some interactions are not in the database yet."""
    if response.status_code != 422:
        return False
    details = response.json().get("error", {}).get("details") or []
    return bool(details) and all(detail.get("code") == "not_found" for detail in details)


def _feedback(answer: Answer) -> dict[str, Any]:
    common = {"interaction_id": answer.interaction_id, "rater": answer.user}
    if answer.is_right:
        return {**common, "kind": "rating", "value": {"thumbs": "up"}}
    return {**common, "kind": "correction", "value": {"text": answer.problem.answer}}


def round_summary(answers: list[Answer]) -> dict[str, Any]:
    """Per version that answered: calls and the share the users rated thumbs up."""
    versions: dict[str, dict[str, Any]] = {}
    for answer in answers:
        row = versions.setdefault(answer.version, {"calls": 0, "thumbs_up": 0})
        row["calls"] += 1
        row["thumbs_up"] += int(answer.is_right)
    for row in versions.values():
        row["thumbs_up_rate"] = round(row["thumbs_up"] / row["calls"], 3)
    return {"calls": len(answers), "versions": versions}


@contextlib.contextmanager
def _process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "flywheel", *argv],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise InvalidState(f"{url} exited with {process.returncode} (its log: {log})")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.25)
    raise InvalidState(f"{url} did not come up in {READY_TIMEOUT_S:.0f} s (its log: {log})")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
