"""The arithmetic domain, defined once: two-digit additions, the carry, the carry mistake and
the split. `finetune.synthetic` pretrains the tiny base model and measures learning on it; the
demo's feedback (`arithmetic_feedback`) asks the same problems. Standard library only, and
nothing else of the project: `finetune` may import this module (its import contract allows
exactly it) and must not pull in the database, the CLI or the rest of the demo with it.

Every problem `a+b=` (10 <= a, b <= 99) is asked as one user turn and has one right answer,
the sum. A fixed rule splits the 8,100 problems three ways:

- the *broad* slice, problems whose units digits do not carry (12+34), pretrains the base
  model (`finetune.tiny`): the stand-in for what a real base model already knows;
- the problems that carry (17+25) are the new skill: one in five is *held_out* for
  measuring, and *train* for SFT, DPO and GRPO is everything else (carries and broad).

Split by skill rather than by number range: the base then gets no held-out answer right (it
has never written a carry), so every held-out pair is one post-training must move. A base
that half-knows the held-out answers (pretrained on a < 55, say) leaves DPO's implicit reward
margins mostly noise on the half it already knew (held-out preference accuracy ~0.7 at
best). And the adapter, not the base, must carry the skill, so switching it off brings exact
match back to the base's.
"""

from __future__ import annotations

from dataclasses import dataclass

LOW, HIGH = 10, 99
HELD_OUT_EVERY = 5  # one in five problems of the new skill is held out


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def carries(self) -> bool:
        return self.a % 10 + self.b % 10 >= 10

    @property
    def wrong_answer(self) -> str:
        """The carry mistake: the carry dropped (17+25 -> 32) or, where there is none, one
        invented (12+34 -> 56). A near miss, so a DPO pair rewards doing the carry right
        rather than "answers look like numbers"."""
        return str(self.a + self.b + (-10 if self.carries else 10))


@dataclass(frozen=True)
class Split:
    broad: list[Problem]
    train: list[Problem]
    held_out: list[Problem]


def problems() -> list[Problem]:
    """All 8,100 problems, `a` then `b` ascending."""
    return [Problem(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]


def split_problems() -> Split:
    """All 8,100 problems, split by fixed rules (no randomness, so no seed to thread).

    `train` is every problem not held out, the broad slice included: trained on carries
    alone, an adapter learns "always carry" and unlearns the broad slice; mixed, it has to
    learn when.
    """
    every = problems()
    held_out = [p for p in every if p.carries and _bucket(p) == 0]
    return Split(
        broad=[p for p in every if not p.carries],
        train=[p for p in every if not (p.carries and _bucket(p) == 0)],
        held_out=held_out,
    )


def _bucket(problem: Problem) -> int:
    """Spreads held-out problems over every tens digit of both operands."""
    return (problem.a * 31 + problem.b * 17) % HELD_OUT_EVERY


def _carry_pattern() -> str:
    """A regex for the prompts `a+b=` whose units digits carry (their sum is 10 or more)."""
    units = "|".join(f"{a}\\+\\d[{10 - a}-9]" for a in range(1, 10))
    return f"^\\d(?:{units})=$"


def _three_digit_sum_pattern() -> str:
    """A regex for the prompts `a+b=` whose sum is 100 or more: the tens digits reach 10, or
    reach 9 and the units carry."""
    tens = [f"{a}\\d\\+[{10 - a}-9]\\d" for a in range(1, 10)]
    carried = [
        f"{a}{units}\\+{9 - a}[{10 - units}-9]" for a in range(1, 9) for units in range(1, 10)
    ]
    return f"^(?:{'|'.join(tens + carried)})=$"


CARRY_PROMPT = _carry_pattern()
"""Matches exactly the prompts of `Problem.carries` (tested over all 8,100)."""
NO_CARRY_PROMPT = f"^(?!{CARRY_PROMPT.removeprefix('^')})\\d\\d\\+\\d\\d=$"
THREE_DIGIT_SUM_PROMPT = _three_digit_sum_pattern()
"""Matches exactly the prompts whose sum has three digits (tested over all 8,100)."""
TWO_DIGIT_SUM_PROMPT = f"^(?!{THREE_DIGIT_SUM_PROMPT.removeprefix('^')})\\d\\d\\+\\d\\d=$"
SKILL_RULES = {
    "skill:carry": CARRY_PROMPT,
    "skill:no-carry": NO_CARRY_PROMPT,
    "sum:two-digit": TWO_DIGIT_SUM_PROMPT,
    "sum:three-digit": THREE_DIGIT_SUM_PROMPT,
}
"""The domain's skills as slice rules (`slice_rules` in its config): the gate judges the sums
the base already solved (no carry) apart from the new skill, so losing them shows; and the
sums below 100 apart from those into the hundreds (batch 2's), so an adapter that learns the
hundreds by forgetting the two-digit carries cannot hide it in the carry slice's mean (a
demo run's second adapter did: its carry slice rose 0.35 -> 0.88 while it got 12 of 30
two-digit carries wrong live, which the first had all right)."""
