"""Where a repository comes from: a local directory, an sdist archive, or a git URL.

A URL is cloned (shallow: as deep as the history asked for) and an archive extracted into a
private temporary directory that `Checkout.close` removes — and, should a caller forget,
the garbage collector. Archives are extracted by hand, regular files and directories only,
so a crafted tarball cannot write outside its directory or plant links.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
import weakref
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from flywheel.errors import InvalidInput
from ingest.repo.files import GIT_TIMEOUT_S, git_env, git_error, run_git

URL = re.compile(r"^([a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)
USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
MAX_ARCHIVE_BYTES = 512 << 20  # all of an archive's files together, extracted


@dataclass
class Checkout:
    """A repository on disk: its files, and its git data when it has any."""

    root: Path
    name: str
    is_git: bool
    _finalizer: weakref.finalize[..., Checkout] | None = field(default=None, repr=False)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def own(self, directory: Path) -> Checkout:
        """Remove `directory` when this checkout is closed or collected."""
        self._finalizer = weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        return self


def open_source(source: str, history: int) -> Checkout:
    """Validate `source` and make it readable; InvalidInput with a one-line reason if not."""
    if URL.match(source):
        return _clone(source, history)
    path = Path(source).expanduser()
    if not path.exists():
        raise InvalidInput(f"{source}: no such directory or repository")
    if path.is_file() and source.endswith(ARCHIVE_SUFFIXES):
        checkout = _extract(path)
    elif path.is_dir():
        checkout = Checkout(path.resolve(), path.resolve().name, (path / ".git").exists())
    else:
        raise InvalidInput(
            f"{source} is a file, not a repository (a directory, a git URL or an sdist)"
        )
    if history and not checkout.is_git:
        checkout.close()
        raise InvalidInput(f"{source} is not a git repository: --history needs one")
    return checkout


def public_url(source: str) -> str:
    """`source` without any credentials in it (`https://user:token@host/...`)."""
    return USERINFO.sub(r"\1", source)


def head_commit(checkout: Checkout) -> str | None:
    """HEAD's commit id; None for a plain directory or a repository with no commits yet."""
    if not checkout.is_git:
        return None
    try:
        return run_git(checkout.root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").strip()
    except InvalidInput:
        return None


def _temporary() -> Path:
    return Path(tempfile.mkdtemp(prefix="flywheel-repo-"))


def _clone(url: str, history: int) -> Checkout:
    directory = _temporary()
    target = directory / "repo"
    command = ["git", "clone", "--quiet", "--no-tags", "--single-branch"]
    command += ["--depth", str(history + 1), "--", url, str(target)]
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=GIT_TIMEOUT_S, env=git_env(), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        shutil.rmtree(directory, ignore_errors=True)
        raise InvalidInput(f"cannot clone {public_url(url)}: {error}") from error
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        reason = git_error(done.stderr).replace(url, public_url(url))
        raise InvalidInput(f"cannot clone {public_url(url)}: {reason}")
    name = PurePosixPath(url.rstrip("/").split(":")[-1]).name.removesuffix(".git") or "repository"
    return Checkout(target, name, is_git=True).own(directory)


def _extract(archive: Path) -> Checkout:
    """Unpack an sdist; its single top-level directory, if it has one, is the repository."""
    directory = _temporary()
    try:
        total = 0
        for name, stream in _archive_files(archive):
            total += _write(directory, name, stream, MAX_ARCHIVE_BYTES - total)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as error:
        shutil.rmtree(directory, ignore_errors=True)
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        raise InvalidInput(f"{archive}: not a readable archive ({reason})") from error
    except InvalidInput:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    entries = list(directory.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else directory
    name = root.name if root != directory else archive.name.split(".tar")[0].removesuffix(".zip")
    return Checkout(root, name, is_git=False).own(directory)


def _archive_files(archive: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """(name, stream) of each regular file; links, devices and directories are left out."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                if not info.is_dir():
                    with zipped.open(info) as stream:
                        yield info.filename, stream
        return
    with tarfile.open(archive) as tarred:
        for member in tarred:
            contents = tarred.extractfile(member) if member.isfile() else None
            if contents is not None:
                with contents:
                    yield member.name, contents


def _write(directory: Path, name: str, stream: IO[bytes], budget: int) -> int:
    """Copy one file under `directory`; its size. Unsafe names are refused."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or parts[0] == "/" or ".." in parts or ":" in parts[0]:
        raise InvalidInput(f"archive member {name!r} would land outside its directory")
    target = directory.joinpath(*parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        copied = 0
        while chunk := stream.read(1 << 20):
            copied += len(chunk)
            if copied > budget:
                raise InvalidInput(f"archive unpacks to more than {MAX_ARCHIVE_BYTES} bytes")
            out.write(chunk)
    return copied
