"""Benchmark: how long `flywheel` commands take to start, against the interpreter's floor.

Side by side, interleaved round by round (so a load change on a shared machine touches every
command alike), it times the wall clock of:

  floor           python -c pass
  typer           python -c "import typer"
  import cli      python -c "import flywheel.cli"
  libraries       python -c "import typer._adapters, pydantic_settings, sqlalchemy.orm, ..."
                  (what a light command cannot skip: typer checks parameters with pydantic,
                  the settings are pydantic-settings, the database SQLAlchemy's ORM)
  --help          flywheel --help
  tenants --help  flywheel tenants create --help
  domains create  flywheel domains create NAME --tenant T   (scratch embedded workspace)
  keys create     flywheel keys create --tenant T --scopes data:read
  tenants list    flywheel tenants list
  domains list    flywheel domains list --tenant T
  keys list       flywheel keys list --tenant T
  dataset list    flywheel dataset list --domain D
  models list     flywheel models list --domain D
  runs list       flywheel runs list
  suites list     flywheel suites list

and prints each median with its ratio to the floor, to `import typer` (what any Typer CLI
pays) and to the libraries (what any light command pays), and the median CPU time (user +
system, which a loaded machine inflates less than the wall clock). The goal: `flywheel
--help` and the light commands under 0.5 s. Asserts nothing: machines here are shared and noisy.

    python -m bench.cli_startup [--rounds 5]
    python -m bench.cli_startup --instructions   # counts under valgrind: minutes, load-proof
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLYWHEEL = [sys.executable, "-m", "flywheel"]
LIBRARIES = "import typer._adapters, pydantic_settings, sqlalchemy.orm, sqlalchemy.dialects.sqlite"
DOMAIN = "listed"  # created before the rounds, for the commands that list a domain's things


def commands(tenant: str) -> dict[str, list[str] | None]:
    """Label -> command line; None for a command whose argument changes every round."""
    return {
        "floor": [sys.executable, "-c", "pass"],
        "typer": [sys.executable, "-c", "import typer"],
        "import cli": [sys.executable, "-c", "import flywheel.cli"],
        "libraries": [sys.executable, "-c", LIBRARIES],
        "--help": [*FLYWHEEL, "--help"],
        "tenants --help": [*FLYWHEEL, "tenants", "create", "--help"],
        "domains create": None,
        "keys create": [*FLYWHEEL, "keys", "create", "--tenant", tenant, "-s", "data:read"],
        "tenants list": [*FLYWHEEL, "tenants", "list"],
        "domains list": [*FLYWHEEL, "domains", "list", "--tenant", tenant],
        "keys list": [*FLYWHEEL, "keys", "list", "--tenant", tenant],
        "dataset list": [*FLYWHEEL, "dataset", "list", "--domain", DOMAIN],
        "models list": [*FLYWHEEL, "models", "list", "--domain", DOMAIN],
        "runs list": [*FLYWHEEL, "runs", "list"],
        "suites list": [*FLYWHEEL, "suites", "list"],
    }


def timed(command: list[str], workspace: Path) -> tuple[float, float]:
    """The command's wall clock and CPU time (user + system), in seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, cwd=workspace, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def instructions(command: list[str], workspace: Path) -> int:
    """The instructions the command executes (valgrind's callgrind counts them): nearly the
    same on an idle and on a loaded machine, where the clock is not."""
    valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    done = subprocess.run(
        [*valgrind, *command], cwd=workspace, check=True, capture_output=True, text=True
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {done.stderr[-300:]}")
    return int(found.group(1))


def prepare(workspace: Path) -> None:
    subprocess.run([*FLYWHEEL, "init"], cwd=workspace, check=True, capture_output=True)
    subprocess.run(
        [*FLYWHEEL, "tenants", "create", "bench"], cwd=workspace, check=True, capture_output=True
    )
    subprocess.run(
        [*FLYWHEEL, "domains", "create", DOMAIN, "--tenant", "bench"],
        cwd=workspace,
        check=True,
        capture_output=True,
    )


def measure(rounds: int, workspace: Path) -> dict[str, list[tuple[float, float]]]:
    prepare(workspace)
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in commands("bench")}
    for number in range(rounds):
        for label, command in commands("bench").items():
            if command is None:  # a new domain each round
                command = [*FLYWHEEL, "domains", "create", f"d{number}", "--tenant", "bench"]
            times[label].append(timed(command, workspace))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_startup")
    parser.add_argument("--rounds", type=int, default=5, help="Runs of each (the median).")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="Count each command's instructions once under valgrind instead of timing it.",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.pop("FLYWHEEL_DATABASE_URL", None)  # the embedded default, in the scratch dir
        os.environ.pop("FLYWHEEL_HOME", None)
        if args.instructions:
            print_instructions(Path(scratch))
            return
        times = measure(args.rounds, Path(scratch))
    floor = statistics.median(wall for wall, _ in times["floor"])
    typer = statistics.median(wall for wall, _ in times["typer"])
    libraries = statistics.median(wall for wall, _ in times["libraries"])
    print(f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print(f"{'command':<16} {'wall s':>7} {'x floor':>8} {'x typer':>8} {'x libs':>7} {'cpu s':>7}")
    for label, runs in times.items():
        median = statistics.median(wall for wall, _ in runs)
        cpu = statistics.median(cpu for _, cpu in runs)
        line = f"{label:<16} {median:>7.3f} {median / floor:>8.1f} {median / typer:>8.1f}"
        print(f"{line} {median / libraries:>7.2f} {cpu:>7.3f}")


def print_instructions(workspace: Path) -> None:
    prepare(workspace)
    counts: dict[str, int] = {}
    for label, command in commands("bench").items():
        command = command or [*FLYWHEEL, "domains", "create", "counted", "--tenant", "bench"]
        counts[label] = instructions(command, workspace)
    print(f"{'command':<16} {'M instr':>8} {'x floor':>8} {'x libs':>7}")
    for label, count in counts.items():
        ratios = f"{count / counts['floor']:>8.1f} {count / counts['libraries']:>7.2f}"
        print(f"{label:<16} {count / 1e6:>8.0f} {ratios}")


if __name__ == "__main__":
    main()
