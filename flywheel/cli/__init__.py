"""The `flywheel` command line. Bad input (a wrong option or file, a name that does not
exist) exits with status 2 and one line on stderr; other failures (a conflict, a refused
state, an unreachable database) with status 1.

Start-up stays light (`flywheel --help` and a command that lists or creates a few rows in
under half a second): a command's module is imported when that command runs (`BUILT_IN`,
`flywheel.cli.lazy`); the command modules import only typer and the standard library at the
top, and load the database, the services and rich inside the commands that use them, which
map the models of the tables they touch only (`bench/cli_startup.py` measures it).
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

import typer
from typer._click.exceptions import NoArgsIsHelpError  # typer vendors click; not re-exported

from flywheel.cli.console import VERBOSE_VARIABLE, quiet_third_parties, stay_verbose
from flywheel.cli.lazy import Lazy, LazyGroup
from flywheel.errors import FlywheelError, InvalidInput, NotFound

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints

BAD_INPUT_EXIT = 2  # as for a usage error: the README's "one line, exit status 2"

# The built-in commands, in the order the overview lists them: name -> where it lives.
BUILT_IN = {
    "init": Lazy("server", "init"),
    "serve": Lazy("server", "serve"),
    "gateway": Lazy("gateway", "gateway"),
    "verify": Lazy("verify", "verify"),
    "redact": Lazy("redact", "redact"),
    "compile": Lazy("signals", "compile_command"),
    "forget": Lazy("signals", "forget_command"),
    "train": Lazy("train", "train"),
    "eval": Lazy("evaluate", "evaluate"),
    "cycle": Lazy("cycle", "cycle"),
    "report": Lazy("report", "report"),
    "worker": Lazy("worker", "worker"),
    "demo": Lazy("demo", "demo"),
    "doctor": Lazy("doctor", "doctor"),
    "db": Lazy("server", "db", is_group=True),
    "tenants": Lazy("admin", "tenants", is_group=True),
    "keys": Lazy("admin", "keys", is_group=True),
    "domains": Lazy("admin", "domains", is_group=True),
    "sandbox": Lazy("sandbox", "sandbox", is_group=True),
    "dataset": Lazy("dataset", "dataset", is_group=True),
    "models": Lazy("models", "models", is_group=True),
    "runs": Lazy("runs", "runs", is_group=True),
    "suites": Lazy("suites", "suites", is_group=True),
}


class FlywheelGroup(LazyGroup):
    """The `flywheel` group: a command's module loads when the command is asked for."""

    lazy = BUILT_IN


app = typer.Typer(
    cls=FlywheelGroup,
    help="Flywheel: turn your LLM apps' usage into better models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def options(
    context: typer.Context,
    is_verbose: bool = typer.Option(
        False,
        "--verbose",
        envvar=VERBOSE_VARIABLE,
        help="Show third-party warnings, library logs and progress bars (a trainer's too) "
        "here; by default they go to <workspace>/flywheel.log.",
    ),
) -> None:
    """Flywheel: turn your LLM apps' usage into better models."""
    context.call_on_close(stay_verbose() if is_verbose else quiet_third_parties())


def entry_points(*, group: str) -> EntryPoints:
    """The installed entry points of `group` (importlib.metadata loads only when asked: it
    costs a tenth of the start-up)."""
    from importlib.metadata import entry_points as installed

    return installed(group=group)


@functools.cache  # once per process
def _add_plugins() -> None:
    """Commands other packages register under the `flywheel.cli` entry-point group
    (`flywheel ingest` from `ingest/`): a Typer app becomes a command group, a function a
    command. Loaded on the first `main()`, not at import, so a plugin may import
    `flywheel.cli` modules itself. A plugin named like a built-in command is passed over (an
    install from before `compile`, `forget` and `demo` moved into flywheel still lists them);
    one that does not load is a one-line error naming the fix."""
    for plugin in entry_points(group="flywheel.cli"):
        if plugin.name in BUILT_IN:  # an install from before the command moved into flywheel
            continue
        try:
            command = plugin.load()
        except (ImportError, AttributeError) as error:
            raise FlywheelError(
                f"the `flywheel {plugin.name}` plugin ({plugin.value}) does not load ({error}): "
                "reinstall the package (pip install -e .)"
            ) from error
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=plugin.name)
        else:
            app.command(plugin.name)(command)


def _names_a_plugin(args: list[str]) -> bool:
    """Whether the command line may need the plugins: it names no built-in command (the
    overview lists them all), so `flywheel tenants create` never reads the entry points."""
    named = next((arg for arg in args if not arg.startswith("-")), None)
    return named not in BUILT_IN


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; errors become `error: ...` on one line and a non-zero exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if _names_a_plugin(args):
            _add_plugins()
        # Without standalone mode, click returns a typer.Exit's code instead of raising it.
        result = app(args=args, standalone_mode=False)
    except NoArgsIsHelpError as error:
        sys.stdout.write(error.format_message() + "\n")
        return 0
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        _fail("aborted")
        return 130
    except typer.TyperException as error:
        _fail(error.format_message())
        return 2
    except (InvalidInput, NotFound) as error:
        _fail(error.message)
        return BAD_INPUT_EXIT
    except FlywheelError as error:
        _fail(error.message)
        return 1
    except Exception as error:
        unreachable = _database_unreachable(error)
        if unreachable is None:
            raise
        _fail(unreachable)
        return 1
    return result if isinstance(result, int) else 0


def _database_unreachable(error: Exception) -> str | None:
    """The one-line message for a database that cannot be reached, or None for any other
    error (sqlalchemy is only imported here when a command already loaded it)."""
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.exc import OperationalError

    if not isinstance(error, OperationalError):
        return None
    return f"database unreachable: {str(error.orig).strip().splitlines()[0]}"


def _fail(message: str) -> None:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")


if __name__ == "__main__":
    sys.exit(main())
