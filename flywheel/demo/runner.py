"""`flywheel demo`: the whole flywheel on one laptop, in an empty directory.

On the embedded default (SQLite, a local MLflow store, CPU): bundled sample data goes in
through the ordinary commands (support tickets and feedback, a small repository with tests,
feedback on two-digit additions), a tiny base model is pretrained on the additions without a
carry, and the arithmetic domain turns twice — cycle, live traffic, more feedback, cycle,
live traffic — each turn compiling the feedback, building a dataset version, training a LoRA
adapter in a subprocess, evaluating it against the champion (or the base) and promoting it
when the gate passes. Between the turns, simulated users ask additions through the gateway
(`flywheel gateway --backend local`, the champion answering) and rate each answer through the
REST API (`flywheel serve`): that feedback is part of what the second turn trains on
(`flywheel.demo.traffic`). Then a tool domain (`orders`, flywheel.demo.tools): a second tiny
base, which knows how to look an order up, learns to cancel one through a tool in a sandboxed
environment (SFT on a few demonstrations, then GRPO in the environment). It ends with a
summary table (the held-out metric of each version next to its live thumbs-up rate, and the
tool domain's held-out success before and after) and an HTML report (`<dir>/report.html`).

Every step is a real `flywheel` command run in this process (`flywheel.cli.main`), so the
demo walks the same paths a user does.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from flywheel.cli.common import database_session, emit
from flywheel.cli.doctor import preflight
from flywheel.demo.arithmetic_feedback import live_problems
from flywheel.demo.data import (
    ARITHMETIC_DOMAIN,
    CODE_DOMAIN,
    SUPPORT_DOMAIN,
    arithmetic_plan,
    write_arithmetic,
    write_repository,
    write_support,
)
from flywheel.demo.tools import run_tools_domain, tool_rows
from flywheel.demo.traffic import Services, ask_and_rate, live_services, round_summary
from flywheel.errors import InvalidInput, InvalidState

TENANT = "demo"
LIVE_QUESTIONS = {False: 120, True: 60}  # per round of live traffic, full and quick demo
SETTINGS_LEFT_OUT = ("FLYWHEEL_DATABASE_URL", "FLYWHEEL_MLFLOW_TRACKING_URI", "FLYWHEEL_BASE_MODEL")


@dataclass
class Demo:
    directory: Path
    quick: bool
    stages: list[dict[str, Any]] = field(default_factory=list)
    cycles: list[dict[str, Any]] = field(default_factory=list)
    ingested: dict[str, Any] = field(default_factory=dict)
    live: list[dict[str, Any]] = field(default_factory=list)  # each round of live traffic
    tools: dict[str, Any] = field(default_factory=dict)  # the tool domain's run

    @property
    def home(self) -> Path:
        return self.directory / ".flywheel"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def base(self) -> Path:
        return self.home / "models" / "tiny-base"


def run_demo(directory: Path, *, quick: bool) -> Demo:
    """Run the demo in `directory` (created; it must not hold a workspace already), once
    every requirement is known to be met."""
    preflight("flywheel demo", needs_git=True)  # its repository is ingested with --history
    demo = Demo(directory.resolve(), quick)
    if demo.home.exists():
        raise InvalidInput(f"{demo.home} already exists: run the demo in an empty directory")
    demo.directory.mkdir(parents=True, exist_ok=True)
    _use_workspace(demo)
    plan = arithmetic_plan(quick=quick)  # calibrated: see flywheel/demo/data.py
    total = 11
    with _stage(demo, 1, total, "workspace: embedded database and MLflow store"):
        key = _setup(demo, plan)
    with _stage(demo, 2, total, "tiny base model: pretrained on additions without a carry"):
        _pretrain(demo, plan)
    with _stage(demo, 3, total, "ingest: support tickets and feedback, a repository, feedback"):
        _ingest_samples(demo)
    with _stage(demo, 4, total, "compile and build dataset versions (support, code)"):
        for domain in (SUPPORT_DOMAIN, CODE_DOMAIN):
            _cli("compile", "--domain", domain, "--tenant", TENANT)
            _cli("dataset", "build", "--domain", domain, "--tenant", TENANT)
    with _stage(demo, 5, total, "cycle 1 of arithmetic: compile, build, train, eval, gate"):
        demo.cycles.append(_cycle())
    with contextlib.ExitStack() as running:
        with _stage(demo, 6, total, "live traffic: users ask through the gateway, rate answers"):
            services = running.enter_context(live_services(demo.base, demo.home / "logs"))
            demo.live.append(_live_round(demo, services, key, 1))
        with _stage(demo, 7, total, "more feedback arrives (batch 2)"):
            (path,) = write_arithmetic(demo.data, batch=2, quick=quick)
            demo.ingested["arithmetic batch 2"] = _ingest("feedback", str(path), ARITHMETIC_DOMAIN)
        with _stage(demo, 8, total, "cycle 2 of arithmetic: against the champion"):
            demo.cycles.append(_cycle())
        with _stage(demo, 9, total, "live traffic again: the new champion answers"):
            demo.live.append(_live_round(demo, services, key, 2))
    with _stage(demo, 10, total, "tool domain: a tiny model learns to cancel orders by a tool"):
        demo.tools = run_tools_domain(_cli, demo.directory, demo.home, TENANT, quick=quick)
    with _stage(demo, 11, total, "report"):
        _cli("report", "--domain", ARITHMETIC_DOMAIN, "--tenant", TENANT,
             "--out", str(demo.directory / "report.html"))  # fmt: skip
    return demo


def _use_workspace(demo: Demo) -> None:
    """The embedded default, whatever this shell points at: the demo never touches a
    configured database or MLflow server. Subprocesses (training) inherit it."""
    os.environ["FLYWHEEL_HOME"] = str(demo.home)
    # One thread per subprocess: on 2 shared cores, torch's own thread pool made pretraining
    # 2-6x slower (24 s with one thread against 48-139 s with two, measured).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in SETTINGS_LEFT_OUT:
        os.environ.pop(name, None)


def _setup(demo: Demo, plan: dict[str, Any]) -> str:
    """The workspace, the tenant, its domains; returns the key the simulated users hold."""
    _cli("init")
    _cli("tenants", "create", TENANT)
    configs = {
        ARITHMETIC_DOMAIN: {
            "base_model": str(demo.base),
            "primary_metric": plan["primary_metric"],
            "gate": plan["gate"],
            "slice_rules": plan["slice_rules"],
            "cycle": plan["cycle"] | {"schedule": None},  # the demo turns it by hand
        },
        SUPPORT_DOMAIN: {"base_model": str(demo.base)},
        CODE_DOMAIN: {"base_model": str(demo.base)},
    }
    for name, config in configs.items():
        _cli("domains", "create", name, "--tenant", TENANT)
        path = demo.directory / "config" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        _cli("domains", "configure", name, "--tenant", TENANT, "--file", str(path))
    scopes = "infer,feedback:write"
    issued = _cli("keys", "create", "--tenant", TENANT, "--scopes", scopes, "--name", "demo-users")
    return str(issued["key"])


def _pretrain(demo: Demo, plan: dict[str, Any]) -> None:
    command = [sys.executable, "-m", "finetune.tiny", "--out", str(demo.base),
               "--steps", str(plan["pretrain_steps"])]  # fmt: skip
    # its output is progress: to stderr, so that stdout holds only the demo's result
    if subprocess.run(command, stdout=sys.stderr, check=False).returncode != 0:
        raise InvalidState("building the tiny base model failed (its output is above)")


def _ingest_samples(demo: Demo) -> None:
    tickets, support_feedback = write_support(demo.data)
    repository = write_repository(demo.data)
    (arithmetic,) = write_arithmetic(demo.data, batch=1, quick=demo.quick)
    demo.ingested["support tickets"] = _ingest(
        "tickets", str(tickets), SUPPORT_DOMAIN, "--format", "csv"
    )
    demo.ingested["support feedback"] = _ingest("feedback", str(support_feedback), SUPPORT_DOMAIN)
    demo.ingested["repository"] = _ingest("repo", str(repository), CODE_DOMAIN, "--history", "2")
    demo.ingested["arithmetic batch 1"] = _ingest("feedback", str(arithmetic), ARITHMETIC_DOMAIN)


def _live_round(demo: Demo, services: Services, key: str, number: int) -> dict[str, Any]:
    problems = live_problems(number, LIVE_QUESTIONS[demo.quick])
    answers = ask_and_rate(services, key, ARITHMETIC_DOMAIN, problems)
    return {"round": number, **round_summary(answers)}


def _ingest(kind: str, source: str, domain: str, *extra: str) -> Any:
    return _cli("ingest", kind, source, "--domain", domain, "--tenant", TENANT, *extra)


def _cycle() -> dict[str, Any]:
    outcome: dict[str, Any] = _cli("cycle", "--domain", ARITHMETIC_DOMAIN, "--tenant", TENANT)
    return outcome


def _cli(*argv: str) -> Any:
    """Run one `flywheel` command here, its JSON result captured (its progress and logs go
    to stderr as usual); a failure stops the demo with that command's error."""
    from flywheel.cli import main as flywheel  # here: flywheel.cli imports this module

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = flywheel([*argv, "--json"])
    if code != 0:
        raise InvalidState(f"`flywheel {' '.join(argv)}` failed (its error is above)")
    text = captured.getvalue().strip()
    return json.loads(text) if text else None


@contextlib.contextmanager
def _stage(demo: Demo, number: int, total: int, title: str) -> Any:
    sys.stderr.write(f"\n[{number}/{total}] {title}\n")
    sys.stderr.flush()
    started = time.monotonic()
    yield
    seconds = time.monotonic() - started
    demo.stages.append({"stage": title, "seconds": round(seconds, 1)})
    sys.stderr.write(f"[{number}/{total}] done in {seconds:.1f} s\n")


def demo_command(directory: Path, *, quick: bool, as_json: bool) -> None:
    """`flywheel demo` (registered, with its options and help, by flywheel.cli.demo): run the
    demo, then print its summary table (or JSON) and where the report is."""
    from flywheel.demo.summary import (  # DB models: here
        cycle_rows,
        domain_counts,
        live_by_version,
        print_summary,
        version_rows,
    )

    started = time.monotonic()
    demo = run_demo(directory, quick=quick)
    tools = tool_rows(demo.tools)
    with database_session() as session:
        counts = domain_counts(session)
        versions = version_rows(demo.cycles, live_by_version(session, ARITHMETIC_DOMAIN))
    data = {
        "directory": str(demo.directory),
        "report": str(demo.directory / "report.html"),
        "seconds": round(time.monotonic() - started, 1),
        "stages": demo.stages,
        "ingested": demo.ingested,
        "domains": counts,
        "cycles": cycle_rows(demo.cycles),
        "live": demo.live,
        "versions": versions,
        "tools": tools,
    }
    if as_json:
        emit(data, as_json=True, text="")
        return
    console = Console() if sys.stdout.isatty() else Console(width=120)  # a log: room for it
    print_summary(console, counts, demo.cycles, versions, tools)
    console.print(f"report: {data['report']}  ({data['seconds']:.0f} s in all)")
