"""The CLI's quiet mode, in process: what it changes, that a nested command adds nothing,
and that everything is put back (the demo and the tests run many commands in one process)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from flywheel import observability
from flywheel.cli import console


def test_quiet_mode_is_put_back_and_never_doubled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user's choice is kept
    handlers = list(logging.getLogger().handlers)

    undo = console.quiet_third_parties()
    nested_undo = console.quiet_third_parties()  # a command the first one runs
    added = [h for h in logging.getLogger().handlers if h not in handlers]
    assert len(added) == 1
    assert os.environ["TQDM_DISABLE"] == "1"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
    observability.subprocess_output().write("a trainer's bar\n")
    logging.getLogger("peft").warning("a library's warning")
    nested_undo()
    assert console._stack  # the outer command is still quiet
    undo()

    assert logging.getLogger().handlers == handlers
    assert "TQDM_DISABLE" not in os.environ
    assert observability.subprocess_output() is sys.stderr
    log = (tmp_path / console.LOG_FILE_NAME).read_text(encoding="utf-8")
    assert log.count("a trainer's bar") == 1
    assert log.count("WARNING peft: a library's warning") == 1


def test_a_command_that_logs_nothing_creates_no_log_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))

    console.quiet_third_parties()()

    assert not (tmp_path / "home").exists()
