"""`flywheel sandbox run`: one verdict for a solution file against a tests file."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import typer

from flywheel.cli.common import JsonOption, emit
from flywheel.errors import InvalidInput

sandbox = typer.Typer(help="Run code in the sandbox.", no_args_is_help=True)

FAILED_EXIT_CODE = 3
# `flywheel.sandbox.Limits`' defaults (a test holds them equal), written out: importing the
# sandbox package costs every command a tenth of a second at start-up.
WALL_S = 10.0
MEMORY_MB = 512


@sandbox.command("run")
def run(
    solution: Path = typer.Option(..., "--solution", help="Python file with the candidate."),
    tests: Path = typer.Option(
        ..., "--tests", help="Python file with test_* functions and/or check(candidate)."
    ),
    entry_point: str | None = typer.Option(
        None, "--entry-point", help="The function the tests call (default: the only one)."
    ),
    wall_s: float = typer.Option(WALL_S, help="Wall clock for the whole run."),
    memory_mb: int = typer.Option(MEMORY_MB, help="Address space per process."),
    as_json: bool = JsonOption,
) -> None:
    """Run the tests against the solution, sandboxed; print the verdict.

    Exits 0 when every test passed, 3 when the run finished without passing.
    """
    from flywheel.sandbox import Limits, run_tests

    solution_text, tests_text = _read(solution), _read(tests)
    name = entry_point or _only_function(solution_text, solution)
    verdict = run_tests(
        solution_text,
        tests_text,
        entry_point=name,
        limits=Limits(wall_s=wall_s, memory_mb=memory_mb),
    )
    lines = [f"{'PASSED' if verdict.is_passed else 'NOT PASSED'} ({verdict.reason})"]
    lines += [f"  {test.status:<6} {test.name} {test.message}".rstrip() for test in verdict.tests]
    lines.append(f"  {verdict.duration_s:.3f} s, peak {verdict.peak_memory_mb:.0f} MiB")
    emit(dataclasses.asdict(verdict), as_json=as_json, text="\n".join(lines))
    if not verdict.is_passed:
        raise typer.Exit(FAILED_EXIT_CODE)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidInput(f"cannot read {path}: {error}") from error


def _only_function(source: str, path: Path) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise InvalidInput(f"{path} is not valid Python: {error}; give --entry-point") from error
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    if len(names) != 1:
        raise InvalidInput(f"{path} defines {len(names)} functions; give --entry-point")
    return names[0]
