"""`flywheel ingest ...`, plugged into the flywheel CLI by entry point.

Every ingest runs through `ingest.runner` (batches, counts, resume) and prints the run's
counts; tasks then go through verifier QA unless `--no-verify`.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import (
    JsonOption,
    database_sessions,
    emit,
    progress_bar,
    resolve_tenant_id,
    step,
)
from flywheel.errors import InvalidInput

if TYPE_CHECKING:  # the rest loads in the commands: `flywheel --help` stays fast
    from sqlalchemy.orm import Session, sessionmaker

    from ingest.framework import Ingestor
    from ingest.runner import RunResult

ingest = typer.Typer(
    help="Read tickets, repositories, feedback and task files into training signal.",
    no_args_is_help=True,
)

DomainOption = typer.Option(..., "--domain", help="The domain to ingest into.")
TenantOption = typer.Option(
    None, "--tenant", help="The domain's tenant (may be left out when there is only one)."
)
VerifyOption = typer.Option(True, "--verify/--no-verify", help="Run verifier QA on new tasks.")


@ingest.command("tickets")
def ingest_tickets(
    path: Path | None = typer.Argument(None, help="The export file (none with --from-github)."),
    source_format: str | None = typer.Option(
        None, "--format", help="zendesk, jira, github or csv (csv needs --mapping)."
    ),
    mapping: str | None = typer.Option(
        None, "--mapping", help="CSV columns, e.g. 'id=Ticket ID,body=Description,...'."
    ),
    from_github: str | None = typer.Option(
        None,
        "--from-github",
        metavar="OWNER/REPO",
        help="Fetch the repository's issues with their comments from the GitHub API (token "
        "from FLYWHEEL_GITHUB_TOKEN or GITHUB_TOKEN); a rerun resumes it, or fetches what changed.",
    ),
    github_state: Path | None = typer.Option(
        None, "--github-state", help="Where the fetch keeps issues and cursor [<home>/github/]."
    ),
    max_rate_wait_s: float = typer.Option(
        60.0, "--max-rate-wait", min=0, help="Seconds to wait out a GitHub rate limit, else stop."
    ),
    domain: str = DomainOption,
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Support tickets: resolutions become SFT examples, reopen/re-solve becomes pairs."""
    from ingest.tickets import make_ticket_ingestor

    if from_github is not None:
        if path is not None or source_format not in (None, "github"):
            raise InvalidInput("--from-github takes no export file and no --format but github")
        with _domain(tenant, domain):  # a wrong domain fails before any request is made
            pass
        path = _fetch_github(from_github, github_state, max_rate_wait_s, quiet=as_json)
        source_format = "github"
    if path is None or source_format is None:
        raise InvalidInput("give an export file and its --format, or --from-github owner/repo")
    _run(make_ticket_ingestor(source_format, path, mapping), tenant, domain, as_json)


def _fetch_github(repository: str, state: Path | None, max_wait_s: float, *, quiet: bool) -> Path:
    """Fetch (or finish fetching) the repository's issues; the export file."""
    from flywheel.cli.common import settings
    from ingest.tickets import github_api

    github_api.check_repository(repository)
    state_dir = state or settings().home / "github" / repository.replace("/", "+")
    api = github_api.github_api_from_environment(max_wait_s=max_wait_s)
    try:
        with progress_bar(f"github: fetching {repository}", is_quiet=quiet) as advance:
            result = github_api.fetch_issues(api, repository, state_dir, progress=advance)
    finally:
        api.close()
    how = f"updated since {result.since}" if result.since else "all"
    how += ", resumed" if result.is_resumed else ""
    sys.stderr.write(
        f"github: {result.issues} issues of {repository} in {result.path}; fetched {how}: "
        f"{result.fetched} issues in {result.requests} requests\n"
    )
    return result.path


@ingest.command("repo")
def ingest_repo(
    source: str = typer.Argument(
        ..., help="A local directory, an sdist (.tar.gz/.zip) or a git URL (file:// works offline)."
    ),
    history: int = typer.Option(0, min=0, help="Also mine the last N commits for tasks."),
    domain: str = DomainOption,
    tenant: str | None = TenantOption,
    verify: bool = VerifyOption,
    as_json: bool = JsonOption,
) -> None:
    """A code repository: functions its tests exercise become verifiable tasks."""
    from ingest.repo import RepositoryIngestor
    from ingest.repo.report import yield_report

    with step(f"reading {source}", is_quiet=as_json):
        repository = RepositoryIngestor(source, history=history)  # clones, finds the source
    with repository:  # removes its clone

        def report(session: Session, domain_id: uuid.UUID) -> dict[str, Any]:
            return yield_report(session, domain_id, repository.outcomes)

        _run(repository, tenant, domain, as_json, verify=verify, report=report)


@ingest.command("feedback")
def ingest_feedback(
    path: Path = typer.Argument(..., help="JSONL, one POST /v1/feedback body per line."),
    domain: str = DomainOption,
    tenant: str | None = TenantOption,
    as_json: bool = JsonOption,
) -> None:
    """Feedback events from a file, as if the API had received them."""
    from ingest.feedback_file import FeedbackFileIngestor

    _run(FeedbackFileIngestor(path, domain), tenant, domain, as_json)


@ingest.command("tasks")
def ingest_tasks(
    path: Path = typer.Argument(..., help="A task JSONL file (.jsonl or .jsonl.gz)."),
    source_format: str = typer.Option(
        "flywheel", "--format", help="flywheel, humaneval, mbpp or bfcl."
    ),
    answers: Path | None = typer.Option(
        None,
        "--answers",
        help="bfcl: the possible answers [possible_answer/<FILE's name> beside FILE].",
    ),
    environments: Path | None = typer.Option(
        None,
        "--environments",
        help="bfcl: the directory of BFCL's environment classes, for multi-turn files "
        "[the installed bfcl_eval's func_source_code].",
    ),
    domain: str = DomainOption,
    tenant: str | None = TenantOption,
    verify: bool = VerifyOption,
    as_json: bool = JsonOption,
) -> None:
    """Verifiable tasks from HumanEval/MBPP-style, BFCL or Flywheel task JSONL."""
    from ingest.task_files import make_task_ingestor

    ingestor = make_task_ingestor(path, source_format, answers=answers, environments=environments)
    _run(ingestor, tenant, domain, as_json, verify=verify)


@ingest.command("export-tasks")
def ingest_export_tasks(
    domain: str = DomainOption,
    tenant: str | None = TenantOption,
    out: Path | None = typer.Option(None, "--out", help="Write here instead of stdout."),
    status: str | None = typer.Option(None, help="Only tasks QA marked so (e.g. usable)."),
) -> None:
    """Write a domain's tasks as Flywheel task JSONL (what `ingest tasks` reads back)."""
    from ingest.task_files import export_tasks

    with _domain(tenant, domain) as (sessions, _, domain_id), sessions() as session:
        if out is None:
            written = export_tasks(
                session=session, domain_id=domain_id, out=sys.stdout, status=status
            )
        else:
            try:
                sink = out.open("w", encoding="utf-8")
            except OSError as error:
                raise InvalidInput(f"cannot write {out}: {error.strerror or error}") from error
            with sink:
                written = export_tasks(
                    session=session, domain_id=domain_id, out=sink, status=status
                )
    sys.stderr.write(f"{written} tasks written\n")


Report = Callable[["Session", uuid.UUID], dict[str, Any]]  # the source's own account of a run


def _run(
    ingestor: Ingestor,
    tenant: str | None,
    domain: str,
    as_json: bool,
    *,
    verify: bool = False,
    report: Report | None = None,
) -> None:
    from ingest.runner import run_ingest

    with _domain(tenant, domain) as (sessions, tenant_id, domain_id):
        with progress_bar(
            f"{ingestor.source_format}: {ingestor.source_ref}", is_quiet=as_json
        ) as advance:
            result = run_ingest(
                sessions, ingestor, tenant_id=tenant_id, domain_id=domain_id, progress=advance
            )
        data = _run_summary(result)
        if verify:
            data["verifier"] = _verify_pending(sessions, domain_id, quiet=as_json)
        if report is not None:
            with sessions() as session:
                data["report"] = report(session, domain_id)
    emit(data, as_json=as_json, text=_text(data))


def _text(data: dict[str, Any]) -> str:
    """The counts as lines; a source's own report (a repository's yield) after them."""
    counts = _lines({key: value for key, value in data.items() if key != "report"})
    if "report" not in data:
        return counts
    from ingest.repo.report import report_lines

    return counts + "\n" + report_lines(data["report"])


def _run_summary(result: RunResult) -> dict[str, Any]:
    return {"run_id": str(result.run_id), "resumed_from": result.resumed_from} | (
        result.counts.as_json()
    )


def _verify_pending(
    sessions: sessionmaker[Session], domain_id: uuid.UUID, *, quiet: bool
) -> dict[str, int]:
    """QA the domain's pending tasks (no transaction stays open while the sandbox runs)."""
    from flywheel.db import unit_of_work
    from flywheel.signals import verification

    with sessions() as session:
        specs = [
            verification.task_spec(task)
            for task in verification.pending_tasks(session=session, domain_id=domain_id)
        ]
    with progress_bar("verifying tasks", is_quiet=quiet, total=len(specs)) as advance:
        results = verification.check_all(
            specs, workers=os.cpu_count() or 1, on_done=lambda _: advance(1)
        )
    with unit_of_work(sessions) as session:
        verification.record_results(session=session, results=results)
    usable = sum(result.status == "usable" for result in results)
    return {"checked": len(results), "usable": usable, "unusable": len(results) - usable}


@contextmanager
def _domain(
    tenant: str | None, domain: str
) -> Iterator[tuple[sessionmaker[Session], uuid.UUID, uuid.UUID]]:
    from flywheel.db import unit_of_work
    from flywheel.tenancy.service import get_domain

    with database_sessions() as sessions:
        with unit_of_work(sessions) as session:
            tenant_id = resolve_tenant_id(session, tenant)
            domain_id = get_domain(session, tenant_id, domain).id
        yield sessions, tenant_id, domain_id


def _lines(data: dict[str, Any], indent: str = "") -> str:
    """A nested dict as indented `key: value` lines, for people."""
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:" + ("" if value else " none"))
            if value:
                lines.append(_lines(value, indent + "  "))
        else:
            lines.append(f"{indent}{key}: {value}")
    return "\n".join(lines)
