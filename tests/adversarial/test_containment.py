"""Hostile code is contained: the host is unchanged, the caller alive, nothing lingers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flywheel.sandbox import Verdict
from flywheel.sandbox.process import reap_orphans
from flywheel.sandbox.warm import close_pools
from tests.adversarial.host import sandbox_processes

Run = Callable[..., Verdict]


@pytest.fixture(autouse=True)
def nothing_lingers() -> object:
    yield
    close_pools()  # warm sandboxes too must shut down cleanly
    deadline = time.monotonic() + 3
    while sandbox_processes() and time.monotonic() < deadline:
        reap_orphans()  # sandbox inits still dying are reaped on a later call
        time.sleep(0.05)
    assert sandbox_processes() == {}


def in_call(body: str) -> str:
    """A solution whose `add` runs `body` (indented) and then returns a wrong answer."""
    lines = "\n".join("    " + line for line in body.strip().splitlines())
    return f"def add(a, b):\n{lines}\n    return 0\n"


def test_fork_bomb(run: Run) -> None:
    verdict = run(in_call("import os\nwhile True:\n    os.fork()"))

    assert not verdict.is_passed
    assert verdict.reason in {"crash", "failed_tests", "timeout"}


def test_memory_bomb(run: Run) -> None:
    verdict = run(in_call("hog = [bytearray(10**7) for _ in range(1000)]"))

    assert not verdict.is_passed
    assert verdict.reason == "memory"


def test_busy_loop_ignoring_signals(run: Run) -> None:
    body = (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    )
    verdict = run(in_call(body))

    assert not verdict.is_passed
    assert verdict.reason == "timeout"
    assert verdict.duration_s < 10


def test_sleep_forever(run: Run) -> None:
    verdict = run(in_call("import time\ntime.sleep(1e9)"))

    assert verdict.reason == "timeout"
    assert verdict.duration_s < 10


def test_gigabyte_to_stdout(run: Run) -> None:
    verdict = run(in_call("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * 2**20)"))

    assert not verdict.is_passed
    assert verdict.reason == "output_limit"


@pytest.mark.parametrize(
    "path", ["/etc/shadow", "/root/.ssh/id_rsa", "/etc/passwd", "/root/.bash_history"]
)
def test_host_files_and_environment_are_out_of_reach(run: Run, path: str) -> None:
    tests = "from solution import add\n\ndef test_reads():\n    assert add(0, 0) == ''\n"
    solution = (
        f"def add(a, b):\n    try:\n        return open({path!r}).read()\n"
        "    except OSError:\n        return ''\n"
    )

    verdict = run(solution, tests)

    assert verdict.is_passed, verdict  # passes only if the read returned nothing


def test_parent_secret_is_invisible(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_CANARY_SECRET", "canary-7f3a")
    solution = (
        "import os\ndef add(a, b):\n    seen = dict(os.environ)\n"
        "    for pid in os.listdir('/proc'):\n        if pid.isdigit():\n"
        "            try:\n                seen[pid] = open(f'/proc/{pid}/environ').read()\n"
        "            except OSError:\n                pass\n    return repr(seen)\n"
    )
    tests = (
        "from solution import add\n\n"
        "def test_no_canary():\n    assert 'canary-7f3a' not in add(0, 0)\n"
    )

    assert run(solution, tests).is_passed


@pytest.mark.parametrize(
    "connect",
    [
        "socket.create_connection(('127.0.0.1', 5432), timeout=1)",
        "socket.create_connection(('1.1.1.1', 53), timeout=1)",
        "socket.getaddrinfo('pypi.org', 443)",
    ],
)
def test_no_network(run: Run, connect: str) -> None:
    solution = (
        f"import socket\ndef add(a, b):\n    try:\n        {connect}\n"
        "        return 'connected'\n    except OSError:\n        return 'refused'\n"
    )
    tests = "from solution import add\n\ndef test_refused():\n    assert add(0, 0) == 'refused'\n"

    assert run(solution, tests).is_passed


def test_writes_outside_the_workdir_fail_and_disk_is_capped(run: Run, tmp_path: Path) -> None:
    target = tmp_path / "escaped"
    solution = f"""
import os
def add(a, b):
    outcomes = []
    for path in ({str(target)!r}, '/usr/escaped', '/etc/escaped', '/task/tests.py'):
        try:
            open(path, 'w').write('x')
            outcomes.append('wrote ' + path)
        except OSError:
            pass
    try:
        os.symlink('/usr', 'link')
        open('link/escaped', 'w').write('x')
        outcomes.append('wrote through symlink')
    except OSError:
        pass
    try:
        with open('big', 'wb') as f:
            for _ in range(1000):
                f.write(b'x' * 2**20)
        outcomes.append('wrote 1000 MiB')
    except OSError:
        pass
    return outcomes
"""
    tests = "from solution import add\n\ndef test_nothing_escaped():\n    assert add(0, 0) == []\n"

    verdict = run(solution, tests)

    assert verdict.is_passed, verdict
    assert not target.exists()
    assert not Path("/usr/escaped").exists()


def test_kill_everything_leaves_the_caller_alive(run: Run) -> None:
    # A process of the caller's, outside the sandbox: kill(-1) must not reach it.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        verdict = run(
            in_call(
                "import os, signal\nos.kill(-1, signal.SIGKILL)\n"
                "os.kill(os.getppid(), signal.SIGKILL)"
            )
        )

        assert not verdict.is_passed
        assert bystander.poll() is None  # still running, not killed
    finally:
        bystander.kill()
        bystander.wait()


def test_daemons_do_not_survive(run: Run) -> None:
    body = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)"
    )
    run(in_call(body))
    # the autouse fixture asserts no sandbox process lingers
