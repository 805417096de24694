"""A real `flywheel serve` process: the README's quickstart on SQLite, and 2 workers on Postgres."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import RATING, count_rows

FLYWHEEL = [sys.executable, "-m", "flywheel"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [*FLYWHEEL, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@contextmanager
def server(env: dict[str, str], cwd: Path, workers: int = 1) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [*FLYWHEEL, "serve", "--port", str(port), "--workers", str(workers)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                output = process.stdout.read() if process.stdout else ""
                raise AssertionError(f"server did not start: {output}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout:
            process.stdout.close()


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLYWHEEL_")}
    return {**env, **extra}


def test_quickstart_on_the_embedded_default(tmp_path: Path) -> None:
    """The README's steps, in an empty directory: init, tenant, key, serve, curl, read back."""
    env = clean_env()
    cli(env, tmp_path, "init")
    cli(env, tmp_path, "tenants", "create", "acme")
    cli(env, tmp_path, "domains", "create", "billing", "--tenant", "acme")
    key = json.loads(
        cli(
            env,
            tmp_path,
            "keys",
            "create",
            "--tenant",
            "acme",
            "--scopes",
            "feedback:write,data:read",
            "--json",
        )
    )["key"]
    auth = {"Authorization": f"Bearer {key}"}

    with server(env, tmp_path) as base:
        created = httpx.post(
            f"{base}/v1/interactions",
            json={
                "domain": "billing",
                "prompt": "Why was I charged twice?",
                "response": "Refunded.",
            },
            headers=auth,
        )
        assert created.status_code == 201, created.text
        interaction_id = created.json()["id"]
        rated = httpx.post(
            f"{base}/v1/feedback",
            json={
                "interaction_id": interaction_id,
                "kind": "rating",
                "value": {"thumbs": "up"},
                "rater": "u-42",
            },
            headers=auth,
        )
        assert rated.status_code == 201, rated.text
        read = httpx.get(f"{base}/v1/interactions/{interaction_id}", headers=auth)
        bad = httpx.post(
            f"{base}/v1/feedback", json={"kind": "rating", "value": {"stars": 9}}, headers=auth
        )
        unauthenticated = httpx.get(f"{base}/v1/interactions/{interaction_id}")

    assert read.status_code == 200
    assert read.json()["feedback"][0]["value"] == {"thumbs": "up"}
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "invalid_input"
    assert unauthenticated.status_code == 401
    assert (tmp_path / ".flywheel" / "flywheel.db").is_file()


@pytest.mark.postgres_only
@pytest.mark.commits("flywheel CLI and uvicorn subprocesses write the rows")
def test_two_workers_concurrent_duplicates_write_one_row(
    database_url: str, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    env = clean_env(FLYWHEEL_DATABASE_URL=database_url, FLYWHEEL_HOME=str(tmp_path))
    cli(env, tmp_path, "tenants", "create", "acme")
    cli(env, tmp_path, "domains", "create", "billing", "--tenant", "acme")
    key = json.loads(
        cli(env, tmp_path, "keys", "create", "-t", "acme", "-s", "feedback:write", "--json")
    )["key"]
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "same-request"}
    event = RATING

    with server(env, tmp_path, workers=2) as base, ThreadPoolExecutor(16) as pool:
        responses = list(
            pool.map(
                lambda _: httpx.post(
                    f"{base}/v1/feedback", json=event, headers=headers, timeout=30
                ),
                range(32),
            )
        )

    assert {response.status_code for response in responses} == {201}
    assert len({response.json()["id"] for response in responses}) == 1
    assert count_rows(sessions, "feedback_events") == 1
