"""`flywheel ingest ...` and `flywheel compile`, plugged into the flywheel CLI by entry point."""

from __future__ import annotations

import typer

ingest = typer.Typer(
    help="Read tickets, repositories, feedback and task files into signal.", no_args_is_help=True
)


def compile_feedback() -> None:
    """Compile raw feedback events into preference pairs, SFT examples and labels."""
    raise typer.Exit(1)
