"""What a person sees: results on stdout, progress on stderr, and the third-party noise
(warnings, library logs, progress bars, a trainer's chatter) in the workspace's log file,
`<workspace>/flywheel.log`, unless `flywheel --verbose`.

Imported by every command module, so it imports nothing heavy: rich and the settings load
when a bar is drawn or the first record is logged.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from flywheel import observability

if TYPE_CHECKING:
    from rich.console import Console

LOG_FILE_NAME = "flywheel.log"
VERBOSE_VARIABLE = "FLYWHEEL_VERBOSE"  # what `flywheel --verbose` sets

# Read by tqdm, huggingface_hub, datasets, transformers and MLflow when they load (here, or in
# a subprocess such as the trainer or the evaluator, which inherits the environment); a value
# the user set is kept. MLflow then logs through the root logger (so into the log file) and
# downloads artifacts without a bar.
QUIET_ENVIRONMENT = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_CONFIGURE_LOGGING": "false",
}


def log_path() -> Path:
    """The workspace's log file (the workspace is FLYWHEEL_HOME, default `.flywheel/`)."""
    try:
        from flywheel.settings import Settings

        home = Settings().home
    except ValueError:  # a bad FLYWHEEL_* value: the command itself reports it
        home = Path(os.environ.get("FLYWHEEL_HOME") or ".flywheel")
    return home / LOG_FILE_NAME


class WorkspaceLog(logging.Handler):
    """Appends records to the workspace's log file, opened on the first record (a command
    that logs nothing creates nothing); `stream()` is the same file for raw text."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._file: IO[str] | None = None
        self._opening = threading.Lock()

    def stream(self) -> IO[str]:
        with self._opening:
            if self._file is None:
                path = log_path()
                path.parent.mkdir(parents=True, exist_ok=True)
                self._file = path.open("a", encoding="utf-8")
            return self._file

    def emit(self, record: logging.LogRecord) -> None:
        try:
            target = self.stream()
            target.write(self.format(record) + "\n")
            target.flush()
        except (OSError, ValueError):
            self.handleError(record)

    def close(self) -> None:
        with self._opening:
            if self._file is not None:
                self._file.close()
                self._file = None
        super().close()


@dataclass
class _Quiet:
    """What `quiet_third_parties` changed, to put back."""

    handler: WorkspaceLog
    environment: dict[str, str | None] = field(default_factory=dict)


_stack: list[_Quiet] = []


def quiet_third_parties() -> Callable[[], None]:
    """Send warnings, library log records and progress bars to the log file; returns what
    undoes it (in-process callers, such as the demo and the tests, run many commands). A
    command run by another (the demo's steps) finds it done: nothing is logged twice."""
    if _stack:
        return lambda: None
    quiet = _Quiet(WorkspaceLog())
    for name, value in QUIET_ENVIRONMENT.items():
        quiet.environment[name] = os.environ.get(name)
        os.environ.setdefault(name, value)
    logging.captureWarnings(False)  # forget a previous capture's saved hook (pytest swaps it)
    logging.captureWarnings(True)
    logging.getLogger().addHandler(quiet.handler)
    _stack.append(quiet)
    restore_output = observability.send_subprocess_output(quiet.handler.stream)
    _quiet_loaded_libraries()

    def undo() -> None:
        _stack.remove(quiet)
        restore_output()
        logging.getLogger().removeHandler(quiet.handler)
        quiet.handler.close()
        logging.captureWarnings(False)
        for name, value in quiet.environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return undo


def stay_verbose() -> Callable[[], None]:
    """--verbose: also for the commands this one runs in-process (the demo's steps), which
    read FLYWHEEL_VERBOSE; returns what undoes it."""
    before = os.environ.get(VERBOSE_VARIABLE)
    os.environ[VERBOSE_VARIABLE] = "1"

    def undo() -> None:
        if before is None:
            os.environ.pop(VERBOSE_VARIABLE, None)
        else:
            os.environ[VERBOSE_VARIABLE] = before

    return undo


def _quiet_loaded_libraries() -> None:
    """Libraries already imported in this process read the environment too late: turn their
    bars off and let their loggers reach the log file instead of their own stderr handler."""
    if "transformers" in sys.modules:  # by name: flywheel itself never imports it
        transformers_logging = importlib.import_module("transformers.utils.logging")
        transformers_logging.disable_progress_bar()
        transformers_logging.disable_default_handler()
        transformers_logging.enable_propagation()
    if "datasets" in sys.modules:
        importlib.import_module("datasets").disable_progress_bars()


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def progress_bar(
    label: str, *, is_quiet: bool, total: int | None = None
) -> Iterator[Callable[[int], None]]:
    """A bar on stderr, advanced by the count handled; none with --json or off a terminal."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = stderr_console()
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
    columns += [MofNCompleteColumn(), TimeElapsedColumn()]
    disable = is_quiet or not console.is_terminal
    with Progress(*columns, console=console, disable=disable, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda count: bar.advance(task, count)


@contextmanager
def step(label: str, *, is_quiet: bool) -> Iterator[None]:
    """A spinner with the time elapsed on stderr while one long step runs (same rules)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = stderr_console()
    columns = [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
    disable = is_quiet or not console.is_terminal
    with Progress(*columns, console=console, disable=disable, transient=True) as spinner:
        spinner.add_task(label, total=None)
        yield
