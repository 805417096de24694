"""`RepositoryIngestor`: a repository's tested functions and test-carrying commits as
verifiable tasks.

Records, in a stable order: each Python file that cannot be read (with why), each function and
method of the project's source in the working tree (path order, then source order), then, with
`history=N`, each of the last N commits (newest first). A record yields one task, several (a
commit), or is Rejected with a reason the run counts: `no_tests`, `method`, `uses_fixtures`,
`third_party_imports`, `too_large`, `binary_file`, `undecodable`...
"""

from __future__ import annotations

import ast
import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType

from flywheel.errors import InvalidInput
from flywheel.signals.candidates import Candidate
from ingest.framework import Rejected, SourceRecord
from ingest.repo.codebase import Codebase
from ingest.repo.files import (
    MAX_FILE_BYTES,
    DirectorySnapshot,
    PythonFile,
    Skipped,
    Snapshot,
    is_source,
)
from ingest.repo.history import Commit, commit_tasks, recent_commits
from ingest.repo.report import Outcome
from ingest.repo.source import Checkout, head_commit, open_source, public_url
from ingest.repo.tasks import Origin, RepoTests, function_task

MAX_HISTORY = 10_000


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Function:
    path: str
    module: str | None  # None: the file cannot be imported under any module name
    qualname: str  # "f", or "Class.method"


class RepositoryIngestor:
    """Tasks from a repository: a local directory (git or not), an sdist archive, or a git
    URL (cloned shallowly into a temporary directory; `file://` works offline).

    Use it as a context manager, or call `close()`, to remove a clone or extraction at once.
    """

    source_kind = "repository"
    source_format = "repository"
    version = "repository/1"
    records_are_groups = False

    def __init__(self, source: str, history: int = 0) -> None:
        if not 0 <= history <= MAX_HISTORY:
            raise InvalidInput(f"history must be between 0 and {MAX_HISTORY} commits")
        self.source = source
        self.history = history
        self.checkout: Checkout = open_source(source, history)
        self.head = head_commit(self.checkout)
        if history and self.head is None:
            self.close()
            raise InvalidInput(f"{self.source_ref} has no commits: --history needs some")
        self.codebase = Codebase(DirectorySnapshot(self.checkout.root))
        if not self.codebase.paths:
            self.close()
            raise InvalidInput(f"{self.source_ref} holds no Python source")
        self._index: RepoTests | None = None
        self._fingerprint: str | None = None
        self._commits: list[Commit] | None = None
        self.outcomes: list[Outcome] = []  # what `convert` made of each record, in order

    @property
    def source_ref(self) -> str:
        return public_url(self.source)

    def close(self) -> None:
        self.checkout.close()

    def __enter__(self) -> RepositoryIngestor:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def fingerprint(self) -> str:
        """sha256 over every Python file read (path and bytes) and the commits read."""
        if self._fingerprint is None:
            digest = hashlib.sha256(f"history={self.history}\n".encode())
            snapshot = self.codebase.snapshot
            for path in self.codebase.paths:
                digest.update(path.encode(errors="surrogateescape") + b"\0")
                digest.update(_content_digest(snapshot, path))
            for commit in self.commits():
                digest.update(commit.sha.encode())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def commits(self) -> list[Commit]:
        if self._commits is None:
            self._commits = recent_commits(self.checkout.root, self.history)
        return self._commits

    def records(self) -> Iterator[SourceRecord]:
        payloads = itertools.chain(self._working_tree(), self.commits())
        for position, payload in enumerate(payloads):
            yield SourceRecord(position, _ref(payload), payload)

    def _working_tree(self) -> Iterator[SkippedFile | Function]:
        for path in self.codebase.paths:
            read = self.codebase.read(path)
            if isinstance(read, Skipped):
                yield SkippedFile(path, read.reason, read.detail)
            elif is_source(path):
                module = self.codebase.module_of_path.get(path)
                yield from (Function(path, module, name) for name in _functions(read))

    def convert(self, record: SourceRecord) -> list[Candidate]:
        """The record's tasks, or Rejected; either way its outcome joins `outcomes`."""
        kind = _kind(record.payload)
        try:
            produced = self._convert(record)
        except Rejected as rejected:
            self.outcomes.append(Outcome(record.ref, kind, rejected.reason, rejected.detail))
            raise
        refs = tuple(str(candidate.provenance.source_ref) for candidate in produced)
        self.outcomes.append(Outcome(record.ref, kind, "task", task_refs=refs))
        return produced

    def _convert(self, record: SourceRecord) -> list[Candidate]:
        payload = record.payload
        try:
            if isinstance(payload, SkippedFile):
                raise Rejected(payload.reason, payload.detail)
            if isinstance(payload, Function):
                return [self._function_task(payload)]
            if isinstance(payload, Commit):
                return list(commit_tasks(self.checkout.root, payload, self._name, self._group))
        except RecursionError as error:  # a pathologically nested expression
            raise Rejected("too_complex", f"{record.ref}: nested too deeply") from error
        raise InvalidInput(f"{record.ref}: not a record of this repository")

    def _function_task(self, function: Function) -> Candidate:
        if "." in function.qualname:
            raise Rejected(
                "method", f"{function.qualname}: only module-level functions become tasks"
            )
        if function.module is None:
            raise Rejected("not_importable", f"{function.path} has no importable module name")
        if self._index is None:
            self._index = RepoTests(self.codebase)
        origin = Origin(self._name, self._revision, self._group)
        return function_task(self.codebase, self._index, function.module, function.qualname, origin)

    @property
    def _name(self) -> str:
        return self.checkout.name

    @property
    def _group(self) -> str:
        return f"repository:{self.checkout.name}"

    @property
    def _revision(self) -> str:
        return self.head[:7] if self.head else self.fingerprint()[:12]


def _content_digest(snapshot: Snapshot, path: str) -> bytes:
    """A file's sha256; for one too large or unreadable (never parsed), what says so."""
    try:
        size = snapshot.size(path)
        if size > MAX_FILE_BYTES:
            return f"size {size}".encode()
        return hashlib.sha256(snapshot.read_bytes(path)).digest()
    except OSError as error:
        return f"unreadable {error.errno}".encode()


def _functions(file: PythonFile) -> Iterator[str]:
    """Module-level functions and the methods of module-level classes, in source order."""
    for node in file.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}"


def _ref(payload: SkippedFile | Function | Commit) -> str:
    if isinstance(payload, SkippedFile):
        return payload.path
    if isinstance(payload, Function):
        return f"{payload.path}::{payload.qualname}"
    return f"commit {payload.sha[:7]}"


def _kind(payload: object) -> str:
    if isinstance(payload, Function):
        return "function"
    return "file" if isinstance(payload, SkippedFile) else "commit"
