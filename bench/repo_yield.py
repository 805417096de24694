"""Benchmark: how many of a repository's functions become tasks that verifier QA accepts.

For each source (an sdist, a directory or a git URL, as `flywheel ingest repo` takes them)
it runs the repository ingestor's records through `convert`, then verifier QA (the real
bwrap sandbox) on every task ingest accepted, and prints per repository: functions seen,
tasks ingested, tasks passing QA, the accepted->passing ratio, and the rejections by reason
(ingest's, then QA's). The last line sums them all. Asserts nothing.

    python -m bench.repo_yield /tmp/sdists/heldout/*.tar.gz [--workers 2] [--show-failures]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from flywheel.sandbox.qa import QaResult, TaskSpec, check_task
from flywheel.signals.candidates import TaskCandidate
from ingest.framework import Rejected
from ingest.repo import RepositoryIngestor
from ingest.repo.ingestor import Function


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="sdists, directories or git URLs")
    parser.add_argument("--workers", type=int, default=2, help="QA runs at once")
    parser.add_argument("--show-failures", action="store_true", help="print each QA failure")
    args = parser.parse_args()
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
