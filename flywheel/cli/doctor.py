"""`flywheel doctor`: what this host has of what Flywheel needs, and the fix for what it lacks.

The sandbox's parts (bwrap, setpriv, the system python3 and its libseccomp binding, user
namespaces, then a trial sandbox) and the training libraries. `flywheel demo` runs the same
check (`preflight`) before any work, so a missing part costs one line, not a run that dies
at its first sandbox.

It loads the sandbox package (a tenth of the start-up) inside the functions, not at import:
every command imports this module.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
from typing import TYPE_CHECKING, Any

import typer

from flywheel.cli.common import JsonOption, emit
from flywheel.errors import InvalidState, SandboxUnavailable

if TYPE_CHECKING:
    from flywheel.sandbox.requirements import Requirement, Tool

TRAINING_LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate")
TRAIN_FIX = "pip install torch==2.13.0 && pip install 'flywheel[train]' (the CPU torch first)"


def gather() -> list[Requirement]:
    """Every requirement, in the order they matter."""
    from flywheel.sandbox import process
    from flywheel.sandbox.requirements import Requirement

    sandbox = _sandbox()
    if os.environ.get(process.UNSAFE_ENV) == process.UNSAFE_VALUE:  # the sandbox is off
        sandbox = [dataclasses.replace(item, is_required=False) for item in sandbox]
        sandbox.append(
            Requirement(
                "sandbox override",
                True,
                f"{process.UNSAFE_ENV}={process.UNSAFE_VALUE}: model-written code runs "
                "UNSANDBOXED (development only)",
                f"unset {process.UNSAFE_ENV}",
                is_required=False,
            )
        )
    git = shutil.which("git")
    optional_git = Requirement(
        "git",
        git is not None,
        git or "git is not installed (`ingest repo --history` and git URLs need it)",
        "apt-get install git",
        is_required=False,
    )
    return [*sandbox, *_training(), optional_git]


def _sandbox() -> list[Requirement]:
    """The four tools, user namespaces and a trial sandbox (six rows)."""
    from flywheel.sandbox import check_available, process, requirements
    from flywheel.sandbox.requirements import Requirement

    tools = requirements.check_tools(process.seccomp_module())
    if any(not tool.is_present for tool in tools):
        missing = ", ".join(tool.name for tool in tools if not tool.is_present)
        trial = Requirement(
            "trial sandbox", False, f"not tried: {missing} missing", is_required=False
        )
        return [*tools, requirements.check_user_namespaces(), trial]
    try:
        check_available()
    except SandboxUnavailable as error:
        trial = Requirement("trial sandbox", False, error.message.split(" (fix: ")[0],
                            _fix_of(error.message))  # fmt: skip
        return [*tools, requirements.check_user_namespaces(), trial]
    namespaces = Requirement("user namespaces", True, "the trial sandbox got its own")
    return [*tools, namespaces, Requirement("trial sandbox", True, "started and exited cleanly")]


def _fix_of(message: str) -> str:
    return message.split(" (fix: ", 1)[1].rstrip(")") if " (fix: " in message else ""


def _training() -> list[Requirement]:
    from flywheel.sandbox.requirements import Requirement

    missing = [name for name in TRAINING_LIBRARIES if importlib.util.find_spec(name) is None]
    if missing:
        detail = f"not installed: {', '.join(missing)} (train, eval, cycle and demo need them)"
        return [Requirement("training libraries", False, detail, TRAIN_FIX)]
    return [Requirement("training libraries", True, ", ".join(TRAINING_LIBRARIES))]


def preflight(purpose: str, *, needs_git: bool = False) -> None:
    """Refuse, in one line naming each missing requirement and its fix, before any work
    (`needs_git`: git too, optional elsewhere)."""
    found = gather()
    if needs_git:
        found = [dataclasses.replace(item, is_required=item.name == "git" or item.is_required)
                 for item in found]  # fmt: skip
    missing = [item for item in found if item.is_missing]
    if missing:
        problems = "; ".join(f"{item.detail} (fix: {item.fix})" for item in missing)
        raise InvalidState(
            f"{purpose} cannot run here: {problems}; `flywheel doctor` lists every requirement"
        )


def doctor(as_json: bool = JsonOption) -> None:
    """Check what Flywheel needs from this host: the sandbox's parts (and which bwrap it
    uses), the training libraries; exit 1 when a required one is missing."""
    from flywheel.sandbox import requirements

    found = gather()
    found.append(_memory_budget())
    bwrap = requirements.find_bwrap()
    missing = [item.name for item in found if item.is_missing]
    data: dict[str, Any] = {
        "ok": not missing,
        "missing": missing,
        "bwrap": dataclasses.asdict(bwrap) if bwrap is not None else None,
        "requirements": [item.as_dict() for item in found],
    }
    emit(data, as_json=as_json, text=_text(found, bwrap, missing))
    if missing:
        raise typer.Exit(1)


def _memory_budget() -> Requirement:
    """How a sandbox's memory is held (informational: the fallback is safe, only coarser)."""
    from flywheel.sandbox import budget
    from flywheel.sandbox.requirements import Requirement

    try:
        return Requirement("memory budget", True, budget.describe(), is_required=False)
    finally:
        budget.remove_parents()  # the cgroup directories describing it made


def _text(found: list[Requirement], bwrap: Tool | None, missing: list[str]) -> str:
    lines = []
    for item in found:
        mark = "ok" if item.is_present else ("MISSING" if item.is_required else "absent")
        fix = f"  -> {item.fix}" if item.fix and not item.is_present else ""
        lines.append(f"{mark:8} {item.name:19} {item.detail}{fix}")
    lines.append(f"bwrap used: {f'{bwrap.path} ({bwrap.source})' if bwrap else 'none'}")
    lines.append(f"missing: {', '.join(missing)}" if missing else "everything required is present")
    return "\n".join(lines)
