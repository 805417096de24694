"""Every command the README shows runs, in README order, against a scratch workspace (the
embedded SQLite database and MLflow store under a tmp FLYWHEEL_HOME): the curl walk-through
(init, tenants, domains, keys, a server on a free port, the REST calls), the sandbox, ingest,
datasets, training, evaluation and cycle blocks. A failure names the block and the README line
of the command that failed (see `readme.py`).

Not run here, each for the reason given in EXCLUDED; lines left out of a run block, and the
few textual changes made to one, are in LEFT_OUT and CHANGED with theirs."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.readme import ROOT, Block, readme_blocks, script

pytestmark = pytest.mark.no_database  # its own embedded workspace: once, in the PostgreSQL pass

# Whole blocks not run, by their section heading: why, and what covers them instead.
EXCLUDED = {
    "The two commands": "installs system and Python packages (apt-get, pip) and runs the full "
    "demo (~10 min) and the whole test suite: tests/acceptance/test_demo.py runs `flywheel demo "
    "--quick` as a new user does, test_demo_preflight.py its requirement check, and CI "
    "(`bash .ci/run`) the install and `pytest`",
    "Cycles: the flywheel turning, inline or on workers#2": "workers need a PostgreSQL server "
    "and run until stopped: tests/integration cover workers, trigger and cancel",
    "Production setup": "a PostgreSQL server, an MLflow server and long-running API and worker "
    "processes: tests/integration and tests/api cover them",
    "Suites: several domains, one adapter": "needs two domains with train and eval signal of "
    "their own (the walk-through has one) and trains: tests/finetune/test_suites.py runs "
    "create, train and show through the CLI on two domains",
}

# Lines of run blocks replaced by a no-op, with why.
LEFT_OUT = {
    "flywheel train grpo --domain code --base ./tiny-base --config examples/grpo.yaml \\\n"
    "    --gpus 4 num_generations=8": "needs 4 GPUs; tests/finetune cover GRPO on CPU",
}

# Textual changes to run blocks, with why (each must keep the line count).
CHANGED = {
    "--steps 300": "--steps 20",  # pretraining 300 steps is ~150 s of CPU; 20 give a base
    # that trains and evaluates (its quality is not what this test checks)
}

# Commands that may refuse on a walk-through this small (a handful of items), but only as a
# refusal: one `error:` line, no traceback (PRELUDE's may_refuse).
MAY_REFUSE = (
    "flywheel eval --domain billing",  # the gate wants 30 eval items
    "flywheel models promote --domain billing --to 2",  # a version that did not pass
    "flywheel models rollback --domain billing",  # no former champion
    # Which groups land in eval hangs on the walk-through's random ids: its one or two eval
    # items may hold nothing the primary metric scores, and the cycle stops before gating.
    "flywheel cycle --domain billing",
)

TRACEBACK = "Traceback (most recent call last)"
API_ERROR = re.compile(r'\{"error":\s*\{')


def _shell_blocks() -> list[Block]:
    """The shell blocks; a section's second block is named `<heading>#2`, and so on."""
    blocks: list[Block] = []
    seen: dict[str, int] = {}
    for block in readme_blocks():
        if block.language not in ("bash", "sh", "shell"):
            continue
        count = seen[block.heading] = seen.get(block.heading, 0) + 1
        key = block.heading if count == 1 else f"{block.heading}#{count}"
        blocks.append(Block(key, block.line, block.language, block.text))
    return blocks


SHELL_BLOCKS = _shell_blocks()
RUN_BLOCKS = [block for block in SHELL_BLOCKS if block.heading not in EXCLUDED]
# Blocks that train (minutes of CPU): marked `trains`, like the other tests that do.
TRAINING_SECTIONS = ("Training", "Evaluate", "Cycles")


def _param(block: Block) -> object:
    marks = [pytest.mark.trains] if block.heading.startswith(TRAINING_SECTIONS) else []
    return pytest.param(block, id=f"line-{block.line}", marks=marks)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _replacements(block: Block, port: int) -> dict[str, str]:
    """What this block needs changed: the free port, the left-out lines, CHANGED, MAY_REFUSE."""
    changes = {"localhost:8000": f"localhost:{port}", "--port 8000": f"--port {port}"}
    changes |= {old: ": left out" + "\n" * old.count("\n") for old in LEFT_OUT}
    changes |= CHANGED
    changes |= {command: f"may_refuse {command}" for command in MAY_REFUSE}
    return {old: new for old, new in changes.items() if old in block.text}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | Path]:
    """A scratch directory holding a copy of examples/, and the environment to run in it."""
    directory = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "examples", directory / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env |= {"FLYWHEEL_HOME": str(directory / ".flywheel"), "OMP_NUM_THREADS": "1"}
    return {"directory": directory, **env}


def test_every_exclusion_names_a_block_and_every_change_a_line() -> None:
    headings = {block.heading for block in SHELL_BLOCKS}
    assert set(EXCLUDED) <= headings, set(EXCLUDED) - headings
    run_text = "\n".join(block.text for block in RUN_BLOCKS)
    for old in [*LEFT_OUT, *CHANGED, *MAY_REFUSE]:
        assert old in run_text, f"the README no longer has {old!r}"


@pytest.mark.parametrize("block", [_param(block) for block in RUN_BLOCKS])
def test_the_readme_block_runs(block: Block, workspace: dict[str, str | Path]) -> None:
    env = {k: str(v) for k, v in workspace.items() if k != "directory"}
    text = script(block, _replacements(block, _free_port()))

    result = subprocess.run(
        ["bash", "-c", text],
        cwd=workspace["directory"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # a hang guard, not a time goal: ~10 min here, 14 on a loaded CI machine
        check=False,
    )

    where = f"{block.name} failed (exit {result.returncode})"
    trace = f"--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-5000:]}"
    assert result.returncode == 0, f"{where}\n{trace}"
    assert TRACEBACK not in result.stderr, f"{block.name}: a traceback\n{trace}"
    assert not API_ERROR.search(result.stdout), f"{block.name}: an API error answer\n{trace}"


def test_a_failing_command_is_named_by_its_readme_line(tmp_path: Path) -> None:
    text = "# Title\n\n## A section\n\n```bash\ntrue\nfalse  # the failing one\necho never\n```\n"
    (block,) = readme_blocks(text)

    result = subprocess.run(
        ["bash", "-c", script(block, {})], cwd=tmp_path, capture_output=True, text=True, check=False
    )

    assert block.name == "README.md:6 (A section)"
    assert result.returncode == 1
    assert "README.md:7: false" in result.stderr
    assert "never" not in result.stdout


def test_may_refuse_accepts_a_one_line_error_and_nothing_else(tmp_path: Path) -> None:
    refusal = "sh -c 'echo \"error: v2 did not pass its gate\" >&2; exit 1'"
    crash = 'sh -c \'echo "Traceback (most recent call last):" >&2; echo "error: x" >&2; exit 1\''
    for command, expected in ((refusal, 0), (crash, 1), ("true", 0), ("false", 1)):
        (block,) = readme_blocks(f"## S\n```bash\nmay_refuse {command}\n```\n")
        result = subprocess.run(
            ["bash", "-c", script(block, {})], cwd=tmp_path, capture_output=True, text=True
        )
        assert result.returncode == expected, (command, result.stderr)
