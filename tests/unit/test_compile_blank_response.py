"""A model that answered nothing (or only whitespace) and was corrected: the correction
teaches the corrected text, but no pair has a blank side (a dataset export refuses one, and
a demo cycle once failed on it: "rejected must be a non-empty string")."""

from __future__ import annotations

import pytest

from flywheel.signals.compile.rules import PromptEvidence, Votes, judge


@pytest.mark.parametrize("blank", ["", "\n", "  "])
def test_a_corrected_blank_answer_is_an_sft_example_and_no_pair(blank: str) -> None:
    evidence = PromptEvidence(
        texts={blank: blank, "41": "41"},
        corrections={(blank, "41"): Votes(raters=1, newest_us=1, refs=["e1"])},
    )

    verdicts = judge(evidence)

    assert verdicts.pairs == []
    assert [example.completion for example in verdicts.sft] == ["41"]
