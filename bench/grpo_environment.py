"""Benchmark: GRPO in a sandboxed environment — episodes/s, and a step's time split into
generation, the environment and the update, at 8 episodes per step and at 2 (GRPO's smallest
group), one-turn episodes against multi-turn ones (`max_turns` 1 and 2: finetune.multiturn),
with the episodes' sessions opened in the background (finetune.environments) and inline (each
in its `reset`, as before), side by side in one run.

    python -m bench.grpo_environment [--steps 10] [--episodes 8 2] [--turns 1 2] [--threads N]
                                     [--environment file_system|memorised] [--opens ...]

The base is the tests' tiny Qwen 2.5 that memorised a two-turn episode
(tests/finetune/test_multiturn_training: "Go to the docs folder." -> cd(folder="docs") ->
"Done.", "Back up." -> cd(folder="..") -> "Done."), so its rollouts really call the tool, in
both turns. The tasks are environment tasks of BFCL's file system (tests/fixtures/bfcl, bundled
as `flywheel ingest tasks --format bfcl` bundles it; its `cd` the tool shown), four initial
trees that all hold `docs`, ground truth cd("docs") then touch("done.txt"), and in the second
turn cd("..") then touch("back.txt") (a `cd` alone moves only a private attribute, which the
state check does not see, and training leaves out a task its ground truth leaves unchanged):
the base's cds are right, its episodes miss the touches, so their rewards are 0 and the bench
measures time, not learning (`memorised`: the tests' own one-method environment, whose answers
the base memorised). Training is our recipe, unchanged (`finetune.grpo.train`:
WeightedGrpoTrainer, TRL's environment_factory, the real bwrap sandbox), `num_generations` =
`per_device_train_batch_size` = episodes: one prompt's group of episodes per step;
`max_episode_tokens` 384 (the two-turn episode is about a third of it). TRL resets a batch's
episodes, runs their tool calls and scores them one rollout after another (only generation is
batched), so "N concurrent" is N episodes in flight per step.

One training run per episode count and turns, its steps alternating between background and inline
opens (so that the load of a shared machine falls on both alike); the first step, cold, is
left out, and each figure is the median over a mode's steps. Measured per step: the wall
clock (a TrainerCallback, on_step_begin -> on_step_end; TRL's `step_time` beside it); the
environment: the time the trainer spends in the episode class's `reset`, tool calls and
`get_reward` (timed by wrapping `EnvironmentEpisode`'s methods and the sandbox backend's
session, not by editing them), split into session open (when on the trainer's path), calls,
state, reward check, close and the rest (waiting for a background open, the class's own
work), with the background opens' own time beside it; generation: the trainer's `_generate`
less the tool calls made inside it; update: the rest (old/reference log-probs, the other
rewards, advantages, forward, backward, optimizer). Ground-truth states are computed before
training (the trainer caches them; a run past its first steps has them). Prints episodes/s,
the three shares, and the environment's share against the 15 % goal. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

import finetune.grpo
from finetune import environments
from finetune.config import load_config
from finetune.environments import EnvironmentEpisode
from finetune.job import Job
from flywheel.datasets.export import export_version
from flywheel.datasets.export_records import ItemStreams, TaskRecord
from flywheel.sandbox import check_available
from flywheel.sandbox import environment as sandbox
from ingest.bfcl_environments import EnvironmentCatalog
from tests.finetune.agent_fixtures import CALL, SPEC, TOOLS, task_record
from tests.finetune.test_multiturn_training import BACK, save_two_turn_base

FIXTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "bfcl" / "environments"
GOAL = 0.15
EPISODE_TOKENS = 384
OPENS = ("background", "inline")
ENVIRONMENT_PARTS = ("open", "call", "state", "reward", "close")


class Clock:
    """Seconds per part, summed since the last `take`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()  # sessions may open in background threads

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as `name`; as `name.background` off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            name += ".background"
        started = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[name] += time.perf_counter() - started
                self.counts[name] += 1

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        with self._lock:
            taken = (dict(self.seconds), dict(self.counts))
            self.seconds.clear()
            self.counts.clear()
        return taken


CLOCK = Clock()


def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with CLOCK.part(name):
            return function(*args, **kwargs)

    return wrapper


class TimedSession:
    """The sandbox's EnvironmentSession, its calls, state reads and close timed."""

    def __init__(self, session: sandbox.EnvironmentSession) -> None:
        self._session = session

    def call(self, name: str, arguments: Mapping[str, Any]) -> sandbox.ToolResult:
        with CLOCK.part("call"):
            return self._session.call(name, arguments)

    def state(self) -> dict[str, dict[str, Any]]:
        with CLOCK.part("state"):
            return self._session.state()

    def close(self) -> None:
        with CLOCK.part("close"):
            self._session.close()


class TimedBackend:
    """flywheel.sandbox.environment, its session opens and reward checks timed."""

    @staticmethod
    def open_environment(spec: Mapping[str, Any]) -> TimedSession:
        with CLOCK.part("open"):
            return TimedSession(sandbox.open_environment(spec))

    @staticmethod
    def final_state_reward(spec: Mapping[str, Any], state: Mapping[str, Any]) -> float:
        with CLOCK.part("reward"):
            return sandbox.final_state_reward(spec, state)

    @staticmethod
    def ground_truth_state(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        return sandbox.ground_truth_state(spec)  # at routing, before the steps: not timed


@dataclass
class Step:
    opens: str
    wall_s: float
    seconds: dict[str, float]
    counts: dict[str, int]
    log: dict[str, float] = field(default_factory=dict)


@dataclass
class StepClock(TrainerCallback):
    """Each step's wall clock and parts; its sessions opened as `modes` says, in turn."""

    modes: tuple[str, ...] = OPENS
    steps: list[Step] = field(default_factory=list)
    _started: float = 0.0
    _opener: Any = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self._opener is None:
            self._opener = environments._opener
        mode = self.modes[len(self.steps) % len(self.modes)]
        environments._opener = self._opener if mode == "background" else InlineOpener  # type: ignore[assignment]
        CLOCK.take()
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        wall_s = time.perf_counter() - self._started
        mode = self.modes[len(self.steps) % len(self.modes)]
        self.steps.append(Step(mode, wall_s, *CLOCK.take()))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
        if logs and "step_time" in logs and self.steps:
            self.steps[-1].log = dict(logs)


CURRENT: list[StepClock] = []  # the run's clock, for the trainer it builds


class TimedTrainer(finetune.grpo.WeightedGrpoTrainer):
    """The recipe's trainer, with its generation timed and the step clock attached."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_callback(CURRENT[-1])

    def _generate(self, prompts: list[Any]) -> Any:
        with CLOCK.part("generate"):
            return super()._generate(prompts)


class InlineOpener:
    """An executor that runs each open at once on the caller's thread: sessions open in
    `reset`, one after another (finetune.environments before its background opens)."""

    def submit(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(function(*args, **kwargs))
        except BaseException as error:  # handed to the episode, as the pool's future would
            future.set_exception(error)
        return future


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """The episode class's methods, the sandbox backend and the recipe's trainer swapped for
    timed ones (and the opener as the step clock says), for the block only."""
    saved = {name: EnvironmentEpisode.__dict__[name] for name in ("reset", "get_reward", "_call")}
    backend, trainer = environments.sandbox_backend, finetune.grpo.WeightedGrpoTrainer
    opener = environments._opener
    try:
        for name, method in saved.items():
            setattr(EnvironmentEpisode, name, timed(f"episode.{name}", method))
        environments.sandbox_backend = lambda: TimedBackend  # type: ignore[assignment, return-value]
        finetune.grpo.WeightedGrpoTrainer = TimedTrainer  # type: ignore[misc]
        yield
    finally:
        for name, method in saved.items():
            setattr(EnvironmentEpisode, name, method)
        environments.sandbox_backend = backend
        finetune.grpo.WeightedGrpoTrainer = trainer  # type: ignore[misc]
        environments._opener = opener


def trees() -> list[dict[str, Any]]:
    """Four initial file trees, each with a `docs` folder."""
    files = [{}, {"a.txt": "alpha\n"}, {"notes.txt": "buy milk\n" * 20}, {"b.md": "# b\n"}]
    return [
        {
            "alex": {
                "type": "directory",
                "contents": {
                    "docs": {
                        "type": "directory",
                        "contents": {
                            name: {"type": "file", "content": text} for name, text in own.items()
                        },
                    },
                    "archive": {"type": "directory", "contents": {}},
                },
            }
        }
        for own in files
    ]


def specs(environment: str) -> list[dict[str, Any]]:
    """The task set: BFCL's file system over four trees, or the tests' memorised one (x4).
    Two user turns each ("Back up." the second); a one-turn run plays the first."""
    if environment == "memorised":
        return [copy.deepcopy(SPEC) for _ in range(4)]
    source = EnvironmentCatalog(FIXTURE).source(["GorillaFileSystem"], long_context=False)
    touch = {"name": "touch", "arguments": {"file_name": "done.txt"}}
    back = {"name": "touch", "arguments": {"file_name": "back.txt"}}
    return [
        {
            "source": source,
            "classes": {"GorillaFileSystem": {"root": root}},
            "turns": copy.deepcopy(SPEC["turns"]),
            "ground_truth": [[copy.deepcopy(CALL), touch], [copy.deepcopy(BACK), back]],
        }
        for root in trees()
    ]


def as_exported(spec: Mapping[str, Any], turns: int) -> dict[str, Any]:
    """The spec as an episode gets it: through the export's JSON (keys sorted, which orders
    BFCL's directory contents and so its state's repr) and cut to the played turns."""
    exported: dict[str, Any] = json.loads(json.dumps(spec, sort_keys=True))
    return environments.played_spec(exported, environments.planned_turns(exported, turns))


def tasks(environment: str) -> list[TaskRecord]:
    return [task_record("environment", tools=TOOLS, environment=s) for s in specs(environment)]


@dataclass(frozen=True)
class Setting:
    environment: str
    episodes: int
    turns: int


def run(setting: Setting, modes: tuple[str, ...], steps: int, root: Path, base: Path) -> StepClock:
    """`steps` measured steps per mode (after a cold one) of the recipe at `setting`."""
    CURRENT.append(StepClock(modes))
    environment, episodes = setting.environment, setting.episodes
    name = f"{environment}-{episodes}-{setting.turns}"
    total = steps * len(modes) + 1
    export = root / f"export-{name}"
    streams = ItemStreams(tasks=tasks(environment))
    export_version(export, "trl", {"train": streams}, {})
    config = load_config(
        "grpo",
        None,
        [
            f"max_steps={total}",
            f"per_device_train_batch_size={episodes}",
            f"num_generations={episodes}",
            "max_completion_length=96",
            f"max_turns={setting.turns}",
            f"max_episode_tokens={EPISODE_TOKENS}",
            "max_tool_calling_iterations=3",
            "temperature=0.1",
            "canary_fraction=0",
            "lora.r=4",
            "dynamic_sampling=false",
            "logging_steps=1",
            f"save_steps={total}",
        ],
    )
    job = Job("grpo", config, export, base, root / f"job-{name}")
    with instrumented():
        outcome = finetune.grpo.train(job)
    assert outcome.status == "finished", outcome
    return CURRENT[-1]


CLOCK_NAMES = (
    "generate",
    "episode.reset",
    "episode._call",
    "episode.get_reward",
    *ENVIRONMENT_PARTS,
    "open.background",
)


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def environment_of(step: Step) -> float:
    """The trainer's time in the episode class: resets, tool calls, rewards."""
    return sum(
        step.seconds.get(f"episode.{name}", 0.0) for name in ("reset", "get_reward", "_call")
    )


def generation_of(step: Step) -> float:
    return step.seconds.get("generate", 0.0) - step.seconds.get("episode._call", 0.0)


def report(clock: StepClock, setting: Setting, opens: str) -> dict[str, Any]:
    """Medians over the mode's steps (a shared machine's load spikes spare the median)."""
    episodes = setting.episodes
    measured = [step for step in clock.steps[1:] if step.opens == opens]  # the first is cold
    wall = median([step.wall_s for step in measured])
    part = {name: median([s.seconds.get(name, 0.0) for s in measured]) for name in CLOCK_NAMES}
    count = {name: median([float(s.counts.get(name, 0)) for s in measured]) for name in CLOCK_NAMES}
    environment_s = median([environment_of(step) for step in measured])
    generation_s = median([generation_of(step) for step in measured])
    update_s = median([s.wall_s - environment_of(s) - generation_of(s) for s in measured])
    logs = [step.log for step in measured]
    trl_step = median([log.get("step_time", float("nan")) for log in logs])
    rewards = [log.get("rewards/GorillaFileSystem/mean", float("nan")) for log in logs]
    calls = [log.get("tools/call_frequency", float("nan")) for log in logs]
    print(f"\n{episodes} episodes per step, {setting.turns} user turn(s) each, sessions opened "
          f"{opens} ({len(measured)} steps)")  # fmt: skip
    print(f"  step (median) {wall:7.3f} s (TRL step_time {trl_step:.3f} s)   "
          f"episodes/s {episodes / wall:6.2f}")  # fmt: skip
    steps = " ".join(f"{s.wall_s:.2f}/{s.seconds.get('generate', 0.0):.2f}" for s in measured)
    print(f"  each step's wall/generate s: {steps}")
    for name, seconds in (
        ("generation", generation_s),
        ("environment", environment_s),
        ("update (the rest)", update_s),
    ):
        print(f"  {name:<20}{seconds:8.3f} s/step  {seconds / wall:6.1%} of the median step")
    print(f"  tool calls per episode {mean(calls):.2f}, episode reward mean {mean(rewards):.2f}")
    per_episode = {name: 1000 * part[name] / episodes for name in ENVIRONMENT_PARTS}
    other = 1000 * environment_s / episodes - sum(per_episode.values())
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in per_episode.items())
    background = 1000 * part["open.background"] / episodes
    print(f"  environment ms per episode on the trainer's path: {parts}, other {other:.1f}")
    print(f"  session open in the background, ms per episode: {background:.1f}")
    each_ms = 1000 * part["call"] / max(count["call"], 1)
    print(f"  tool calls per step {count['call']:.1f}, {each_ms:.1f} ms each")
    share = environment_s / wall
    verdict = "within" if share < GOAL else "OVER"
    print(f"  environment share {share:.1%} vs goal < {GOAL:.0%}: {verdict}")
    lengths = [log.get("completions/mean_length", float("nan")) for log in logs]
    print(f"  model tokens per episode {mean(lengths):.1f}")
    return {
        "episodes": episodes,
        "turns": setting.turns,
        "opens": opens,
        "share": share,
        "rate": episodes / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per open mode")
    parser.add_argument("--episodes", type=int, nargs="+", default=[8, 2])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--environment", choices=["file_system", "memorised"], default="file_system"
    )
    parser.add_argument("--opens", nargs="+", choices=OPENS, default=list(OPENS))
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2], help="max_turns values")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    check_available()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, "
          f"torch threads {args.threads}")  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        os.environ["FLYWHEEL_HOME"] = str(root / "home")
        started = time.perf_counter()
        base = save_two_turn_base(root / "base")
        print(f"tiny two-turn tool base built in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        task_specs = specs(args.environment)
        for spec in task_specs:
            for turns in args.turns:
                sandbox.ground_truth_state(as_exported(spec, turns))
        print(f"ground truths: {time.perf_counter() - started:.2f} s for {len(task_specs)} tasks")
        results = []
        for episodes in args.episodes:
            for turns in args.turns:
                setting = Setting(args.environment, episodes, turns)
                clock = run(setting, tuple(args.opens), args.steps, root, base)
                results += [report(clock, setting, opens) for opens in args.opens]
    summary(results)


def summary(results: list[dict[str, Any]]) -> None:
    print(f"\nload average {os.getloadavg()[0]:.2f} after the run")
    for result in results:
        print(f"  {result['episodes']} episodes/step, {result['turns']} turn(s), opens "
              f"{result['opens']:<10}: {result['rate']:6.2f} episodes/s, "
              f"environment {result['share']:.1%}")  # fmt: skip
    for one in (r for r in results if r["turns"] == 1):
        for many in results:
            if many["turns"] > 1 and (many["episodes"], many["opens"]) == (
                one["episodes"],
                one["opens"],
            ):
                print(f"  {one['episodes']} episodes/step, opens {one['opens']}: "
                      f"{many['turns']} turns / 1 turn episodes/s "
                      f"{many['rate'] / one['rate']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
