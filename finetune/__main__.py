"""`python -m finetune METHOD --config C --dataset DIR --base MODEL_DIR --out DIR [KEY=VALUE...]`

Bad input (config, export, base model) is one line on stderr and exit status 2, before any
training. A SIGTERM checkpoints and exits with status 75; `--resume` continues from the latest
complete checkpoint. On success the last stdout line is the outcome as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from finetune import dpo, grpo, kto, sft
from finetune.canaries import preflight_sandbox
from finetune.config import GrpoConfig, load_config
from finetune.data import FILES, check_tasks, open_export
from finetune.errors import TrainingInputError
from finetune.job import INTERRUPTED_EXIT, Job, Outcome
from finetune.model import check_base

# The training method named on the command line -> its recipe's train(job).
RECIPES: dict[str, Callable[[Job], Outcome]] = {
    "sft": sft.train,
    "dpo": dpo.train,
    "kto": kto.train,
    "grpo": grpo.train,
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune", description=__doc__)
    parser.add_argument("method", choices=tuple(RECIPES))
    parser.add_argument("--config", type=Path, help="A YAML config (defaults otherwise).")
    parser.add_argument("--dataset", type=Path, required=True, help="A trl dataset export.")
    parser.add_argument("--base", type=Path, required=True, help="A base model directory.")
    parser.add_argument("--out", type=Path, required=True, help="The job's directory.")
    parser.add_argument("--resume", action="store_true", help="From the latest checkpoint.")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return parser.parse_intermixed_args(argv)


def preflight(job: Job) -> None:
    """The cheap checks of everything given, before anything heavy loads."""
    export = open_export(job.dataset)
    if export.path(job.method) is None:
        raise TrainingInputError(
            f"{job.dataset} has no train/{FILES[job.method]}: the version holds nothing for "
            f"{job.method}"
        )
    if job.method == "grpo":
        tasks = export.root / f"train/{FILES['grpo']}"
        check_tasks(tasks)
        lines = tasks.read_text(encoding="utf-8").splitlines()
        preflight_sandbox(json.loads(line) for line in lines if line)  # code tasks only
    check_base(job.base)
    optional = {"liger_kernel": job.config.use_liger_kernel}
    if isinstance(job.config, GrpoConfig):
        optional["vllm"] = job.config.use_vllm
    for module, wanted in optional.items():
        if wanted and importlib.util.find_spec(module) is None:
            raise TrainingInputError(f"the config asks for {module}, which is not installed")


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.method, args.config, args.overrides)
        job = Job(args.method, config, args.dataset, args.base, args.out, is_resume=args.resume)
        preflight(job)
        job.out.mkdir(parents=True, exist_ok=True)
        outcome = RECIPES[args.method](job)
    except TrainingInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(outcome.as_json()))
    return INTERRUPTED_EXIT if outcome.status == "interrupted" else 0


if __name__ == "__main__":
    raise SystemExit(main())
