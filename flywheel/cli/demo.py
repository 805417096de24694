"""`flywheel demo`, registered without importing it: the demo's runner loads the gateway's
HTTP client, YAML and the sandbox checks (a tenth of a second), which every other command
would pay at start-up; it is imported when the command runs
(`flywheel.demo.runner.demo_command`)."""

from __future__ import annotations

from pathlib import Path

import typer

from flywheel.cli.common import JsonOption


def demo(
    directory: Path = typer.Option(
        Path("flywheel-demo"), "--dir", help="Where to run it (created; must be new)."
    ),
    quick: bool = typer.Option(False, "--quick", help="The short CI smoke run (< 3 minutes)."),
    as_json: bool = JsonOption,
) -> None:
    """Run the whole flywheel on bundled sample data: ingest, a tiny base model, a cycle, live
    traffic through the gateway, more feedback, a second cycle, live traffic; then a summary
    table and an HTML report."""
    from flywheel.demo.runner import demo_command

    demo_command(directory=directory, quick=quick, as_json=as_json)
