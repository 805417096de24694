"""Verifiable rewards for TRL-style trainers: `(completions, **task_fields) -> list[float|None]`.

Each completion is run against its task's tests in the sandbox, concurrently; one hostile
sample costs at most its own wall clock and scores 0.0, never the batch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from flywheel.sandbox.execute import run_tests
from flywheel.sandbox.limits import Limits

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def completion_code(completion: str | list[dict[str, Any]]) -> str:
    """The code in a completion: a conversation's last message, inside its last ``` fence."""
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    fenced = _FENCE.findall(text)
    return fenced[-1] if fenced else text


class CodeReward:
    """Fraction of tests passed (or 1.0/0.0 with `all_or_nothing`) per completion.

    Task fields come as keyword lists, one entry per completion (as TRL passes dataset
    columns): `tests` and `entry_point`; a missing or empty one makes that reward None.
    """

    __name__ = "code_reward"  # TRL logs rewards under their function's name

    def __init__(
        self,
        *,
        mode: Literal["fraction", "all_or_nothing"] = "fraction",
        limits: Limits | None = None,
        max_workers: int = 8,
    ) -> None:
        self.mode = mode
        self.limits = limits or Limits()
        self.max_workers = max_workers

    def __call__(
        self,
        completions: Sequence[str | list[dict[str, Any]]],
        *,
        tests: Sequence[str | None] | None = None,
        entry_point: Sequence[str | None] | None = None,
        **_fields: Any,
    ) -> list[float | None]:
        tests = tests or [None] * len(completions)
        entry_point = entry_point or [None] * len(completions)
        with ThreadPoolExecutor(self.max_workers) as pool:
            futures = [
                pool.submit(self._score, completion, test, name)
                for completion, test, name in zip(completions, tests, entry_point, strict=True)
            ]
            return [future.result() for future in futures]

    def _score(
        self, completion: str | list[dict[str, Any]], tests: str | None, entry_point: str | None
    ) -> float | None:
        if not tests or not entry_point:
            return None
        verdict = run_tests(
            completion_code(completion), tests, entry_point=entry_point, limits=self.limits
        )
        if self.mode == "all_or_nothing":
            return 1.0 if verdict.is_passed else 0.0
        return verdict.pass_fraction if verdict.reason != "harness_error" else 0.0
