"""Benchmark: how long `flywheel` commands take to start, against the interpreter's floor.

Side by side, interleaved round by round (so a load change on a shared machine touches every
command alike), it times the wall clock of:

  floor           python -c pass
  typer           python -c "import typer"
  import cli      python -c "import flywheel.cli"
  --help          flywheel --help
  tenants --help  flywheel tenants create --help
  domains create  flywheel domains create NAME --tenant T   (scratch embedded workspace)
  keys create     flywheel keys create --tenant T --scopes data:read

and prints each median with its ratio to the floor and to `import typer` (what any Typer CLI
pays), and the median CPU time (user + system, which a loaded machine inflates less than the
wall clock). The goal: `flywheel --help` and the light commands under 0.5 s. Asserts nothing:
machines here are shared and noisy.

    python -m bench.cli_startup [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLYWHEEL = [sys.executable, "-m", "flywheel"]


def commands(tenant: str) -> dict[str, list[str] | None]:
    """Label -> command line; None for a command whose argument changes every round."""
    return {
        "floor": [sys.executable, "-c", "pass"],
        "typer": [sys.executable, "-c", "import typer"],
        "import cli": [sys.executable, "-c", "import flywheel.cli"],
        "--help": [*FLYWHEEL, "--help"],
        "tenants --help": [*FLYWHEEL, "tenants", "create", "--help"],
        "domains create": None,
        "keys create": [*FLYWHEEL, "keys", "create", "--tenant", tenant, "-s", "data:read"],
    }


def timed(command: list[str], workspace: Path) -> tuple[float, float]:
    """The command's wall clock and CPU time (user + system), in seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, cwd=workspace, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rounds: int, workspace: Path) -> dict[str, list[tuple[float, float]]]:
    subprocess.run([*FLYWHEEL, "init"], cwd=workspace, check=True, capture_output=True)
    subprocess.run(
        [*FLYWHEEL, "tenants", "create", "bench"], cwd=workspace, check=True, capture_output=True
    )
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.pop("FLYWHEEL_DATABASE_URL", None)  # the embedded default, in the scratch dir
        os.environ.pop("FLYWHEEL_HOME", None)
        times = measure(args.rounds, Path(scratch))
    floor = statistics.median(wall for wall, _ in times["floor"])
    typer = statistics.median(wall for wall, _ in times["typer"])
    print(f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print(f"{'command':<16} {'wall s':>7} {'x floor':>8} {'x typer':>8} {'cpu s':>7}")
    for label, runs in times.items():
        median = statistics.median(wall for wall, _ in runs)
        cpu = statistics.median(cpu for _, cpu in runs)
        line = f"{label:<16} {median:>7.3f} {median / floor:>8.1f} {median / typer:>8.1f}"
        print(f"{line} {cpu:>7.3f}")


if __name__ == "__main__":
    main()
