"""The admin CLI through its real entry point, on the test database and on the embedded one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import typer
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.models import ApiKey, Domain, Tenant
from tests.conftest import count_rows, run_cli


def test_tenant_domain_and_key_lifecycle(
    on_test_database: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "tenants", "create", "acme", "--json")
    assert code == 0
    tenant = json.loads(out)
    assert tenant["name"] == "acme"

    assert run_cli(capsys, "domains", "create", "billing", "--tenant", "acme")[0] == 0
    code, out, _ = run_cli(
        capsys, "keys", "create", "-t", "acme", "-s", "feedback:write,data:read", "--json"
    )
    assert code == 0
    issued = json.loads(out)
    assert issued["key"].startswith("fwk_")
    assert issued["scopes"] == ["feedback:write", "data:read"]

    code, out, _ = run_cli(capsys, "keys", "list", "-t", "acme", "--json")
    listed = json.loads(out)
    assert [item["id"] for item in listed] == [issued["id"]]
    assert issued["key"] not in out  # shown once, never again

    assert run_cli(capsys, "keys", "revoke", issued["id"])[0] == 0
    with on_test_database() as session:
        key = session.scalars(select(ApiKey)).one()
        assert key.revoked_at is not None
        assert session.scalars(select(Domain.name)).all() == ["billing"]
        assert str(session.scalars(select(Tenant.id)).one()) == tenant["id"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("tenants", "create", "Not Valid"), "tenant name 'Not Valid' must be"),
        (("domains", "create", "billing", "--tenant", "nobody"), "tenant 'nobody' not found"),
        (("keys", "create", "-t", "acme", "-s", "root"), "unknown or missing scopes ['root']"),
        (("keys", "create", "-t", "acme"), "Missing option '--scopes'"),
        (("keys", "revoke", "not-a-uuid"), "is not a key id"),
        (("keys", "revoke", str(uuid.UUID(int=1))), "not found"),
        (("tenants", "create", "acme"), "tenant 'acme' already exists"),
        (("tenants", "frobnicate"), "No such command"),
    ],
)
def test_bad_input_exits_non_zero_with_one_line(
    on_test_database: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    fragment: str,
) -> None:
    assert run_cli(capsys, "tenants", "create", "acme")[0] == 0
    tenants_before = count_rows(on_test_database, "tenants")

    code, out, err = run_cli(capsys, *args)

    assert code != 0
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: ")
    assert fragment in err
    assert count_rows(on_test_database, "tenants") == tenants_before


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the CLI, as the words that name it (groups included; typer vendors
    click, so a group is told by its `commands`)."""
    paths = [path]
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            paths += _command_paths(sub, (*path, name))
    return paths


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    from flywheel.cli import _add_plugins, app

    _add_plugins()  # `flywheel ingest ...` comes from an entry point
    commands = _command_paths(typer.main.get_command(app))
    for expected in (("compile",), ("forget",), ("demo",), ("ingest", "tickets"), ("cycle",)):
        assert expected in commands
    for command in commands:
        code, out, _ = run_cli(capsys, *command, "--help")
        assert code == 0, command
        assert "Usage" in out, command


def test_unmigrated_database_is_refused_with_a_hint(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "tenants", "list")

    assert code == 1
    assert "run `flywheel init`" in err


def test_unreachable_database_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "FLYWHEEL_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1"
    )

    code, _, err = run_cli(capsys, "tenants", "list")

    assert code == 1
    assert err.startswith("error: database unreachable")
    assert err.count("\n") == 1


def test_init_on_the_embedded_default(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "init", "--json")

    assert code == 0
    assert json.loads(out)["revision"]
    assert (workspace / ".flywheel" / "flywheel.db").is_file()
    assert run_cli(capsys, "init")[0] == 0  # idempotent
    assert run_cli(capsys, "tenants", "create", "acme")[0] == 0
    code, out, _ = run_cli(capsys, "db", "current", "--json")
    current = json.loads(out)
    assert current["revision"] == current["head"]


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EntryPoint]]:
    """The `flywheel.cli` entry points the CLI sees, as the test sets them; loaded afresh."""
    from flywheel import cli

    found: list[EntryPoint] = []
    monkeypatch.setattr(cli, "entry_points", lambda **_: found)
    cli._add_plugins.cache_clear()
    yield found
    cli._add_plugins.cache_clear()  # the next main() loads the installed ones again


def test_a_stale_plugin_of_a_built_in_command_is_passed_over(
    plugins: list[EntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.append(EntryPoint("compile", "ingest.cli:compile_feedback", "flywheel.cli"))

    code, out, _ = run_cli(capsys, "--help")  # the overview loads every plugin

    assert code == 0
    assert "compile" in out
    code, out, _ = run_cli(capsys, "compile", "--help")
    assert code == 0
    assert "Compile feedback events" in out


def test_a_plugin_that_does_not_load_is_a_one_line_error(
    plugins: list[EntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.append(EntryPoint("gone", "no_such_module.cli:gone", "flywheel.cli"))

    for args in (("gone",), ("--help",)):  # the plugin's own command, or the overview
        code, _, err = run_cli(capsys, *args)

        assert code == 1
        assert len(err.strip().splitlines()) == 1
        assert "reinstall the package" in err
    # A built-in command never reads the entry points (start-up), so the plugin cannot stop it.
    assert run_cli(capsys, "tenants", "list", "--help")[0] == 0
