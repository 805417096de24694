"""The demo's learnable domain: feedback on two-digit additions, in two batches.

The problems are `flywheel.demo.arithmetic`'s, the definition `finetune.synthetic` pretrains
the tiny base model from: `a+b=` with 10 <= a, b <= 99, asked as one user turn, answered with
the sum. The base is pretrained on the split's broad slice, the sums whose units digits do
not carry, so a carry (17+25=) is the skill it lacks and the feedback must teach.

What users sent, as `POST /v1/feedback` bodies carrying their own conversation:

- corrections: the assistant dropped a carry (17+25= -> "32") or invented one (12+34= ->
  "56") and a user typed the right sum. The compiler turns each into an SFT example (the
  corrected sum) and a preference pair (corrected over original). About two in three are
  carries; the rest keep the adapter from learning "always carry";
- comparisons: two answers side by side, the right one preferred (pairs only);
- thumbs up on right answers to sums without a carry (KTO labels: the model got those right).

Every prompt is asked once across both batches, so they never overlap and each prompt is its
own group: `flywheel dataset build` draws a tenth of them into the frozen eval set.

Batch 1's carries are small sums (below 100). Batch 2, the "more feedback" of the second
cycle, is 2.5 times larger and its carries run into the hundreds (57+68=125), which the first
adapter has seen no example of: it gets them wrong, the second adapter learns them, and on
the grown eval set the second clearly beats the first. (More examples of the same kind would
not do: at this size the adapter's accuracy follows its training steps, not the number of
distinct examples, so a bigger batch 1 alone teaches the same.)

Problems are picked by a hash of the prompt (no random module, no seed): the same batch
gives the same bytes on every machine and Python version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from flywheel.demo.arithmetic import Problem, problems, split_problems

RATERS = 12  # pseudonymous raters: "rater-" + 8 hex digits of a hash


@dataclass(frozen=True)
class BatchSize:
    """How many prompts of each kind of feedback one batch holds."""

    carry_corrections: int
    carry_comparisons: int
    plain_corrections: int  # corrections of an invented carry (a problem without one)
    plain_comparisons: int
    thumbs_up: int  # right answers to problems without a carry

    @property
    def carries(self) -> int:
        return self.carry_corrections + self.carry_comparisons

    @property
    def plain(self) -> int:
        return self.plain_corrections + self.plain_comparisons + self.thumbs_up


# (quick, batch) -> its size; quick is the CI smoke's. Batch 1's corrections are its SFT
# items: their eval share (~60 at the eval fractions of `data.arithmetic_plan`) must clear
# the gate's `min_items` (30).
SIZES: dict[tuple[bool, int], BatchSize] = {
    (False, 1): BatchSize(400, 20, 200, 20, 40),
    (False, 2): BatchSize(1000, 60, 500, 60, 60),
    (True, 1): BatchSize(200, 10, 100, 10, 20),
    (True, 2): BatchSize(400, 20, 200, 20, 30),
}


def all_problems() -> list[Problem]:
    """Every problem, in a fixed order that looks random (sha256 of the prompt)."""
    return sorted(problems(), key=lambda p: _digest(f"flywheel-demo:{p.prompt}"))


def batch_problems(batch: int, *, quick: bool) -> tuple[list[Problem], list[Problem]]:
    """(carry problems, problems without a carry) of a batch. Batch 1's carries are small
    sums (below 100), batch 2's carry into the hundreds (57+68=125): a skill the first
    adapter has seen no example of. Problems without a carry (the broad slice the base is
    pretrained on) come from one list, batch 2 taking those after batch 1's, so the two
    batches never share a prompt."""
    if batch not in (1, 2):
        raise ValueError(f"the demo has feedback batches 1 and 2, not {batch}")
    ordered = all_problems()
    known = set(split_problems().broad)  # what the base model is pretrained on
    carries = [p for p in ordered if p not in known and (p.a + p.b < 100) == (batch == 1)]
    plain = [p for p in ordered if p in known]
    size = SIZES[quick, batch]
    plain_start = 0 if batch == 1 else SIZES[quick, 1].plain
    return carries[: size.carries], plain[plain_start : plain_start + size.plain]


def feedback_events(batch: int, *, quick: bool) -> list[dict[str, Any]]:
    """The batch's feedback events, in `POST /v1/feedback` shape (no `domain`: they go to
    the domain the file is ingested into), shuffled by a hash into a stable order."""
    size = SIZES[quick, batch]
    carries, plain = batch_problems(batch, quick=quick)
    compared_plain = plain[size.plain_corrections : size.plain_corrections + size.plain_comparisons]
    events = [
        *(_correction(p) for p in carries[: size.carry_corrections]),
        *(_comparison(p, i) for i, p in enumerate(carries[size.carry_corrections :])),
        *(_correction(p) for p in plain[: size.plain_corrections]),
        *(_comparison(p, i) for i, p in enumerate(compared_plain)),
        *(_thumbs_up(p) for p in plain[size.plain_corrections + size.plain_comparisons :]),
    ]
    events.sort(key=lambda event: _digest(f"order:{event['event_id']}"))
    return [_numbered(event, batch, number) for number, event in enumerate(events, 1)]


def _numbered(event: dict[str, Any], batch: int, number: int) -> dict[str, Any]:
    return {**event, "event_id": f"demo-arith-b{batch}-{number:05d}"}


def _correction(problem: Problem) -> dict[str, Any]:
    return {
        "kind": "correction",
        "prompt": problem.prompt,
        "response": problem.wrong_answer,
        "value": {"text": problem.answer},
        "rater": rater_id(problem.prompt),
        "event_id": f"correction:{problem.prompt}",
    }


def _comparison(problem: Problem, index: int) -> dict[str, Any]:
    """Two answers shown side by side; the right one is preferred, at either position."""
    right_first = index % 2 == 0
    responses = (
        [problem.answer, problem.wrong_answer]
        if right_first
        else [problem.wrong_answer, problem.answer]
    )
    return {
        "kind": "comparison",
        "value": {
            "messages": [{"role": "user", "content": problem.prompt}],
            "responses": responses,
            "preferred": 0 if right_first else 1,
        },
        "rater": rater_id(problem.prompt),
        "event_id": f"comparison:{problem.prompt}",
    }


def _thumbs_up(problem: Problem) -> dict[str, Any]:
    return {
        "kind": "rating",
        "prompt": problem.prompt,
        "response": problem.answer,
        "value": {"thumbs": "up"},
        "rater": rater_id(problem.prompt),
        "event_id": f"rating:{problem.prompt}",
    }


def rater_id(seed: str) -> str:
    """One of RATERS pseudonymous ids, the same for the same seed."""
    number = int(_digest(f"rater:{seed}"), 16) % RATERS
    return "rater-" + _digest(f"demo-rater-{number}")[:8]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def live_problems(round_number: int, count: int) -> list[Problem]:
    """The questions the demo's simulated users ask through the gateway in live round
    `round_number` (1, 2, ...): `count` problems no feedback batch holds, and no earlier
    round, a third each of two-digit carries (batch 1's skill), carries into the hundreds
    (batch 2's) and sums without a carry (what the base knew), so each round's thumbs-up
    rate weighs what each adapter learned and what it may have forgotten alike."""
    taken = {
        problem
        for batch in (1, 2)
        for quick in (False, True)
        for problems_of_batch in batch_problems(batch, quick=quick)
        for problem in problems_of_batch
    }
    fresh = [p for p in all_problems() if p not in taken]
    kinds = (
        [p for p in fresh if p.carries and p.a + p.b < 100],
        [p for p in fresh if p.carries and p.a + p.b >= 100],
        [p for p in fresh if not p.carries],
    )
    chosen: list[Problem] = []
    for index, pool in enumerate(kinds):
        size = count // 3 if index < 2 else count - 2 * (count // 3)
        start = (round_number - 1) * size
        chosen += pool[start : start + size]
    return sorted(chosen, key=lambda p: _digest(f"live:{p.prompt}"))
