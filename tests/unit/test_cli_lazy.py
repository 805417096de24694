"""A light CLI start-up: commands registered without importing their heavy modules keep the
defaults of what they call (`flywheel.cli.sandbox`), and the commands that read or write a few
rows load only what they use (the models of the tables they touch; no numpy, no PostgreSQL
driver on SQLite), however the services they call are arranged. The time is measured by
`bench/cli_startup.py`, never asserted here."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command


def described(command: Callable[..., Any]) -> tuple[str | None, list[tuple[Any, ...]]]:
    """A Typer command's help text and its parameters as click sees them."""
    app = typer.Typer()
    app.command("it")(command)
    app.callback()(lambda: None)  # a group: the command keeps its own help
    group = get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    built = group.commands["it"]
    params = [(p.name, tuple(p.opts), p.default, getattr(p, "help", None)) for p in built.params]
    return built.help, params


def test_sandbox_run_defaults_are_the_sandbox_limits() -> None:
    from flywheel.cli.sandbox import run
    from flywheel.sandbox import Limits

    defaults = {name: default for name, _, default, _ in described(run)[1]}
    limits = dataclasses.asdict(Limits())

    assert (defaults["wall_s"], defaults["memory_mb"]) == (limits["wall_s"], limits["memory_mb"])


# What a light command (one that reads or writes a few rows) must not load: every model at
# once, a dataset build's modules and the signal models (what `models list`, `dataset list` and
# `runs list` loaded before), the statistics (numpy: the gate, decontamination), the PostgreSQL
# driver on SQLite, the migrations, the registry's client, the web stack, YAML, rich (plain
# output).
NOT_FOR_LIGHT_COMMANDS = ("flywheel.models", "numpy", "psycopg", "alembic", "mlflow")
NOT_FOR_LIGHT_COMMANDS += ("flywheel.datasets.service", "flywheel.datasets.items")
NOT_FOR_LIGHT_COMMANDS += ("flywheel.signals",)
NOT_FOR_LIGHT_COMMANDS += ("httpx", "fastapi", "api", "yaml", "rich", "torch", "transformers")
# Nor, on SQLite, PostgreSQL's dialect (25 ms; the partial indexes of datasets and runs loaded
# it when they named `postgresql_where`, which SQLAlchemy checks against the dialect).
NOT_FOR_LIGHT_COMMANDS += ("sqlalchemy.dialects.postgresql",)
LIGHT_COMMANDS = [
    ("tenants", "list"),
    ("tenants", "create", "globex"),
    ("domains", "list", "--tenant", "acme"),
    ("domains", "create", "shipping", "--tenant", "acme"),
    ("keys", "list", "--tenant", "acme"),
    ("keys", "create", "--tenant", "acme", "--scopes", "data:read"),
    ("dataset", "list", "--domain", "billing", "--tenant", "acme"),
    ("models", "list", "--domain", "billing", "--tenant", "acme"),
    ("runs", "list", "--tenant", "acme"),
    ("suites", "list", "--tenant", "acme"),
]


def in_child(workspace: Path, script: str) -> Any:
    """Run `script` in a fresh interpreter in the workspace (the embedded SQLite database);
    the JSON its last line prints."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=workspace,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated embedded workspace with a tenant and a domain."""
    home = tmp_path_factory.mktemp("light")
    for args in (["init"], ["tenants", "create", "acme"], ["domains", "create", "billing"]):
        args += ["--tenant", "acme"] if args[0] == "domains" else []
        assert in_child(home, f"from flywheel.cli import main\nprint(main({args!r}))") == 0
    return home


@pytest.mark.no_database
@pytest.mark.parametrize("args", LIGHT_COMMANDS, ids=" ".join)
def test_a_light_command_loads_none_of_what_it_does_not_use(
    workspace: Path, args: tuple[str, ...]
) -> None:
    names = NOT_FOR_LIGHT_COMMANDS  # a name stands for its package and every submodule
    loaded = (
        f"sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in {names!r}))"
    )
    script = (
        "import json, sys\n"
        "from flywheel.cli import main\n"
        f"code = main({list(args)!r})\n"
        f"print(json.dumps([code, {loaded}]))\n"
    )

    assert in_child(workspace, script) == [0, []]


@pytest.mark.no_database
def test_a_write_maps_the_tables_its_foreign_keys_name(workspace: Path) -> None:
    """A session that imported one package's models only still flushes and bulk-inserts:
    a scheduled cycle names a run (flywheel.registry), which nothing here imported."""
    script = """
import json, sys
from datetime import UTC, datetime
from sqlalchemy import insert, select
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.scheduling.models import ScheduledCycle
from flywheel.settings import Settings
from flywheel.tenancy.models import Domain

sessions = make_session_factory(make_engine(Settings()))
before = "flywheel.registry.models" in sys.modules
with unit_of_work(sessions) as session:
    found = select(Domain.tenant_id, Domain.id).where(Domain.name == "billing")
    tenant, domain = session.execute(found).one()
    row = dict(tenant_id=tenant, domain_id=domain, decision="skipped")
    session.add(ScheduledCycle(**row, period_start=datetime(2026, 1, 5, tzinfo=UTC)))
    session.flush()
    session.execute(insert(ScheduledCycle), [row | {"period_start": datetime(2026, 1, 12)}])
    count = len(session.scalars(select(ScheduledCycle)).all())
    session.rollback()
print(json.dumps([before, count]))
"""

    assert in_child(workspace, script) == [False, 2]


@pytest.mark.no_database
def test_a_command_imports_its_own_command_module_only(workspace: Path) -> None:
    script = (
        "import json, sys\n"
        "from flywheel.cli import main\n"
        "code = main(['tenants', 'list'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('flywheel.cli.'))\n"
        "print(json.dumps([code, loaded]))\n"
    )

    modules = ["flywheel.cli.admin", "flywheel.cli.common", "flywheel.cli.console"]
    modules += ["flywheel.cli.lazy", "flywheel.cli.schema"]
    assert in_child(workspace, script) == [0, modules]
