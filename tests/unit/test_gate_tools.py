"""Tool-call and environment metrics through the promotion gate: sliced per tool and per
environment by the BFCL importer's tags, a candidate worse on one tool's (or environment's)
slice refused though better overall, the tool metrics as secondary ones, losses never gated."""

from __future__ import annotations

import pytest

from flywheel.errors import InvalidInput
from flywheel.evaluation.gate import Evaluation, GatePolicy, decide
from flywheel.evaluation.readiness import eval_readiness
from flywheel.evaluation.service import _policy
from flywheel.evaluation.slices import item_slices


def labelled(prefix: str, counts: dict[str, int]) -> list[dict[str, object]]:
    """Eval items as `version_item_labels` yields them, tagged as BFCL's are imported."""
    rows: list[dict[str, object]] = []
    for name, count in counts.items():
        rows += [
            {
                "item_id": f"{name}-{index:03d}",
                "source_kind": "task_file",
                "tags": ["bfcl.category:simple", f"{prefix}:{name}"],
                "prompt": "...",
                "difficulty": None,
            }
            for index in range(count)
        ]
    return rows


def scores(passing: dict[str, int], counts: dict[str, int]) -> dict[str, float]:
    """Per item: the first `passing[name]` items of each group pass."""
    return {
        f"{name}-{index:03d}": 1.0 if index < passing[name] else 0.0
        for name, count in counts.items()
        for index in range(count)
    }


CASES = [
    ("call_accuracy", "tool", {"lookup_order": 60, "refund_order": 40}),
    ("environment_success", "environment", {"GorillaFileSystem": 60, "TicketAPI": 40}),
]


@pytest.mark.parametrize(("metric", "prefix", "counts"), CASES)
def test_a_candidate_worse_on_one_slice_is_refused_though_better_overall(
    metric: str, prefix: str, counts: dict[str, int]
) -> None:
    slices = item_slices(labelled(prefix, counts), {})
    broad, narrow = counts  # 60 items, 40 items
    assert set(slices[f"{narrow}-000"]) == {
        "bfcl.category:simple",
        f"{prefix}:{narrow}",
        "source:task_file",
    }
    policy = GatePolicy(primary_metric=metric)
    champion = Evaluation({metric: scores({broad: 30, narrow: 40}, counts)}, slices, 0.0)
    # 30 items better on the broad slice, 10 worse on the narrow one: better overall
    worse = Evaluation({metric: scores({broad: 60, narrow: 30}, counts)}, slices, 0.0)
    decision = decide(worse, champion, policy)
    assert not decision.is_promoted
    assert decision.evidence["primary"]["passed"]  # the overall gain is significant
    [reason] = decision.reasons
    assert reason.startswith(f"slice '{prefix}:{narrow}' regressed on {metric}: 1.0000 -> 0.7500")
    judged = {row["slice"]: row["regressed"] for row in decision.evidence["slices"]}
    assert judged == {
        "bfcl.category:simple": False,
        f"{prefix}:{broad}": False,
        f"{prefix}:{narrow}": True,
        "source:task_file": False,
    }
    # the same gain without the slice's loss is promoted
    better = Evaluation({metric: scores({broad: 60, narrow: 40}, counts)}, slices, 0.0)
    assert decide(better, champion, policy).is_promoted


def test_the_tool_metrics_are_secondary_and_a_drop_in_argument_accuracy_refuses() -> None:
    counts = {"lookup_order": 60, "refund_order": 40}
    slices = item_slices(labelled("tool", counts), {})
    measured = ("call_accuracy", "name_accuracy", "argument_accuracy", "pass@1", "pass@k")
    policy = _policy({"primary_metric": "call_accuracy"}, {name: {} for name in measured})
    assert policy.secondary_metrics == ("argument_accuracy", "name_accuracy", "pass@1", "pass@k")
    # Both models fail every refund (an extra call each); the champion with the right
    # arguments, the challenger, which learnt the lookups, with half of them wrong.
    old = scores({"lookup_order": 30, "refund_order": 0}, counts)
    new = scores({"lookup_order": 60, "refund_order": 0}, counts)
    refunds_right = {item: 1.0 for item in old if item.startswith("refund")}
    refunds_half = dict.fromkeys(refunds_right, 0.5)

    def evaluation(calls: dict[str, float], refund_arguments: dict[str, float]) -> Evaluation:
        metrics = {
            "call_accuracy": calls,
            "name_accuracy": calls,
            "argument_accuracy": calls | refund_arguments,
            "pass@1": calls,
            "pass@k": calls,
        }
        return Evaluation(metrics, slices, 0.0)

    champion = evaluation(old, refunds_right)  # argument accuracy (30 + 40) / 100
    decision = decide(evaluation(new, refunds_half), champion, policy)  # (60 + 20) / 100
    assert decision.is_promoted
    decision = decide(evaluation(new, dict.fromkeys(refunds_right, 0.0)), champion, policy)
    assert decision.reasons == [
        "argument_accuracy regressed by 0.1000 (0.7000 -> 0.6000), beyond the tolerance of 0.0100"
    ]


def test_losses_are_never_a_primary_metric() -> None:
    with pytest.raises(InvalidInput, match="'turns_used' is a loss, reported but never gated"):
        _policy({"primary_metric": "turns_used"}, {"environment_success": {}})


@pytest.mark.parametrize("metric", ["call_accuracy", "argument_accuracy", "environment_success"])
def test_a_tool_metric_as_the_primary_counts_the_eval_tasks(metric: str) -> None:
    readiness = eval_readiness({"task": 40, "sft": 3}, {"primary_metric": metric})
    assert (readiness.metric, readiness.scored, readiness.is_short) == (metric, 40, False)
