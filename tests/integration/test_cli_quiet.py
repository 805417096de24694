"""A quiet, fast CLI: start-up without the heavy libraries, JSON that parses on stdout, bad
input as one line with exit status 2, third-party noise in the workspace's log file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import Caller, run_cli

ROOT = Path(__file__).resolve().parents[2]
TYPEDKIT = ROOT / "tests" / "fixtures" / "repos" / "typedkit"
# (pydantic is not among them: typer 0.29 checks parameters with it)
HEAVY = ("torch", "transformers", "sqlalchemy", "alembic", "fastapi", "pydantic_settings")
HEAVY += ("mlflow", "numpy", "peft", "trl", "datasets", "procrastinate", "psycopg")
# What one command needs and the others should not pay for at start-up: the demo's HTTP client
# and YAML, the sandbox (doctor, sandbox run), croniter (the schedule).
ELSEWHERE = ("httpx", "yaml", "croniter", "flywheel.demo", "flywheel.sandbox")


def loaded_of(names: tuple[str, ...]) -> str:
    """Python that evaluates, in the child, to the sorted modules loaded of `names` (a name
    stands for its package and every submodule)."""
    return (
        f"sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in {names!r}))"
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("tenants", "create", "--help"),
        ("dataset", "build", "--help"),
        ("ingest", "repo", "--help"),
        ("train", "--help"),
    ],
)
@pytest.mark.no_database
def test_help_loads_none_of_the_heavy_libraries(tmp_path: Path, args: tuple[str, ...]) -> None:
    script = (
        "import json, sys\n"
        "from flywheel.cli import main\n"
        f"code = main({list(args)!r})\n"
        f"print(json.dumps([code, {loaded_of(HEAVY + ELSEWHERE)}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    )

    code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0
    assert loaded == []


@pytest.mark.no_database
def test_a_light_command_on_a_migrated_workspace_loads_only_what_it_needs(
    tmp_path: Path,
) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    flywheel = [sys.executable, "-m", "flywheel"]
    for args in (["init"], ["tenants", "create", "acme"]):
        subprocess.run([*flywheel, *args], cwd=tmp_path, env=environment, check=True)
    for args in (["domains", "create", "billing", "--tenant", "acme"], ["tenants", "list"]):
        script = (
            "import json, sys\n"
            "from flywheel.cli import main\n"
            f"code = main({args!r})\n"
            f"print(json.dumps([code, {loaded_of(('alembic', *ELSEWHERE))}]))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
        )

        assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, []]


@pytest.mark.no_database
def test_a_schema_behind_head_is_still_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flywheel import migrate
    from flywheel.settings import Settings

    assert run_cli(capsys, "init")[0] == 0
    migrate.downgrade(Settings().resolved_database_url, "-1")

    code, _, err = run_cli(capsys, "tenants", "list")

    assert code == 1
    assert "run `flywheel init`" in err
    assert err.count("\n") == 1


GOOD_TASK = {
    "task_id": "t/double",
    "prompt": 'def double(x):\n    """Return twice x."""\n',
    "canonical_solution": "    return 2 * x\n",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2\n",
    "entry_point": "double",
}
RATING = {
    "kind": "rating",
    "prompt": "How do I reset?",
    "response": "Click reset.",
    "value": {"thumbs": "up"},
    "rater": "u-1",
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """`flywheel ARGS --json`: it succeeds and its whole stdout is one JSON document."""
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, (args, err)
    return json.loads(out)


def test_every_json_command_prints_json(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(GOOD_TASK) + "\n", encoding="utf-8")
    feedback = tmp_path / "feedback.jsonl"
    feedback.write_text(json.dumps(RATING) + "\n", encoding="utf-8")

    assert run_json(capsys, "tenants", "create", "globex")["name"] == "globex"
    assert run_json(capsys, "tenants", "list")
    assert run_json(capsys, "domains", "create", "code", "--tenant", "acme")["name"] == "code"
    assert run_json(capsys, "domains", "list", "--tenant", "acme")
    assert run_json(capsys, "keys", "create", "-t", "acme", "-s", "data:read")["key"]
    assert run_json(capsys, "keys", "list", "-t", "acme")
    ingested = run_json(
        capsys, "ingest", "tasks", str(tasks), "--format", "humaneval", "--domain", "code",
        "--tenant", "acme",
    )  # fmt: skip
    assert ingested["verifier"]["usable"] == 1
    run_json(capsys, "ingest", "feedback", str(feedback), "--domain", "billing", "--tenant", "acme")
    assert run_json(capsys, "compile", "--tenant", "acme")
    built = run_json(capsys, "dataset", "build", "--domain", "code", "--tenant", "acme")
    assert built["is_new"] is True
    listed = run_json(capsys, "dataset", "list", "--domain", "code", "--tenant", "acme")
    assert [item["id"] for item in listed] == [built["id"]]
    verified = run_json(capsys, "verify", "--domain", "code", "--tenant", "acme")
    assert verified["already_verified"] == {"usable": 1}
    assert run_json(capsys, "forget", "--rater", "u-1", "--tenant", "acme")["deleted"]
    assert run_json(capsys, "runs", "list", "--tenant", "acme") == []
    models = run_json(capsys, "models", "list", "--domain", "code", "--tenant", "acme")
    assert models["versions"] == []


def test_dataset_build_speaks_to_people_in_lines_not_a_dict(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(GOOD_TASK) + "\n", encoding="utf-8")
    run_json(capsys, "ingest", "tasks", str(tasks), "--format", "humaneval", "--domain", "billing")

    code, out, _ = run_cli(capsys, "dataset", "build", "--domain", "billing")

    assert code == 0
    # the one group's split is drawn by a hash of the (random) domain id: either side
    one_side = ("train 1 items (1 task) in 1 groups; eval 0 items in 0 groups",
                "train 0 items in 0 groups; eval 1 items (1 task) in 1 groups")  # fmt: skip
    assert out in {f"built billing v1: {line}\n" for line in one_side}


def test_verify_says_when_ingest_already_verified_every_task(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    weak = {**GOOD_TASK, "task_id": "t/weak", "test": "def check(candidate):\n    candidate(2)\n"}
    tasks.write_text(json.dumps(GOOD_TASK) + "\n" + json.dumps(weak) + "\n", encoding="utf-8")
    run_json(capsys, "ingest", "tasks", str(tasks), "--format", "humaneval", "--domain", "billing")

    code, out, _ = run_cli(capsys, "verify", "--domain", "billing")  # the one tenant's

    assert code == 0
    assert out == (
        "nothing to verify: 2 tasks already verified (1 unusable, 1 usable); "
        "--recheck verifies them again\n"
    )
    rechecked = run_json(capsys, "verify", "--domain", "billing", "--tenant", "acme", "--recheck")
    assert (rechecked["usable"], rechecked["unusable"]) == (1, 1)


@pytest.mark.usefixtures("on_test_database", "acme", "globex")
def test_verify_asks_which_tenant_only_when_there_are_several(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(capsys, "verify", "--domain", "billing")

    assert (code, out) == (2, "")
    assert err == "error: 2 tenants exist: say which with --tenant\n"


@pytest.mark.no_database
def test_redact_help_describes_surrogates_not_placeholders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "redact", "--help")

    words = " ".join(out.split())  # the help is wrapped to the terminal
    assert code == 0
    assert "PII and secrets replaced by realistic surrogates" in words
    assert "placeholder" not in words


@pytest.mark.parametrize(
    ("setting", "value", "fragment"),
    [
        ("FLYWHEEL_DB_POOL_SIZE", "0", "FLYWHEEL_DB_POOL_SIZE: Input should be greater than"),
        ("FLYWHEEL_DB_POOL_SIZE", "many", "FLYWHEEL_DB_POOL_SIZE: Input should be a valid int"),
        # the defaults are not checked (no croniter at start-up); a value given still is
        ("FLYWHEEL_SCHEDULER_TICK_CRON", "hourly", "FLYWHEEL_SCHEDULER_TICK_CRON: Value error"),
    ],
)
@pytest.mark.no_database
def test_a_bad_setting_is_one_line_and_exit_2(
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    setting: str,
    value: str,
    fragment: str,
) -> None:
    monkeypatch.setenv(setting, value)

    code, out, err = run_cli(capsys, "init")

    assert (code, out) == (2, "")
    assert err.startswith(f"error: bad setting {fragment}")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("bogus", "not a database URL"),
        ("postgresql://me:hunter2@host:port/db", "not a database URL"),  # a port, not a number
        ("mysql://me:hunter2@host/db", "no SQLAlchemy dialect or driver for it here"),  # no driver
        ("nosuch://me:hunter2@host/db", "no SQLAlchemy dialect or driver for it here"),
    ],
)
@pytest.mark.parametrize("command", [("tenants", "list"), ("init",)])
@pytest.mark.no_database
def test_a_database_url_it_cannot_use_is_one_line_and_exit_2(
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
    fragment: str,
    command: tuple[str, ...],
) -> None:
    monkeypatch.setenv("FLYWHEEL_DATABASE_URL", url)

    code, out, err = run_cli(capsys, *command)

    assert (code, out) == (2, "")
    assert err.startswith(f"error: bad setting FLYWHEEL_DATABASE_URL: {fragment}")
    assert err.count("\n") == 1
    assert "hunter2" not in err  # a URL may hold a password: never echoed


def test_a_bad_config_file_is_one_line_and_exit_2(
    on_test_database: sessionmaker[Session],
    acme: Caller,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "billing.yaml"
    config.write_text("gate: [1\n", encoding="utf-8")

    code, out, err = run_cli(
        capsys, "domains", "configure", "billing", "--tenant", "acme", "--file", str(config)
    )

    assert (code, out) == (2, "")
    assert err.startswith(f"error: cannot read {config}")
    assert err.count("\n") == 1


def run_noisy(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`flywheel ARGS noisy` in a fresh process (its own warning filters, not pytest's), with
    `tests/integration/noisy_plugin.py` plugged in as a command."""
    script = (
        "import sys\n"
        "from importlib.metadata import EntryPoint\n"
        "from flywheel import cli\n"
        "noisy = EntryPoint('noisy', 'tests.integration.noisy_plugin:noisy', 'flywheel.cli')\n"
        "cli.entry_points = lambda **_: [noisy]\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    environment = {name: value for name, value in os.environ.items() if "TQDM" not in name}
    environment["FLYWHEEL_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-c", script, *args, "noisy"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        check=True,
    )


@pytest.mark.no_database
def test_third_party_noise_goes_to_the_log_file_not_the_terminal(tmp_path: Path) -> None:
    done = run_noisy(tmp_path)

    assert done.stderr == ""
    assert json.loads(done.stdout) == {"child_stderr": ""}
    log = (tmp_path / "flywheel.log").read_text(encoding="utf-8")
    assert "FutureWarning: `attention_mask` is deprecated" in log
    assert "UserWarning: TypedStorage is deprecated" in log
    assert "transformers.modeling_utils: Some weights were not used" in log


@pytest.mark.no_database
def test_verbose_shows_third_party_noise(tmp_path: Path) -> None:
    done = run_noisy(tmp_path, "--verbose")

    assert "FutureWarning: `attention_mask` is deprecated" in done.stderr
    assert "Some weights were not used" in done.stderr
    assert "3/3" in json.loads(done.stdout)["child_stderr"]  # the bar
    assert not (tmp_path / "flywheel.log").exists()


def run_on_a_terminal(tmp_path: Path, *args: str) -> tuple[str, str]:
    """`flywheel ARGS` with stderr on a pseudo-terminal (stdout a pipe): stdout, and what the
    terminal received."""
    import pty

    leader, follower = pty.openpty()
    environment = {name: value for name, value in os.environ.items() if "TQDM" not in name}
    environment |= {"TERM": "xterm-256color", "COLUMNS": "100"}
    for name in ("FLYWHEEL_DATABASE_URL", "FLYWHEEL_HOME"):  # the workspace in tmp_path
        environment.pop(name, None)
    with subprocess.Popen(
        [sys.executable, "-m", "flywheel", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=tmp_path,
        env=environment,
        text=True,
    ) as child:
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the child is done
                break
            if not chunk:
                break
            drawn += chunk
        out = child.stdout.read() if child.stdout else ""
        assert child.wait() == 0, drawn
    os.close(leader)
    return out, drawn.decode("utf-8", errors="replace")


@pytest.mark.no_database
def test_progress_is_drawn_on_a_terminal_and_never_with_json(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(GOOD_TASK) + "\n", encoding="utf-8")

    out, drawn = run_on_a_terminal(tmp_path, "verify", "--file", str(tasks))
    assert out.startswith("1 usable, 0 unusable")
    assert "verifying tasks" in drawn

    out, drawn = run_on_a_terminal(tmp_path, "verify", "--file", str(tasks), "--json")
    assert json.loads(out)["usable"] == 1
    assert drawn == ""


@pytest.mark.no_database
def test_builds_exports_and_repository_ingests_draw_progress_on_a_terminal(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(GOOD_TASK) + "\n", encoding="utf-8")
    for args in (
        ["init"],
        ["tenants", "create", "acme"],
        ["domains", "create", "billing", "--tenant", "acme"],
        ["ingest", "tasks", str(tasks), "--format", "humaneval", "--domain", "billing"],
    ):
        run_on_a_terminal(workspace, *args)

    out, drawn = run_on_a_terminal(workspace, "dataset", "build", "--domain", "billing")
    assert out.startswith("built billing v1: ")
    assert "building billing's next version" in drawn

    export = tmp_path / "export"
    args = ("dataset", "export", "1", "--domain", "billing", "--out", str(export))
    out, drawn = run_on_a_terminal(workspace, *args)
    assert out.startswith(f"exported v1 of billing to {export}")
    assert "exporting v1 of billing" in drawn

    out, drawn = run_on_a_terminal(
        workspace, "ingest", "repo", str(TYPEDKIT), "--domain", "billing"
    )
    assert out.startswith("run_id: ")  # the counts, then the repository's yield report
    assert f"reading {TYPEDKIT}" in " ".join(drawn.split())
    assert "verifying tasks" in drawn

    args = ("dataset", "build", "--domain", "billing", "--json")
    out, drawn = run_on_a_terminal(workspace, *args)
    assert json.loads(out)["is_new"] is True
    assert drawn == ""
