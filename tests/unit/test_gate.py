"""The promotion gate: paired bootstrap intervals checked against hand computations, and the
decisions the issue asks for — a clear improvement promoted; a tie, a non-significant gain, a
slice regression, a secondary regression and a canary pass refused."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
import pytest

from flywheel.errors import InvalidInput
from flywheel.evaluation.gate import Evaluation, GatePolicy, decide
from flywheel.evaluation.paired import Interval, paired_bootstrap

POLICY = GatePolicy(primary_metric="pass@1")


def scores(passes: Sequence[float]) -> dict[str, float]:
    """Item i -> its score, items named so that sorted order is index order."""
    return {f"item-{i:04d}": float(value) for i, value in enumerate(passes)}


def alternating_slices(n: int) -> dict[str, str]:
    return {f"item-{i:04d}": ("ticket" if i % 2 else "feedback") for i in range(n)}


def evaluation(
    primary: Sequence[float],
    *,
    slices: dict[str, str] | None = None,
    canary_pass_rate: float | None = 0.0,
    **secondary: Sequence[float],
) -> Evaluation:
    metrics = {"pass@1": scores(primary)} | {name: scores(v) for name, v in secondary.items()}
    return Evaluation(
        metrics=metrics,
        slices=slices if slices is not None else alternating_slices(len(primary)),
        canary_pass_rate=canary_pass_rate,
    )


def first(count: int, n: int = 200) -> list[bool]:
    """The first `count` of `n` items pass."""
    return [i < count for i in range(n)]


# The bootstrap, against hand computations.


def test_equal_differences_give_a_zero_width_interval_at_that_value() -> None:
    interval = paired_bootstrap(scores([0.75] * 7), scores([0.5] * 7), samples=500)
    assert interval == Interval(mean_diff=0.25, low=0.25, high=0.25, n=7, confidence=0.95)


def test_two_items_interval_spans_the_resample_means() -> None:
    # Differences (0, 1): resample means are 0, 0.5, 1 with chances 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles of 10k resamples are 0 and 1.
    interval = paired_bootstrap(scores([0, 1]), scores([0, 0]))
    assert (interval.mean_diff, interval.low, interval.high, interval.n) == (0.5, 0.0, 1.0, 2)


def test_pairing_is_by_item_id_not_by_mapping_order() -> None:
    challenger = scores([1, 0, 1, 1, 0, 1, 0, 1])
    champion = scores([0, 0, 1, 0, 0, 1, 1, 0])
    shuffled = dict(reversed(list(champion.items())))
    assert paired_bootstrap(challenger, champion) == paired_bootstrap(challenger, shuffled)


def test_bootstrap_is_deterministic_per_seed() -> None:
    # Continuous scores, so that the interval's bounds are not pinned to a lattice of values.
    values = np.random.default_rng(0).uniform(size=(2, 200))
    challenger, champion = scores(list(values[0])), scores(list(values[1]))
    same = paired_bootstrap(challenger, champion, seed=7)
    assert same == paired_bootstrap(challenger, champion, seed=7)
    assert same != paired_bootstrap(challenger, champion, seed=8)


def test_mismatched_item_sets_are_refused() -> None:
    with pytest.raises(InvalidInput, match="same items"):
        paired_bootstrap(scores([1, 1, 0]), scores([1, 1]))
    with pytest.raises(InvalidInput, match="no items"):
        paired_bootstrap({}, {})


def test_interval_covers_a_zero_true_difference_about_95_percent_of_the_time() -> None:
    started = time.perf_counter()
    rng = np.random.default_rng(2024)
    datasets, n = 400, 80
    misses = 0
    for seed in range(datasets):
        # Two models of equal skill on items of shared, varied difficulty: true difference 0.
        difficulty = rng.uniform(0.2, 1.0, n)
        challenger = scores(list(rng.uniform(size=n) < difficulty * 0.75))
        champion = scores(list(rng.uniform(size=n) < difficulty * 0.75))
        interval = paired_bootstrap(challenger, champion, samples=1_000, seed=seed)
        misses += not interval.low <= 0 <= interval.high
    assert 0.02 <= misses / datasets <= 0.07
    assert time.perf_counter() - started < 2


# Decisions.


def test_clear_improvement_is_promoted() -> None:
    decision = decide(evaluation(first(160)), evaluation(first(100)), POLICY)
    assert decision.is_promoted
    assert decision.reasons == []
    primary = decision.evidence["primary"]
    assert primary["challenger_mean"] == 0.8
    assert primary["champion_mean"] == 0.5
    assert primary["interval"]["mean_diff"] == pytest.approx(0.3)
    assert 0.2 < primary["interval"]["low"] < 0.3 < primary["interval"]["high"] < 0.4


def test_exact_tie_is_refused() -> None:
    decision = decide(evaluation(first(100)), evaluation(first(100)), POLICY)
    assert not decision.is_promoted
    interval = decision.evidence["primary"]["interval"]
    assert (interval["mean_diff"], interval["low"], interval["high"]) == (0, 0, 0)
    assert decision.reasons == [
        "pass@1 did not improve significantly: mean difference +0.0000, "
        "95% CI [+0.0000, +0.0000] does not lie above 0",
        "pass@1 did not improve significantly by the exact sign test: 0 wins, 0 losses, "
        "one-sided p = 1.0000 > 0.025",
    ]


def test_tie_with_disagreements_is_refused() -> None:
    # Same pass rate, 40 items won and 40 lost: the interval straddles 0.
    champion = first(100)
    challenger = [
        not value if i < 40 or 100 <= i < 140 else value for i, value in enumerate(champion)
    ]
    decision = decide(evaluation(challenger), evaluation(champion), POLICY)
    interval = decision.evidence["primary"]["interval"]
    assert not decision.is_promoted
    assert interval["mean_diff"] == 0
    assert interval["low"] < 0 < interval["high"]


def test_tiny_noisy_improvement_is_refused() -> None:
    # +12 items, -10 items of 200: a mean gain of 0.01 well within noise.
    champion = first(100)
    challenger = [
        not value if 90 <= i < 100 or 100 <= i < 112 else value for i, value in enumerate(champion)
    ]
    decision = decide(evaluation(challenger), evaluation(champion), POLICY)
    interval = decision.evidence["primary"]["interval"]
    assert interval["mean_diff"] == pytest.approx(0.01)
    assert interval["low"] < 0
    assert not decision.is_promoted
    assert decision.reasons[0].startswith("pass@1 did not improve significantly")


def slice_regression() -> tuple[Evaluation, Evaluation]:
    """400 items: on 300 tickets the challenger goes from 50% to 90%; on 100 feedback items
    from 80% to 40%. Overall +0.2, but the feedback slice loses 0.4."""
    tickets_old, tickets_new = first(150, 300), first(270, 300)
    feedback_old, feedback_new = first(80, 100), first(40, 100)
    slices = {f"item-{i:04d}": "ticket" if i < 300 else "feedback" for i in range(400)}
    return (
        evaluation(tickets_new + feedback_new, slices=slices),
        evaluation(tickets_old + feedback_old, slices=slices),
    )


def test_slice_regression_is_refused_naming_the_slice() -> None:
    challenger, champion = slice_regression()
    decision = decide(challenger, champion, POLICY)
    assert not decision.is_promoted
    assert decision.evidence["primary"]["passed"]
    assert decision.evidence["primary"]["interval"]["mean_diff"] == pytest.approx(0.2)
    assert len(decision.reasons) == 1
    assert decision.reasons[0].startswith("slice 'feedback' regressed on pass@1")
    by_slice = {entry["slice"]: entry for entry in decision.evidence["slices"]}
    assert by_slice["feedback"]["regressed"]
    assert not by_slice["ticket"]["regressed"]
    # Two judged slices: each held to 1 - 0.05 / 2.
    assert decision.evidence["slice_confidence"] == pytest.approx(0.975)
    assert by_slice["feedback"]["interval"]["confidence"] == pytest.approx(0.975)


def test_small_slice_is_reported_not_judged() -> None:
    # Five items from a new source all get worse; too few to veto a clear improvement.
    champion = first(100) + [True] * 5
    challenger = first(160) + [False] * 5
    slices = alternating_slices(200) | {f"item-{i:04d}": "repo" for i in range(200, 205)}
    decision = decide(
        evaluation(challenger, slices=slices), evaluation(champion, slices=slices), POLICY
    )
    assert decision.is_promoted
    repo = next(entry for entry in decision.evidence["slices"] if entry["slice"] == "repo")
    assert repo["interval"]["mean_diff"] == -1
    assert (repo["judged"], repo["regressed"]) == (False, False)


def test_secondary_regression_beyond_tolerance_is_refused() -> None:
    policy = GatePolicy(primary_metric="pass@1", secondary_metrics=("format_ok",))
    challenger = evaluation(first(160), format_ok=first(190))
    champion = evaluation(first(100), format_ok=first(200))
    decision = decide(challenger, champion, policy)
    assert not decision.is_promoted
    assert decision.reasons == [
        "format_ok regressed by 0.0500 (1.0000 -> 0.9500), beyond the tolerance of 0.0100"
    ]
    assert decision.evidence["secondary"][0]["delta"] == pytest.approx(-0.05)


def test_secondary_drop_within_tolerance_is_allowed() -> None:
    policy = GatePolicy(primary_metric="pass@1", secondary_metrics=("format_ok",))
    # Two items of 200 lost: exactly the tolerance of 0.01.
    challenger = evaluation(first(160), format_ok=first(198))
    champion = evaluation(first(100), format_ok=first(200))
    assert decide(challenger, champion, policy).is_promoted


def test_canary_pass_is_refused() -> None:
    challenger = evaluation(first(160), canary_pass_rate=0.05)
    decision = decide(challenger, evaluation(first(100)), POLICY)
    assert not decision.is_promoted
    assert decision.reasons == [
        "the challenger passed 5.00% of canary items, which no honest answer passes: "
        "it games the verifier"
    ]


def test_unmeasured_canaries_are_noted_and_block_only_when_required() -> None:
    challenger = evaluation(first(160), canary_pass_rate=None)
    champion = evaluation(first(100))
    decision = decide(challenger, champion, POLICY)
    assert decision.is_promoted
    assert decision.evidence["canary"]["is_measured"] is False
    strict = GatePolicy(primary_metric="pass@1", is_canary_required=True)
    assert not decide(challenger, champion, strict).is_promoted


def test_too_few_items_is_refused() -> None:
    decision = decide(evaluation(first(10, 12)), evaluation(first(0, 12)), POLICY)
    assert not decision.is_promoted
    assert decision.reasons == [
        "only 12 items were scored on pass@1; the gate needs at least 30 (its min_items): add "
        "eval data (new groups fill eval first up to the domain's dataset.min_eval_items), "
        "lower the domain's gate.min_items for a pilot, or promote anyway with "
        "`flywheel models promote --force`"
    ]
    assert decision.evidence["primary"]["passed"] is False
    assert decision.evidence["item_count"] == 12
    assert decision.evidence["policy"]["min_items"] == 30


def test_first_adapter_is_judged_against_the_base_model_the_same_way() -> None:
    base = evaluation(first(60))
    assert decide(evaluation(first(140)), base, POLICY).is_promoted
    assert not decide(evaluation(first(60)), base, POLICY).is_promoted


def test_evidence_is_json_and_deterministic() -> None:
    challenger, champion = slice_regression()
    policy = GatePolicy(primary_metric="pass@1", secondary_metrics=("format_ok",), seed=3)
    challenger = Evaluation(
        metrics={**challenger.metrics, "format_ok": scores(first(400, 400))},
        slices=challenger.slices,
        canary_pass_rate=None,
    )
    champion = Evaluation(
        metrics={**champion.metrics, "format_ok": scores(first(400, 400))},
        slices=champion.slices,
        canary_pass_rate=0.0,
    )
    decision = decide(challenger, champion, policy)
    again = decide(challenger, champion, policy)
    assert decision == again
    stored = json.loads(json.dumps(decision.evidence))
    assert stored == decision.evidence
    assert stored["seed"] == 3
    assert stored["item_count"] == 400
    assert stored["policy"]["secondary_metrics"] == ["format_ok"]
    assert stored["canary"] == {
        "is_measured": False,
        "challenger_pass_rate": None,
        "champion_pass_rate": 0.0,
        "passed": True,
    }


# Bad input.


def test_decide_refuses_different_item_sets() -> None:
    with pytest.raises(InvalidInput, match="same items"):
        decide(evaluation(first(160)), evaluation(first(100, 199)), POLICY)


def test_decide_refuses_a_missing_metric() -> None:
    policy = GatePolicy(primary_metric="pass@1", secondary_metrics=("format_ok",))
    challenger = evaluation(first(160), format_ok=first(200))
    with pytest.raises(InvalidInput, match="champion's evaluation has no format_ok"):
        decide(challenger, evaluation(first(100)), policy)


def test_decide_refuses_unlabelled_or_disagreeing_slices() -> None:
    slices = alternating_slices(200)
    unlabelled = {key: value for key, value in slices.items() if key != "item-0007"}
    relabelled = slices | {"item-0007": "feedback"}
    champion = evaluation(first(100), slices=slices)
    for wrong in (unlabelled, relabelled):
        with pytest.raises(InvalidInput, match="item-0007"):
            decide(evaluation(first(160), slices=wrong), champion, POLICY)


@pytest.mark.parametrize("score", [1.5, -0.1, float("nan"), float("inf")])
def test_scores_outside_0_1_are_refused(score: float) -> None:
    with pytest.raises(InvalidInput, match="scores are in"):
        evaluation([1.0, score])


@pytest.mark.parametrize(
    "overrides",
    [
        {"confidence": 1.0},
        {"bootstrap_samples": 10},
        {"secondary_tolerance": -0.1},
        {"min_slice_items": 0},
        {"secondary_metrics": ("pass@1",)},
        {"primary_metric": ""},
    ],
)
def test_bad_policies_are_refused(overrides: dict[str, object]) -> None:
    fields: dict[str, object] = {"primary_metric": "pass@1"} | overrides
    with pytest.raises(InvalidInput):
        GatePolicy(**fields)  # type: ignore[arg-type]


# The exact paired test of binary metrics, and slices from tags.


def test_four_wins_no_losses_of_thirty_are_refused_by_the_exact_test() -> None:
    # The bootstrap alone passed this: every resample without one of the 4 wins is rare.
    champion = first(10, 30)
    challenger = first(14, 30)
    decision = decide(evaluation(challenger), evaluation(champion), POLICY)
    primary = decision.evidence["primary"]
    assert primary["interval"]["low"] > 0
    assert not decision.is_promoted
    assert primary["exact_test"] == {
        "wins": 4,
        "losses": 0,
        "p_value": pytest.approx(0.0625),
        "level": pytest.approx(0.025),
        "passed": False,
    }
    assert decision.reasons == [
        "pass@1 did not improve significantly by the exact sign test: 4 wins, 0 losses, "
        "one-sided p = 0.0625 > 0.025"
    ]


def test_six_clean_wins_pass_the_exact_test() -> None:
    decision = decide(evaluation(first(16, 30)), evaluation(first(10, 30)), POLICY)
    assert decision.evidence["primary"]["exact_test"]["p_value"] == pytest.approx(1 / 64)
    assert decision.is_promoted


def test_continuous_scores_have_no_exact_test() -> None:
    champion = evaluation([0.5] * 40)
    decision = decide(evaluation([0.75] * 40), champion, POLICY)
    assert decision.evidence["primary"]["exact_test"] is None
    assert decision.is_promoted


def tagged(n: int, tag_of: dict[int, str]) -> dict[str, list[str]]:
    return {f"item-{i:04d}": ["source:feedback", *([tag_of[i]] if i in tag_of else [])]
            for i in range(n)}  # fmt: skip


def demo_like_drop(losses: int) -> tuple[Evaluation, Evaluation, dict[str, list[str]]]:
    """200 items: 120 carries the challenger learns (0.0 -> 0.5), 80 no-carry sums the base
    solved (1.00) of which the challenger loses `losses`."""
    slices = tagged(200, {i: "skill:carry" if i < 120 else "skill:no-carry" for i in range(200)})
    champion = [False] * 120 + [True] * 80
    challenger = [i < 60 for i in range(120)] + [i >= losses for i in range(80)]
    return evaluation(challenger, slices=slices), evaluation(champion, slices=slices), slices


def test_judged_slice_dropping_beyond_its_tolerance_fails_the_gate() -> None:
    # 1.00 -> 0.90 on 80 no-carry items: 8 losses, 0 wins, p = 2^-8 < 0.05 / (2 * 3).
    challenger, champion, _ = demo_like_drop(8)
    decision = decide(challenger, champion, POLICY)
    assert decision.evidence["primary"]["passed"]
    assert not decision.is_promoted
    by_slice = {entry["slice"]: entry for entry in decision.evidence["slices"]}
    no_carry = by_slice["skill:no-carry"]
    assert (no_carry["champion_mean"], no_carry["challenger_mean"]) == (1.0, 0.9)
    assert (no_carry["n"], no_carry["judged"], no_carry["regressed"]) == (80, True, True)
    assert no_carry["drop_test"]["losses"] == 8
    assert no_carry["drop_test"]["level"] == pytest.approx(0.05 / 6)
    assert not by_slice["skill:carry"]["regressed"]
    assert decision.reasons == [
        "slice 'skill:no-carry' regressed on pass@1: 1.0000 -> 0.9000 on 80 items (8 losses, "
        "0 wins, one-sided p = 0.0039), a drop beyond its tolerance of 0.0000"
    ]


def test_a_drop_within_the_slice_tolerance_is_allowed() -> None:
    challenger, champion, _ = demo_like_drop(8)
    lenient = GatePolicy(primary_metric="pass@1", slice_tolerances={"skill:no-carry": 0.1})
    decision = decide(challenger, champion, lenient)
    assert decision.is_promoted
    no_carry = next(e for e in decision.evidence["slices"] if e["slice"] == "skill:no-carry")
    assert no_carry["tolerance"] == 0.1
    assert decision.evidence["policy"]["slice_tolerances"] == {"skill:no-carry": 0.1}


def test_noise_level_changes_on_slices_do_not_veto() -> None:
    # Every slice moves a little either way (3 lost, 1 won on no-carry: p = 0.31); the
    # overall gain is clear, so it is promoted.
    challenger, champion, slices = demo_like_drop(3)
    new = dict(challenger.metrics["pass@1"]) | {"item-0199": 1.0}
    old = dict(champion.metrics["pass@1"]) | {"item-0199": 0.0}
    decision = decide(
        Evaluation({"pass@1": new}, slices, 0.0), Evaluation({"pass@1": old}, slices, 0.0), POLICY
    )
    assert decision.is_promoted
    assert not any(entry["regressed"] for entry in decision.evidence["slices"])


def test_items_belong_to_every_slice_they_are_labelled_with() -> None:
    challenger, champion, _ = demo_like_drop(0)
    decision = decide(challenger, champion, POLICY)
    counts = {entry["slice"]: entry["n"] for entry in decision.evidence["slices"]}
    assert counts == {"skill:carry": 120, "skill:no-carry": 80, "source:feedback": 200}
    assert decision.evidence["slice_confidence"] == pytest.approx(1 - 0.05 / 3)
    for entry in decision.evidence["slices"]:
        assert {"champion_mean", "challenger_mean", "n", "judged", "tolerance", "regressed"} <= set(
            entry
        )


def test_a_gate_config_naming_an_unknown_slice_is_refused() -> None:
    challenger, champion, _ = demo_like_drop(0)
    policy = GatePolicy(primary_metric="pass@1", slice_tolerances={"skill:division": 0.05})
    with pytest.raises(InvalidInput) as raised:
        decide(challenger, champion, policy)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("the gate config names slices no eval item has: ['skill:division']")


@pytest.mark.parametrize("tolerance", [-0.1, 1.5, "0.1", True])
def test_bad_slice_tolerances_are_refused(tolerance: object) -> None:
    with pytest.raises(InvalidInput, match="tolerances are numbers in"):
        GatePolicy(primary_metric="pass@1", slice_tolerances={"skill:carry": tolerance})  # type: ignore[dict-item]
