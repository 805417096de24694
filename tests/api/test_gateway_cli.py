"""`flywheel gateway` as users start it: its own process, in front of the stand-in upstream,
recording into the database; and its one-line refusals."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.feedback.models import Interaction
from flywheel.inference.standin import RunningStandin, StandinConfig, serve_in_thread
from tests.conftest import make_caller, run_cli

BASE = "standin-base"


@pytest.fixture(scope="module")
def standin() -> Iterator[RunningStandin]:
    with serve_in_thread(StandinConfig(base_model=BASE)) as running:
        yield running


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.commits("the gateway process records into the database")
def test_the_gateway_command_serves_and_records_until_stopped(
    standin: RunningStandin,
    database_url: str,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    caller = make_caller(sessions, scopes=("infer",))
    port = free_port()
    env = {**os.environ, "FLYWHEEL_DATABASE_URL": database_url, "FLYWHEEL_HOME": str(tmp_path)}
    env["UPSTREAM_SECRET"] = "s3cret"
    command = [
        sys.executable, "-m", "flywheel", "gateway", "--port", str(port), "--json",
        "--upstream-url", standin.base_url, "--upstream-key-env", "UPSTREAM_SECRET",
    ]  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline
                time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=caller.key)
        answer = client.chat.completions.create(
            model="billing", messages=[{"role": "user", "content": "hello"}]
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert answer.choices[0].message.content == f"reply from {BASE} to: hello"  # base: listed
    chat = [r for r in standin.app.requests if r["path"] == "/v1/chat/completions"][-1]
    assert chat["headers"]["authorization"] == "Bearer s3cret"
    with sessions() as session:  # the recorder flushed on shutdown
        (row,) = session.scalars(select(Interaction)).all()
    assert str(row.id) == answer.model_extra["flywheel"]["interaction_id"]  # type: ignore[index]
    assert (row.status, row.release_role) == ("ok", "base")


def test_bad_options_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, on_test_database: object
) -> None:
    for name in ("UPSTREAM_URL", "UPSTREAM_KEY", "BASE_MODEL", "DYNAMIC_LORA"):
        monkeypatch.delenv(f"FLYWHEEL_GATEWAY_{name}", raising=False)  # restored afterwards
    code, _, err = run_cli(capsys, "gateway", "--backend", "triton")
    assert (code, err) == (2, "error: --backend must be openai or local, not 'triton'\n")
    code, _, err = run_cli(capsys, "gateway")
    assert code == 2
    assert "--upstream-url" in err
    code, _, err = run_cli(
        capsys, "gateway", "--upstream-url", "http://x/v1", "--upstream-key-env", "NOPE_UNSET"
    )
    assert (code, err) == (2, "error: --upstream-key-env NOPE_UNSET: that variable is not set\n")


def test_a_stopped_local_gateway_leaves_no_local_server(database_url: str, tmp_path: Path) -> None:
    """`flywheel gateway --backend local` stopped with SIGTERM (what `kill`, systemd and the
    demo send) stops the transformers server it started (it was left running: uvicorn
    re-raises SIGTERM after its shutdown, which skipped the command's `finally`)."""
    model = tmp_path / "tiny"
    built = subprocess.run(
        [sys.executable, "-m", "finetune.tiny", "--out", str(model)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    port = free_port()
    env = {**os.environ, "FLYWHEEL_DATABASE_URL": database_url, "FLYWHEEL_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "flywheel", "gateway", "--port", str(port),
               "--backend", "local", "--base-model", str(model), "--no-access-log"]  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(port, process, log, within_s=240)
        servers = [
            child
            for child in psutil.Process(process.pid).children(recursive=True)
            if "finetune.serve" in " ".join(child.cmdline())
        ]
        assert servers, log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=60)
    _, alive = psutil.wait_procs(servers, timeout=30)
    assert alive == [], f"left running: {alive}"


def _wait_healthy(port: int, process: subprocess.Popen[bytes], log: Path, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
