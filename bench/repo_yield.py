"""Benchmark: how many of a repository's functions become tasks that verifier QA accepts.

For each source (an sdist, a directory or a git URL, as `flywheel ingest repo` takes them)
it runs the repository ingestor's records through `convert`, then verifier QA (the real
bwrap sandbox) on every task ingest accepted, and prints per repository: functions seen,
tasks ingested, tasks passing QA, the accepted->passing ratio, and the rejections by reason
(ingest's, then QA's). The last line sums them all. Asserts nothing.

With `--store`, each repository instead goes the whole way `flywheel ingest repo` goes — the
runner, redaction and the signal store on a scratch SQLite database, then verifier QA on
the stored tasks — and the numbers are the ingest report's (`report` in `--json`).

    python -m bench.repo_yield /tmp/sdists/heldout/*.tar.gz [--workers 2] [--show-failures]
    python -m bench.repo_yield --store /tmp/sdists/heldout/*.tar.gz

The sets measured for issue 18 (sdists from the package index; inflection 0.5.1 is in
tests/fixtures/sdists): tuned on humanize 4.17.0, python-slugify 9.2.0, toolz 1.2.0,
inflection 0.5.1, more-itertools 11.2.1, boltons 26.2.0, pydash 8.1.0, roman 5.2 and
pytimeparse 1.1.10; held out funcy 2.1, natsort 8.4.0, pyhumps 3.8.0, titlecase 2.4.1 and
validators 0.36.0:

    pip download --no-deps --no-binary :all: -d /tmp/sdists/heldout \
        funcy==2.1 natsort==8.4.0 pyhumps==3.8.0 titlecase==2.4.1 validators==0.36.0
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel import migrate
from flywheel.db import make_engine, make_session_factory, unit_of_work
from flywheel.sandbox.qa import QaResult, TaskSpec, check_task
from flywheel.settings import Settings
from flywheel.signals import verification
from flywheel.signals.candidates import TaskCandidate
from flywheel.tenancy import service as tenancy
from ingest.framework import Rejected
from ingest.repo import RepositoryIngestor
from ingest.repo.ingestor import Function
from ingest.repo.report import yield_report
from ingest.runner import run_ingest


@dataclass
class Yield:
    name: str
    functions: int = 0
    tasks: list[TaskCandidate] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    qa: list[QaResult] = field(default_factory=list)

    @property
    def passing(self) -> int:
        return sum(result.status == "usable" for result in self.qa)

    def qa_reasons(self) -> Counter[str]:
        return Counter(_qa_reason(r.reason) for r in self.qa if r.status != "usable")


def _qa_reason(reason: str) -> str:
    """A QA reason without its particulars: `reference fails (failed)`, `flaky`..."""
    match = re.match(r"[^:]*", reason)
    return match.group(0) if match else reason


def ingest(source: str) -> Yield:
    with RepositoryIngestor(source) as repository:
        found = Yield(repository.checkout.name)
        for record in repository.records():
            if isinstance(record.payload, Function):
                found.functions += 1
            try:
                produced = repository.convert(record)
            except Rejected as rejected:
                if isinstance(record.payload, Function):
                    found.rejected[rejected.reason] += 1
                continue
            found.tasks += [task for task in produced if isinstance(task, TaskCandidate)]
    return found


def spec(task: TaskCandidate) -> TaskSpec:
    return TaskSpec(
        task.provenance.source_ref,
        task.prompt,
        task.reference_solution or "",
        task.hidden_tests or "",
        task.entry_point or "",
    )


def report(found: Yield) -> str:
    accepted = len(found.tasks)
    ratio = f"{found.passing / accepted:6.1%}" if accepted else "     -"
    rejected = ", ".join(f"{reason} {n}" for reason, n in found.rejected.most_common())
    failed = ", ".join(f"{reason} {n}" for reason, n in found.qa_reasons().most_common())
    return (
        f"{found.name:<28} {found.functions:>9} {accepted:>8} {found.passing:>8} {ratio:>8}\n"
        f"    rejected at ingest: {rejected or 'none'}\n"
        f"    unusable at QA:     {failed or 'none'}"
    )


def through_the_store(source: str, workers: int) -> dict[str, Any]:
    """`flywheel ingest repo SOURCE` into a scratch SQLite database: the ingest report."""
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{Path(scratch) / 'flywheel.db'}"
        migrate.upgrade(url)
        engine = make_engine(Settings(database_url=url))
        sessions = make_session_factory(engine)
        with unit_of_work(sessions) as session:
            tenant = tenancy.create_tenant(session=session, name="bench")
            domain = tenancy.create_domain(session=session, tenant=tenant, name="code")
            tenant_id, domain_id = tenant.id, domain.id
        with RepositoryIngestor(source) as repository:
            run_ingest(sessions, repository, tenant_id=tenant_id, domain_id=domain_id)
            with sessions() as session:
                pending = verification.pending_tasks(session=session, domain_id=domain_id)
                specs = [verification.task_spec(task) for task in pending]
            results = verification.check_all(specs, workers=workers, on_done=lambda _: None)
            with unit_of_work(sessions) as session:
                verification.record_results(session=session, results=results)
            with sessions() as session:
                report = yield_report(session, domain_id, repository.outcomes)
        engine.dispose()
    report["name"] = Path(source).name
    return report


def stored_line(report: dict[str, Any]) -> str:
    share = f"{report['usable_share']:6.1%}" if report["usable_share"] is not None else "     -"
    name, functions, tasks, usable = (
        report[key] for key in ("name", "functions", "tasks", "usable")
    )
    return f"{name:<28} {functions:>9} {tasks:>8} {usable:>8} {share:>8}"


def main_store(sources: list[str], workers: int) -> None:
    print(
        f"{'repository (stored)':<28} {'functions':>9} {'ingested':>8} {'pass QA':>8} {'ratio':>8}"
    )
    counts: Counter[str] = Counter()
    for source in sources:
        report = through_the_store(source, workers)
        print(stored_line(report))
        counts.update({key: report[key] for key in ("functions", "tasks", "usable")})
    share = counts["usable"] / counts["tasks"] if counts["tasks"] else None
    print(stored_line({"name": "all", **counts, "usable_share": share}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="sdists, directories or git URLs")
    parser.add_argument("--workers", type=int, default=2, help="QA runs at once")
    parser.add_argument("--show-failures", action="store_true", help="print each QA failure")
    parser.add_argument("--store", action="store_true", help="through the store, redacted")
    args = parser.parse_args()
    if args.store:
        main_store(args.sources, args.workers)
        return
    print(f"{'repository':<28} {'functions':>9} {'ingested':>8} {'pass QA':>8} {'ratio':>8}")
    total = Yield("all")
    for source in args.sources:
        found = ingest(source)
        with ThreadPoolExecutor(args.workers) as pool:
            found.qa = list(pool.map(check_task, map(spec, found.tasks)))
        print(report(found))
        if args.show_failures:
            for result in found.qa:
                if result.status != "usable":
                    print(f"      {result.task_id}: {result.reason[:400]}")
        total.functions += found.functions
        total.tasks += found.tasks
        total.rejected += found.rejected
        total.qa += found.qa
    print(report(total))


if __name__ == "__main__":
    main()
