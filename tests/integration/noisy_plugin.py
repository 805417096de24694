"""A `flywheel noisy` plugin command for tests/integration/test_cli_quiet.py: what the ML
libraries do when a command loads them. Standard library only, so that loading it changes
nothing of the process's warning filters (the test modules' imports do)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings


def noisy() -> None:
    """Warnings, a library logger's warning, and a progress bar in a subprocess (which
    inherits the environment, as the trainer and the evaluator do)."""
    warnings.warn("`attention_mask` is deprecated", FutureWarning, stacklevel=1)
    warnings.warn("TypedStorage is deprecated", UserWarning, stacklevel=1)
    logging.getLogger("transformers.modeling_utils").warning("Some weights were not used")
    bar = "import sys, tqdm\nfor _ in tqdm.tqdm(range(3), file=sys.stderr): pass\n"
    child = subprocess.run([sys.executable, "-c", bar], capture_output=True, text=True, check=True)
    sys.stdout.write(json.dumps({"child_stderr": child.stderr}) + "\n")
