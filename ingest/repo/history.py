"""Tasks from git history: a commit that changed source and tests together says "make these
tests pass", and its own source change is the reference.

For each function that the commit's new or changed tests call, and whose program the commit
changed, the prompt is the commit message and the program as it was before (the function's
new stub when the commit added it); the reference is the program after; the hidden tests
are the commit's tests of that function. QA's trivial-solution check runs the prompt itself
as a solution, so a task whose tests the old code already passes is found unusable there —
it is not re-checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flywheel.signals.candidates import TaskCandidate
from ingest.framework import Rejected
from ingest.repo.codebase import Codebase
from ingest.repo.discover import FoundTest
from ingest.repo.files import CommitSnapshot, is_source, is_test_file, is_walked, run_git
from ingest.repo.names import bound_names
from ingest.repo.program import Program
from ingest.repo.tasks import Origin, RepoTests, program_for, runnable, task

FIELD, RECORD = "\x1f", "\x1e"


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author: str
    message: str


def recent_commits(git_dir: Path, count: int) -> list[Commit]:
    """The last `count` commits on HEAD's first-parent line, newest first."""
    if count <= 0:
        return []
    log = run_git(
        git_dir,
        "log",
        f"-n{count}",
        "--first-parent",
        f"--format=%H{FIELD}%P{FIELD}%an{FIELD}%B{RECORD}",
    )
    commits = []
    for entry in log.split(RECORD):
        fields = entry.strip("\n").split(FIELD)
        if len(fields) == 4:
            sha, parents, author, message = fields
            commits.append(Commit(sha, tuple(parents.split()), author, message.strip()))
    return commits


def commit_tasks(git_dir: Path, commit: Commit, repo: str, group_key: str) -> list[TaskCandidate]:
    """The commit's "make these tests pass" tasks; Rejected when it yields none."""
    if len(commit.parents) > 1:
        raise Rejected("merge_commit", f"{commit.sha[:7]} merges branches")
    if not commit.parents:
        raise Rejected("root_commit", f"{commit.sha[:7]} has no parent here to compare with")
    changed = _changed_python(git_dir, commit)
    if not any(is_source(path) for path in changed):
        raise Rejected("no_source_change", f"{commit.sha[:7]} changes no source file")
    test_paths = [path for path in changed if is_test_file(path)]
    if not test_paths:
        raise Rejected("no_test_change", f"{commit.sha[:7]} changes no test file")
    after = Codebase(CommitSnapshot(git_dir, commit.sha))
    before = Codebase(CommitSnapshot(git_dir, commit.parents[0]))
    tests = _new_or_changed(after, before, test_paths)
    origin = Origin(repo, commit.sha[:7], group_key, names=tuple(filter(None, [commit.author])))
    tasks: list[TaskCandidate] = []
    reasons: list[Rejected] = []
    for module, name in _targets(tests):
        try:
            tasks.append(_task(after, before, module, name, tests, commit, origin))
        except Rejected as rejected:
            reasons.append(rejected)
    if tasks:
        return tasks
    if reasons:
        raise reasons[0]
    raise Rejected("no_tests", f"{commit.sha[:7]}'s tests call no function of the repository")


def _changed_python(git_dir: Path, commit: Commit) -> list[str]:
    names = run_git(
        git_dir, "diff", "--name-only", "--no-renames", "-z", commit.parents[0], commit.sha
    )
    return sorted(path for path in names.split("\0") if path and is_walked(path))


def _new_or_changed(after: Codebase, before: Codebase, paths: list[str]) -> list[FoundTest]:
    """The commit's tests: those in its changed test files that are new or differ."""
    old = {test.origin: test for test in RepoTests(before, _present(before, paths)).tests}
    return [
        test
        for test in RepoTests(after, _present(after, paths)).tests
        if test.origin not in old or _shape(old[test.origin]) != _shape(test)
    ]


def _present(codebase: Codebase, paths: list[str]) -> list[str]:
    present = set(codebase.paths)
    return [path for path in paths if path in present]


def _shape(test: FoundTest) -> tuple[str, tuple[tuple[frozenset[str], str], ...], str | None]:
    return test.code, test.setup, test.reason


def _targets(tests: list[FoundTest]) -> list[tuple[str, str]]:
    """The functions the tests call, in a stable order."""
    found = {
        (symbol.module, symbol.name)
        for test in tests
        for symbol in test.targets
        if symbol.kind == "function"
    }
    return sorted(found)


def _task(
    after: Codebase,
    before: Codebase,
    module: str,
    name: str,
    tests: list[FoundTest],
    commit: Commit,
    origin: Origin,
) -> TaskCandidate:
    calling = [
        test for test in tests if any(s.name == name and s.module == module for s in test.targets)
    ]
    usable = runnable(calling, name)
    program = program_for(after, module, name, usable)
    old = _old_program(before, module, name, usable)
    if old is not None and old.reference == program.reference:
        raise Rejected("source_unchanged", f"{commit.sha[:7]} does not change {name}'s program")
    if old is not None:
        prompt = _header(commit, "changed this code", "Change it likewise") + old.reference
    elif name in _names_of(before, module):
        prompt = _header(commit, f"changed `{name}`", "Write its new version") + program.prompt
    else:
        prompt = _header(commit, f"added `{name}`", "Write it") + program.prompt
    return task(origin, after.path_of_module[module], name, prompt, program, usable)


def _old_program(
    before: Codebase, module: str, name: str, tests: list[FoundTest]
) -> Program | None:
    """The program as it was before the commit; None if it did not exist or cannot stand
    alone (the function had no docstring then, say)."""
    try:
        return program_for(before, module, name, tests) if before.module(module) else None
    except Rejected:
        return None


def _names_of(codebase: Codebase, module: str) -> set[str]:
    source = codebase.module(module)
    return set().union(*(bound_names(s) for s in source.tree.body)) if source else set()


def _header(commit: Commit, what: str, ask: str) -> str:
    """The commit message, as comments above the code (so the prompt stays a program)."""
    message = "\n".join(f"#     {line}".rstrip() for line in commit.message.splitlines())
    return (
        f"# A commit to this repository {what}. Its message:\n#\n{message}\n#\n"
        f"# {ask}, so that the commit's tests pass; answer with the complete program.\n\n"
    )
