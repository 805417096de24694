"""The README's code blocks, and how tests/acceptance/test_readme.py runs its shell ones.

A block runs as one bash script in a scratch directory (a copy of `examples/`, the README's
relative paths then work as they do from a checkout) with `FLYWHEEL_HOME` there: the embedded
SQLite database and MLflow store. Blocks run in README order and share that workspace, as a
reader's shell would. `set -x` with a PS4 naming the README line prints each command as it
runs, so a failure points at its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\s*$")

# Run before each block. `may_refuse CMD`: CMD may exit non-zero on the walk-through's tiny
# data, but only as a refusal: exit 3 (a gate's or a test run's verdict, printed in full) or
# its last stderr line `error: ...`, and no traceback.
PRELUDE = r"""set -euo pipefail
stop_jobs() { status=$?; { set +x; } 2>/dev/null; jobs -p | xargs -r kill 2>/dev/null; wait; }
trap 'stop_jobs; exit $status' EXIT
may_refuse() {
  { set +x; } 2>/dev/null  # its own steps untraced: the trace shows README lines only
  local err status=0
  err=$(mktemp)
  "$@" 2>"$err" || status=$?
  cat "$err" >&2
  if [ "$status" -ne 0 ]; then
    if grep -q "Traceback (most recent" "$err" \
        || { [ "$status" -ne 3 ] && ! tail -n 1 "$err" | grep -q '^error: '; }; then
      echo "DOCS-TEST: '$*' failed (exit $status) without a one-line error" >&2
      set -x
      return 1
    fi
    echo "DOCS-TEST: refused, as it may here: $*" >&2
  fi
  set -x
}
"""


@dataclass(frozen=True)
class Block:
    heading: str  # the README section it sits in
    line: int  # the README line of its first line of code
    language: str
    text: str

    @property
    def name(self) -> str:
        return f"README.md:{self.line} ({self.heading})"


def readme_blocks(text: str | None = None) -> list[Block]:
    """Every fenced code block of the README, in order."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    heading, opened, language = "", -1, ""
    for number, line in enumerate(lines, start=1):
        fence = FENCE.match(line)
        if opened < 0 and line.startswith("## "):
            heading = line.removeprefix("## ").strip()
        elif fence and opened < 0:
            opened, language = number, fence.group(1)
        elif line.startswith("```") and opened >= 0:
            blocks.append(
                Block(heading, opened + 1, language, "\n".join(lines[opened : number - 1]))
            )
            opened = -1
    return blocks


def script(block: Block, replacements: dict[str, str]) -> str:
    """The block as a script: each `old -> new` replacement applied (each must be there, and
    keep the line count, so that the README lines in the trace stay right)."""
    text = block.text
    for old, new in replacements.items():
        if old not in text:
            raise AssertionError(f"{block.name}: the docs test expects {old!r} in this block")
        if old.count("\n") != new.count("\n"):
            raise AssertionError(f"replacing {old!r} must keep the line count")
        text = text.replace(old, new)
    offset = block.line - 1 - PRELUDE.count("\n") - 1  # the PS4 line itself
    trace = f"PS4='>README.md:$((LINENO + {offset})): '; set -x\n"
    return PRELUDE + trace + text + "\n"
