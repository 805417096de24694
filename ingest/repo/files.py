"""The Python files of a snapshot (a directory, or one commit of a git repository), read safely.

A repository holds things no ingestor should parse: vendored environments, build output,
megabyte-sized generated modules, binary blobs named `.py`, Latin-1 files with a PEP 263
cookie and files no codec can read. Directories that are never source are not walked at all;
every Python file that is walked either parses or is skipped with a reason the run counts.
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import tokenize
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Protocol

from flywheel.errors import InvalidInput

MAX_FILE_BYTES = 1 << 20
GIT_TIMEOUT_S = 300
# Never anyone's source: VCS data, environments, caches, build output, vendored packages.
SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", ".env", "node_modules",
        "build", "dist", "site-packages", "__pycache__", ".eggs", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", "vendor", "_vendor",
    }
)  # fmt: skip
TEST_DIRS = frozenset({"tests", "test", "testing"})
# Files and directories that are tooling or documentation, not the project's own code.
NOT_SOURCE_FILES = frozenset({"setup.py", "conftest.py", "noxfile.py", "fabfile.py"})
NOT_SOURCE_DIRS = frozenset({"docs", "doc", "examples", "benchmarks", "bench", "scripts"})


class Skipped(Exception):
    """A file that is not read: `reason` is a short slug (`too_large`, `binary_file`...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class PythonFile:
    """A parsed Python file: its text (decoded as its coding cookie says) and syntax tree."""

    path: str  # posix, relative to the snapshot's root
    text: str
    tree: ast.Module

    @cached_property
    def lines(self) -> list[str]:
        """Lines as the parser counts them (not `splitlines`, which also breaks at form feeds)."""
        return self.text.split("\n")


class Snapshot(Protocol):
    """A tree of files at one moment: the working tree, or a commit."""

    def python_paths(self) -> list[str]:
        """Every `.py` file outside skipped directories, sorted (posix, relative)."""
        ...

    def size(self, path: str) -> int: ...

    def read_bytes(self, path: str) -> bytes: ...


class DirectorySnapshot:
    """A directory as it is on disk (a git working tree, an extracted sdist...)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def python_paths(self) -> list[str]:
        found: list[str] = []
        for directory, subdirs, names in os.walk(self.root):
            subdirs[:] = [name for name in subdirs if not is_skipped_dir(name)]
            relative = PurePosixPath(Path(directory).relative_to(self.root).as_posix())
            found += [
                str(relative / name)
                for name in names
                if name.endswith(".py") and _is_plain_file(os.path.join(directory, name))
            ]
        return sorted(path.removeprefix("./") for path in found)

    def size(self, path: str) -> int:
        return (self.root / path).stat().st_size

    def read_bytes(self, path: str) -> bytes:
        return (self.root / path).read_bytes()


class CommitSnapshot:
    """The files of one commit, read from the object store (the working tree is not used)."""

    def __init__(self, git_dir: Path, commit: str) -> None:
        self.git_dir = git_dir
        self.commit = commit
        self._blobs: dict[str, tuple[str, int]] | None = None

    def _index(self) -> dict[str, tuple[str, int]]:
        if self._blobs is None:
            listing = run_git(self.git_dir, "ls-tree", "-r", "-l", "-z", "--full-tree", self.commit)
            self._blobs = {}
            for entry in listing.split("\0"):
                meta, _, path = entry.partition("\t")
                fields = meta.split()
                if len(fields) == 4 and fields[1] == "blob" and is_walked(path):
                    self._blobs[path] = (fields[2], int(fields[3]))
        return self._blobs

    def python_paths(self) -> list[str]:
        return sorted(self._index())

    def size(self, path: str) -> int:
        return self._index()[path][1]

    def read_bytes(self, path: str) -> bytes:
        blob = self._index()[path][0]
        return run_git_bytes(self.git_dir, "cat-file", "blob", blob)


def _is_plain_file(path: str) -> bool:
    """A regular file, not a link: a link could point anywhere on the machine."""
    return os.path.isfile(path) and not os.path.islink(path)


def is_skipped_dir(name: str) -> bool:
    return name in SKIPPED_DIRS or name.startswith(".") or name.endswith(".egg-info")


def is_walked(path: str) -> bool:
    """A `.py` file outside every skipped directory."""
    *dirs, name = PurePosixPath(path).parts
    return name.endswith(".py") and not any(is_skipped_dir(part) for part in dirs)


def is_test_side(path: str) -> bool:
    """Tests and what only tests use: test files, and anything under a tests directory."""
    *dirs, name = PurePosixPath(path).parts
    return is_test_file(path) or name == "conftest.py" or any(part in TEST_DIRS for part in dirs)


def is_test_file(path: str) -> bool:
    """A file pytest would collect tests from."""
    name = PurePosixPath(path).name
    return name.startswith("test_") or name.endswith("_test.py") or name == "tests.py"


def is_source(path: str) -> bool:
    """The project's own code: not tests, tooling or documentation."""
    *dirs, name = PurePosixPath(path).parts
    if is_test_side(path) or name in NOT_SOURCE_FILES:
        return False
    return not any(part in NOT_SOURCE_DIRS for part in dirs)


def read_python(snapshot: Snapshot, path: str) -> PythonFile:
    """Read and parse one file, or raise Skipped saying why not."""
    try:
        size = snapshot.size(path)
        if size > MAX_FILE_BYTES:
            raise Skipped("too_large", f"{path} is {size} bytes (the limit is {MAX_FILE_BYTES})")
        data = snapshot.read_bytes(path)
    except OSError as error:
        raise Skipped("unreadable", f"{path}: {error.strerror or error}") from error
    if b"\0" in data[:8192]:
        raise Skipped("binary_file", f"{path} holds NUL bytes")
    text = decode_source(path, data)
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise Skipped("syntax_error", f"{path} does not parse as Python 3: {error}") from error
    return PythonFile(path, text, tree)


def decode_source(path: str, data: bytes) -> str:
    """Decode as Python itself would: a BOM or a PEP 263 cookie, else UTF-8; line ends
    become `\n`, as the parser reads them."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding).removeprefix("\ufeff")
        return text.replace("\r\n", "\n").replace("\r", "\n")
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        raise Skipped("undecodable", f"{path}: {error}") from error


def module_names(paths: list[str]) -> dict[str, str]:
    """Dotted module name of each file, as importing it from its package root would give.

    The root of a file is the nearest directory above it that is not a package (has no
    `__init__.py`), so flat layouts, `src/` layouts and nested packages all come out right.
    """
    present = set(paths)
    names: dict[str, str] = {}
    for path in paths:
        parts = list(PurePosixPath(path).parts)
        module = [parts[-1].removesuffix(".py")]
        parents = parts[:-1]
        while parents and "/".join([*parents, "__init__.py"]) in present:
            module.insert(0, parents.pop())
        if module[-1] == "__init__" and len(module) > 1:
            module.pop()
        if all(part.isidentifier() for part in module):
            names[path] = ".".join(module)
    return names


def run_git(repo: Path, *args: str) -> str:
    return run_git_bytes(repo, *args).decode("utf-8", errors="replace")


def run_git_bytes(repo: Path, *args: str) -> bytes:
    """Run git in `repo`; a failure is InvalidInput carrying git's own last line."""
    command = ["git", "-c", f"safe.directory={repo}", "-C", str(repo), *args]
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=GIT_TIMEOUT_S, env=git_env(), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InvalidInput(f"git {args[0]} failed: {error}") from error
    if done.returncode != 0:
        raise InvalidInput(f"git {args[0]} failed in {repo}: {git_error(done.stderr)}")
    return done.stdout


def git_error(stderr: bytes) -> str:
    """git's own one-line reason: its first `fatal:`/`error:` line, else its last line."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    reasons = [line for line in lines if line.startswith(("fatal:", "error:"))]
    return (reasons or lines or ["no message"])[0 if reasons else -1]


def git_env() -> dict[str, str]:
    """Never prompt for credentials; never let the user's pager or editor in."""
    return {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "true",
        "GIT_PAGER": "cat",
        "LC_ALL": "C",
    }
