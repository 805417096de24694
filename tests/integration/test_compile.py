"""The feedback compiler: every rule with the exact rows it writes, weights, conflicts,
incremental recompiles and retractions, tenant isolation. Runs on PostgreSQL and SQLite."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import orjson
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.errors import NotFound
from flywheel.models import (
    Domain,
    FeedbackEvent,
    IngestRun,
    Interaction,
    LabeledCompletion,
    PreferencePair,
    SftExample,
)
from flywheel.signals import content
from flywheel.signals.compile import COMPILER_VERSION, CompileReport, compile_feedback
from flywheel.signals.compile.evidence import SCORE
from flywheel.signals.compile.items import Texts, prompts
from flywheel.signals.compile.rules import decay, edit_precision
from flywheel.signals.content import content_sha256, digest, messages_digest, normalise_text
from tests.conftest import Caller, count_rows, make_caller

NOW = utcnow()
MESSAGES = [{"role": "user", "content": "What is the card fee?"}]
OTHER = [{"role": "user", "content": "How do I cancel?"}]


class Feedback:
    """Writes a tenant's interactions and events straight to the tables, stamped as told."""

    def __init__(self, sessions: sessionmaker[Session], caller: Caller) -> None:
        self.sessions = sessions
        self.tenant_id = caller.tenant_id
        with sessions() as session:
            self.domain_id = session.scalars(
                select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
            ).one()

    def interaction(self, response: str, messages: list[dict[str, str]] = MESSAGES) -> uuid.UUID:
        row = Interaction(
            tenant_id=self.tenant_id,
            domain_id=self.domain_id,
            messages=messages,
            response=response,
            request_sha256="",
        )
        with unit_of_work(self.sessions) as session:
            session.add(row)
        return row.id

    def event(
        self,
        kind: str,
        value: dict[str, Any],
        *,
        on: uuid.UUID | None = None,
        rater: str | None = None,
        at: datetime | None = None,
        messages: list[dict[str, str]] | None = None,
        response: str | None = None,
    ) -> uuid.UUID:
        row = FeedbackEvent(
            tenant_id=self.tenant_id,
            domain_id=self.domain_id,
            interaction_id=on,
            kind=kind,
            value=value,
            messages=messages,
            response=response,
            rater=rater,
            request_sha256="",
            created_at=at or utcnow(),
        )
        with unit_of_work(self.sessions) as session:
            session.add(row)
        return row.id

    def thumbs(self, on: uuid.UUID, up: bool, rater: str, at: datetime | None = None) -> None:
        self.event("rating", {"thumbs": "up" if up else "down"}, on=on, rater=rater, at=at)

    def compare(
        self, responses: list[str], preferred: int | None, rater: str, **kwargs: Any
    ) -> uuid.UUID:
        value: dict[str, Any] = {"messages": kwargs.pop("messages", MESSAGES)}
        value |= {"responses": responses}
        value |= {"tie": True} if preferred is None else {"preferred": preferred}
        return self.event("comparison", value, rater=rater, **kwargs)

    def compile(self) -> CompileReport:
        return compile_feedback(self.sessions, tenant_id=self.tenant_id)


@pytest.fixture
def feedback(sessions: sessionmaker[Session], acme: Caller) -> Feedback:
    return Feedback(sessions, acme)


def pairs(sessions: sessionmaker[Session]) -> list[tuple[str, str, str, float]]:
    with sessions() as session:
        rows = session.execute(
            select(
                PreferencePair.chosen,
                PreferencePair.rejected,
                PreferencePair.why,
                PreferencePair.weight,
            ).order_by(PreferencePair.chosen, PreferencePair.rejected)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def labels(sessions: sessionmaker[Session]) -> list[tuple[str, bool, str, float]]:
    with sessions() as session:
        rows = session.execute(
            select(
                LabeledCompletion.completion,
                LabeledCompletion.is_desirable,
                LabeledCompletion.why,
                LabeledCompletion.weight,
            ).order_by(LabeledCompletion.completion, LabeledCompletion.is_desirable)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def sft(sessions: sessionmaker[Session]) -> list[tuple[str, float]]:
    with sessions() as session:
        rows = session.execute(
            select(SftExample.completion, SftExample.weight).order_by(SftExample.completion)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def everything(sessions: sessionmaker[Session]) -> dict[str, list[tuple[Any, ...]]]:
    """Every column of every compiled row, for before/after comparisons."""
    found = {}
    with sessions() as session:
        for model in (PreferencePair, SftExample, LabeledCompletion):
            columns = list(model.__table__.columns)  # type: ignore[attr-defined]
            rows = session.execute(select(*columns).order_by(model.content_sha256))
            found[model.__tablename__] = [tuple(row) for row in rows]
    return found


# --- one rule at a time ----------------------------------------------------------------------


def test_a_correction_is_a_pair_over_the_original_and_an_sft_example(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.interaction("The fee is 5%.")
    feedback.event("correction", {"text": "The fee is 1.5%."}, on=answer, rater="u1")

    report = feedback.compile()

    # "The fee is " and "5%." are kept: 2 of 16 characters changed -> 1 - (2/16)/2
    assert edit_precision("The fee is 5%.", "The fee is 1.5%.") == 0.9375
    assert pairs(sessions) == [("The fee is 1.5%.", "The fee is 5%.", "correction", 0.9375)]
    assert sft(sessions) == [("The fee is 1.5%.", 0.9375)]
    assert labels(sessions) == []
    with sessions() as session:
        pair = session.scalars(select(PreferencePair)).one()
        example = session.scalars(select(SftExample)).one()
    assert pair.content_sha256 == content_sha256(
        "pair", MESSAGES, "The fee is 1.5%.", "The fee is 5%."
    )
    assert example.content_sha256 == content_sha256("sft", MESSAGES, "The fee is 1.5%.")
    assert pair.group_key == example.group_key == content_sha256("prompt", MESSAGES)
    assert (pair.source_kind, pair.ingestor_version) == ("feedback", COMPILER_VERSION)
    assert pair.source_ref == f"feedback:interaction/{answer}"
    assert pair.messages == MESSAGES
    assert (pair.redaction_report, pair.minhash, pair.duplicate_of_id) == ({}, None, None)
    counts = report.totals
    assert (counts.events_read, counts.groups, counts.pairs, counts.sft, counts.labels) == (
        1,
        1,
        1,
        1,
        0,
    )
    assert (counts.inserted, counts.updated, counts.retracted) == (2, 0, 0)


def test_a_comparison_prefers_one_response_and_a_tie_yields_nothing(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    event = feedback.compare(["Five percent.", "1.5% of the total."], preferred=1, rater="u1")
    feedback.compare(["Call us.", "Use the app."], preferred=None, rater="u1", messages=OTHER)

    report = feedback.compile()

    assert pairs(sessions) == [("1.5% of the total.", "Five percent.", "comparison", 1.0)]
    with sessions() as session:
        assert session.scalars(select(PreferencePair.source_ref)).one() == f"feedback:event/{event}"
    assert (report.totals.ties_dropped, report.totals.groups) == (1, 2)
    assert labels(sessions) == sft(sessions) == []


def test_a_comparison_of_three_prefers_one_over_each_other(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    feedback.compare(["a", "b", "c"], preferred=2, rater="u1")

    feedback.compile()

    assert pairs(sessions) == [("c", "a", "comparison", 1.0), ("c", "b", "comparison", 1.0)]


def test_ratings_of_two_responses_to_one_prompt_pair_the_higher_over_the_lower(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    good, bad = feedback.interaction("1.5%."), feedback.interaction("5%.")
    stars_good, stars_bad = feedback.interaction("1.5% per card."), feedback.interaction("Free.")
    feedback.thumbs(good, up=True, rater="u1")
    feedback.thumbs(bad, up=False, rater="u2")
    feedback.event("rating", {"stars": 5}, on=stars_good, rater="u1")
    feedback.event("rating", {"stars": 2}, on=stars_bad, rater="u3")

    feedback.compile()

    # means: 1.5%. 1, 5%. 0, 1.5% per card. 1, Free. 0.25; every two that differ make a pair
    # (a pair is as old as its newer side: microseconds older than the prompt's newest event)
    assert pairs(sessions) == [
        ("1.5% per card.", "5%.", "rating", pytest.approx(1.0)),
        ("1.5% per card.", "Free.", "rating", pytest.approx(0.75)),
        ("1.5%.", "5%.", "rating", pytest.approx(1.0)),
        ("1.5%.", "Free.", "rating", pytest.approx(0.75)),
        ("Free.", "5%.", "rating", pytest.approx(0.25)),
    ]
    assert labels(sessions) == []


def test_a_prompt_with_very_many_responses_pairs_only_its_most_rated(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    for index in range(40):
        answer = feedback.interaction(f"r{index:02d}")
        feedback.thumbs(answer, up=index % 2 == 1, rater="u1")

    report = feedback.compile()

    # all rated once: r00..r31 are paired (16 up x 16 down), r32..r39 labelled on their own
    assert report.totals.pairs == 16 * 16
    assert [(completion, good) for completion, good, _, _ in labels(sessions)] == [
        (f"r{index}", index % 2 == 1) for index in range(32, 40)
    ]


def test_a_lone_judgement_is_a_label_and_a_middling_one_is_nothing(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    feedback.thumbs(feedback.interaction("Fee?"), up=False, rater="u1")
    feedback.thumbs(feedback.interaction("Cancel online.", OTHER), up=True, rater="u1")
    third = [{"role": "user", "content": "Hours?"}]
    feedback.event("rating", {"stars": 3}, on=feedback.interaction("9 to 5.", third), rater="u1")

    report = feedback.compile()

    assert labels(sessions) == [
        ("Cancel online.", True, "rating", 1.0),
        ("Fee?", False, "rating", 1.0),
    ]
    assert pairs(sessions) == []
    with sessions() as session:
        label = session.scalars(
            select(LabeledCompletion).where(LabeledCompletion.completion == "Fee?")
        ).one()
    assert label.content_sha256 == content_sha256("label", MESSAGES, "Fee?", False)
    assert report.totals.groups == 3


def test_outcomes_label_alone_and_pair_success_over_failure(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    solved, failed = feedback.interaction("Reset it."), feedback.interaction("Wait.")
    feedback.event("outcome", {"success": True}, on=solved)
    feedback.event("outcome", {"success": False, "reason": "ticket reopened"}, on=failed)
    lone = feedback.interaction("Use the app.", OTHER)
    feedback.event("outcome", {"success": True}, on=lone, at=NOW - timedelta(hours=1))
    feedback.event("outcome", {"success": False, "reason": "reopened"}, on=lone)

    feedback.compile()

    assert pairs(sessions) == [("Reset it.", "Wait.", "outcome", 1.0)]
    # the latest outcome of a response stands: resolved, then reopened, is a failure
    assert labels(sessions) == [("Use the app.", False, "outcome", 1.0)]


def test_feedback_with_its_own_conversation_joins_the_interactions_of_that_prompt(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    feedback.thumbs(feedback.interaction("1.5%."), up=True, rater="u1")
    feedback.event("rating", {"thumbs": "down"}, messages=MESSAGES, response="5%.", rater="u2")

    report = feedback.compile()

    assert pairs(sessions) == [("1.5%.", "5%.", "rating", 1.0)]
    assert report.totals.groups == 1


def test_an_item_of_feedback_without_an_interaction_names_its_events(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    own = {"messages": MESSAGES, "response": "5%."}
    before = feedback.event("rating", {"thumbs": "up"}, rater="u1", at=NOW, **own)
    after = feedback.event("rating", {"thumbs": "down"}, rater="u1", **own)  # changed mind
    other = feedback.event("rating", {"thumbs": "down"}, rater="u2", **own)

    feedback.compile()

    assert labels(sessions) == [("5%.", False, "rating", pytest.approx(4 / 3))]
    first_of_u1 = min(str(before), str(after))  # a rater is named by their first event
    refs = sorted([f"event/{first_of_u1}", f"event/{other}"])
    with sessions() as session:
        assert session.scalars(select(LabeledCompletion.source_ref)).one() == (
            "feedback:" + ",".join(refs)
        )


def test_every_stored_text_is_redacted_and_counted(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    private = [{"role": "user", "content": "I am jane.doe@example.com: why the fee?"}]
    answer = feedback.interaction("Mail jane.doe@example.com or call (415) 555-0132.", private)
    feedback.thumbs(answer, up=False, rater="u1")

    feedback.compile()

    with sessions() as session:
        label = session.scalars(select(LabeledCompletion)).one()
    # Surrogates, not placeholders: the same address is the same surrogate in the record.
    mailed = re.fullmatch(
        r"Mail (\S+@(?:mail\.)?example\.\w+) or call \(\d{3}\) 555-01\d\d\.", label.completion
    )
    assert mailed is not None, label.completion
    assert label.messages == [{"role": "user", "content": f"I am {mailed[1]}: why the fee?"}]
    assert "jane" not in mailed[1]
    assert "(415) 555-0132" not in label.completion  # the last digits may repeat, by chance
    assert label.redaction_report == {"EMAIL": 2, "PHONE": 1}
    assert label.content_sha256 == content_sha256("label", label.messages, label.completion, False)
    assert label.group_key == content_sha256("prompt", private)  # the prompt, as sent


def test_responses_that_differ_only_in_what_redaction_removes_make_no_pair(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    feedback.thumbs(feedback.interaction("Write to a@example.com."), up=True, rater="u1")
    feedback.thumbs(feedback.interaction("Write to b@example.com."), up=False, rater="u2")

    report = feedback.compile()

    assert pairs(sessions) == []
    assert report.totals.pairs == 0


# --- weights ---------------------------------------------------------------------------------


def test_more_agreeing_raters_weigh_more_and_split_opinions_less(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    prompts = [[{"role": "user", "content": f"question {n}"}] for n in range(3)]
    for n, raters_up, raters_down in ((0, ["a"], ["b"]), (1, ["a", "b", "c"], ["d", "e", "f"])):
        good, bad = (
            feedback.interaction(f"good {n}", prompts[n]),
            feedback.interaction(f"bad {n}", prompts[n]),
        )
        for rater in raters_up:
            feedback.thumbs(good, up=True, rater=rater)
        for rater in raters_down:
            feedback.thumbs(bad, up=False, rater=rater)
    split = feedback.interaction("split 2", prompts[2])
    bad = feedback.interaction("bad 2", prompts[2])
    for rater, up in (("a", True), ("b", True), ("c", False)):
        feedback.thumbs(split, up=up, rater=rater)
    for rater in ("d", "e", "f"):
        feedback.thumbs(bad, up=False, rater=rater)

    feedback.compile()

    weights = {chosen: weight for chosen, _, _, weight in pairs(sessions)}
    # agreement 2n/(n+1): one rater a side 1.0, three 1.5; a 2-of-3 split keeps 2/3 of it
    assert weights == pytest.approx({"good 0": 1.0, "good 1": 1.5, "split 2": 1.0})


def test_older_evidence_weighs_less_halving_every_90_days(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    feedback.compare(["old a", "old b"], preferred=0, rater="u1", at=NOW - timedelta(days=180))
    feedback.compare(["new a", "new b"], preferred=0, rater="u1", at=NOW)

    feedback.compile()

    assert [(chosen, weight) for chosen, _, _, weight in pairs(sessions)] == [
        ("new a", 1.0),
        ("old a", pytest.approx(0.25)),
    ]
    assert decay(0) == 1.0


def test_a_small_correction_weighs_more_than_a_rewrite(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    small = feedback.interaction("Refunds take 5 days.")
    rewrite = feedback.interaction("No.", OTHER)
    feedback.event("correction", {"text": "Refunds take 3 days."}, on=small, rater="u1")
    feedback.event("correction", {"text": "Open Settings, then Cancel"}, on=rewrite, rater="u1")

    feedback.compile()

    weights = {chosen: weight for chosen, _, _, weight in pairs(sessions)}
    assert weights["Refunds take 3 days."] == pytest.approx(1 - 1 / 20 / 2)
    assert weights["Open Settings, then Cancel"] == pytest.approx(0.5)


# --- conflicts -------------------------------------------------------------------------------


def test_a_pair_judged_both_ways_goes_to_the_heavier_side_and_is_counted(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    # all at one instant: evidence even microseconds newer weighs more (decay), which
    # a slow machine turned into a 1e-9 win for c/d's later side
    for rater in ("u1", "u2"):
        feedback.compare(["a", "b"], preferred=0, rater=rater, at=NOW)
    feedback.compare(["a", "b"], preferred=1, rater="u3", at=NOW)
    feedback.compare(["c", "d"], preferred=0, rater="u1", messages=OTHER, at=NOW)
    feedback.compare(["c", "d"], preferred=1, rater="u2", messages=OTHER, at=NOW)

    report = feedback.compile()

    # two raters (4/3) against one (1): a over b by the difference; c/d evenly split: dropped
    assert pairs(sessions) == [
        ("a", "b", "comparison; outweighed comparison", pytest.approx(1 / 3))
    ]
    assert (report.totals.conflicts, report.totals.conflicts_dropped) == (2, 1)


def test_a_conflict_across_kinds_is_settled_by_evidence_weight(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    good, bad = feedback.interaction("good"), feedback.interaction("bad")
    for rater in ("u1", "u2", "u3"):
        feedback.thumbs(good, up=True, rater=rater)
        feedback.thumbs(bad, up=False, rater=rater)
    feedback.compare(["good", "bad"], preferred=1, rater="u4")

    report = feedback.compile()

    assert pairs(sessions) == [("good", "bad", "rating; outweighed comparison", pytest.approx(0.5))]
    assert report.totals.conflicts == 1


def test_a_raters_latest_judgement_replaces_their_earlier_one(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.interaction("5%.")
    feedback.thumbs(answer, up=True, rater="u1", at=NOW - timedelta(minutes=5))
    feedback.thumbs(answer, up=False, rater="u1", at=NOW)

    feedback.compile()

    assert labels(sessions) == [("5%.", False, "rating", 1.0)]


# --- incremental -----------------------------------------------------------------------------


def test_compiling_twice_adds_and_changes_nothing(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    good, bad = feedback.interaction("1.5%."), feedback.interaction("5%.")
    feedback.thumbs(good, up=True, rater="u1")
    feedback.thumbs(bad, up=False, rater="u2")
    feedback.event("correction", {"text": "It is 1.5%."}, on=bad, rater="u3")
    feedback.compare(["x", "y"], preferred=0, rater="u1", messages=OTHER)
    first = feedback.compile()
    before = everything(sessions)

    second = feedback.compile()

    assert first.totals.inserted == 4  # three pairs and an SFT example
    assert (second.totals.inserted, second.totals.updated, second.totals.retracted) == (0, 0, 0)
    assert everything(sessions) == before
    with sessions() as session:
        runs = session.scalars(select(IngestRun).order_by(IngestRun.created_at)).all()
    assert [(run.source_kind, run.source_format, run.status) for run in runs] == [
        ("feedback", "compile", "succeeded")
    ] * 2
    assert runs[1].counts["inserted"] == 0
    assert runs[1].checkpoint == runs[0].checkpoint


def test_a_late_event_flips_the_pair_and_retracts_the_one_it_no_longer_supports(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    good, bad = feedback.interaction("1.5%."), feedback.interaction("5%.")
    feedback.thumbs(good, up=True, rater="u1")
    feedback.thumbs(bad, up=False, rater="u2")
    feedback.thumbs(feedback.interaction("Online.", OTHER), up=True, rater="u1")
    feedback.compile()
    untouched = everything(sessions)["labeled_completions"]

    for rater in ("u3", "u4"):
        feedback.thumbs(good, up=False, rater=rater)
        feedback.thumbs(bad, up=True, rater=rater)
    report = feedback.compile()

    # means now 1/3 and 2/3, three raters each: margin 1/3 x agreement 1.5
    assert pairs(sessions) == [
        ("1.5%.", "5%.", "retracted: rating", 0.0),
        ("5%.", "1.5%.", "rating", pytest.approx(0.5)),
    ]
    assert (report.totals.inserted, report.totals.retracted) == (1, 1)
    assert everything(sessions)["labeled_completions"] == untouched


def test_a_supported_again_item_comes_back_and_changed_weights_are_updated(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    feedback.compare(["a", "b"], preferred=0, rater="u1")
    feedback.compile()
    feedback.compare(["a", "b"], preferred=1, rater="u1")  # u1 changed their mind
    feedback.compile()
    assert pairs(sessions) == [
        ("a", "b", "retracted: comparison", 0.0),
        ("b", "a", "comparison", 1.0),
    ]

    feedback.compare(["a", "b"], preferred=0, rater="u1")
    feedback.compare(["a", "b"], preferred=0, rater="u2")
    report = feedback.compile()

    assert pairs(sessions) == [
        ("a", "b", "comparison", pytest.approx(4 / 3)),
        ("b", "a", "retracted: comparison", 0.0),
    ]
    assert (report.totals.inserted, report.totals.updated, report.totals.retracted) == (0, 1, 1)


def test_an_outweighed_correction_retracts_its_sft_example(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.interaction("5%.")
    feedback.event("correction", {"text": "1.5%."}, on=answer, rater="u1")
    feedback.compile()
    assert sft(sessions) == [("1.5%.", pytest.approx(0.8))]  # 2 of 5 characters changed

    for rater in ("u2", "u3"):
        feedback.compare(["5%.", "1.5%."], preferred=0, rater=rater)
    feedback.compile()

    assert sft(sessions) == [("1.5%.", 0.0)]
    assert pairs(sessions) == [
        ("1.5%.", "5%.", "retracted: correction", 0.0),
        ("5%.", "1.5%.", "comparison; outweighed correction", pytest.approx(4 / 3 - 0.8)),
    ]


def test_only_prompts_with_new_events_are_recompiled(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    first = feedback.interaction("Fee?")
    feedback.thumbs(first, up=False, rater="u1", at=NOW - timedelta(hours=2))
    second = feedback.interaction("Online.", OTHER)
    feedback.thumbs(second, up=True, rater="u1", at=NOW - timedelta(hours=1))
    feedback.compile()  # watermark: an hour ago; the two-hour-old prompt is now settled

    feedback.thumbs(second, up=True, rater="u2")
    report = feedback.compile()

    assert (report.totals.groups, report.totals.events_read) == (1, 2)
    assert (report.totals.updated, report.totals.inserted) == (1, 0)
    assert labels(sessions) == [
        ("Fee?", False, "rating", 1.0),
        ("Online.", True, "rating", pytest.approx(4 / 3)),
    ]


def test_a_recompile_reads_every_event_of_a_touched_prompt_however_it_names_the_prompt(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    """Through its interaction, with its own conversation, or as a comparison on an
    interaction with or without a conversation of its own: a missed one would be retracted."""
    earlier = NOW - timedelta(hours=3)
    fee = feedback.interaction("Fee?")
    feedback.thumbs(fee, up=False, rater="u1", at=earlier)
    feedback.event(
        "rating", {"thumbs": "up"}, rater="u2", at=earlier, messages=MESSAGES, response="Own."
    )
    feedback.compare(["Fee?", "Ask us."], 1, rater="u3", on=fee, at=earlier)
    feedback.event(
        "comparison",
        {"responses": ["Free.", "Fee?"], "preferred": 0},
        on=fee,
        rater="u4",
        at=earlier,
    )
    other = feedback.interaction("Online.", OTHER)
    # the watermark: this prompt is revisited too (its event lies within REVISIT of it)
    feedback.thumbs(other, up=True, rater="u1", at=NOW - timedelta(hours=1))
    first = feedback.compile()
    before = pairs(sessions)

    feedback.thumbs(fee, up=False, rater="u5")
    report = feedback.compile()

    assert (report.totals.groups, report.totals.events_read) == (2, 5 + 1)
    assert report.totals.retracted == 0
    assert first.totals.pairs == len(before) == 3
    assert [pair[:3] for pair in pairs(sessions)] == [pair[:3] for pair in before]
    assert all(pair[3] > 0 for pair in pairs(sessions))


# --- runs, tenants, progress -----------------------------------------------------------------


def test_compiling_acme_never_touches_globex(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    globex = Feedback(sessions, make_caller(sessions, tenant="globex"))
    globex.thumbs(globex.interaction("Globex answer."), up=False, rater="g1")
    feedback.thumbs(feedback.interaction("Acme answer."), up=True, rater="a1")

    report = feedback.compile()

    assert [item.domain for item in report.domains] == ["billing"]
    assert labels(sessions) == [("Acme answer.", True, "rating", 1.0)]
    with sessions() as session:
        runs = session.scalars(select(IngestRun.tenant_id)).all()
    assert runs == [feedback.tenant_id]

    globex.compile()

    with sessions() as session:
        tenants = session.scalars(
            select(LabeledCompletion.tenant_id).order_by(LabeledCompletion.completion)
        ).all()
    assert tenants == [feedback.tenant_id, globex.tenant_id]


def test_a_domain_of_another_tenant_is_not_found(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    globex = Feedback(sessions, make_caller(sessions, tenant="globex"))

    with pytest.raises(NotFound):
        compile_feedback(sessions, tenant_id=feedback.tenant_id, domain_id=globex.domain_id)

    assert count_rows(sessions, "ingest_runs") == 0


def test_a_failed_compile_writes_nothing_and_is_recorded(
    feedback: Feedback, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    feedback.thumbs(feedback.interaction("5%."), up=False, rater="u1")

    def broken(*args: object) -> None:
        raise RuntimeError("judge broke")

    monkeypatch.setattr("flywheel.signals.compile.compiler.judge", broken)
    with pytest.raises(RuntimeError, match="judge broke"):
        feedback.compile()

    assert count_rows(sessions, "labeled_completions") == 0
    with sessions() as session:
        run = session.scalars(select(IngestRun)).one()
    assert (run.status, run.error) == ("failed", "RuntimeError('judge broke')")


def test_progress_counts_every_prompt(feedback: Feedback) -> None:
    for n in range(3):
        prompt = [{"role": "user", "content": f"q{n}"}]
        feedback.thumbs(feedback.interaction("a", prompt), up=True, rater="u1")
    seen: list[int] = []

    compile_feedback(feedback.sessions, tenant_id=feedback.tenant_id, progress=seen.append)

    assert sum(seen) == 3


def test_hashes_from_normalised_parts_are_the_content_hashes() -> None:
    """The compiler hashes cached normalised texts; `content_sha256` normalises raw ones."""
    fullwidth = "\uff46\uff55\uff4c\uff4c width \r\n"  # NFKC: "full width"
    messages = [{"role": "user", "content": " Tab\tand\r\nCRLF \n\n", "name": fullwidth}]
    row = (1, orjson.dumps(messages).decode(), SCORE, "ok", None, 1, 4, 0, 1, [])
    texts = Texts()

    prompt = next(prompts([row], texts))

    assert prompt.group_key == content_sha256("prompt", messages)
    assert digest("label", prompt.normal_messages, texts(fullwidth).normal, True) == (
        content_sha256("label", messages, fullwidth, True)
    )
    assert messages_digest("label", prompt.normal_json, texts(fullwidth).normal, True) == (
        content_sha256("label", messages, fullwidth, True)
    )


@pytest.mark.parametrize(
    "raw",
    [" plain ascii \t", "two\nlines ", "crlf\r\n", "\x1f unit separator\x1c", "caf\u00e9 ", ""],
)
def test_the_normalising_shortcut_equals_the_full_normalisation(raw: str) -> None:
    assert normalise_text(raw) == content._normalise_fully(raw)


def test_redaction_reaches_tool_call_arguments_and_tool_results_with_one_surrogate(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": "Resend my receipt to jane.doe@example.com"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "send_receipt",
                        "arguments": '{"to": "jane.doe@example.com", "copies": 1}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sent to jane.doe@example.com"},
    ]
    answer = feedback.interaction("Done.", conversation)  # type: ignore[arg-type]
    feedback.thumbs(answer, up=False, rater="u1")

    feedback.compile()

    with sessions() as session:
        label = session.scalars(select(LabeledCompletion)).one()
    stored = label.messages
    arguments = orjson.loads(stored[1]["tool_calls"][0]["function"]["arguments"])
    surrogate = arguments["to"]
    assert "jane" not in orjson.dumps(stored).decode()
    assert re.fullmatch(r"\S+@(?:mail\.)?example\.\w+", surrogate), surrogate
    assert arguments["copies"] == 1
    assert stored[0]["content"] == f"Resend my receipt to {surrogate}"
    assert stored[2] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": f"sent to {surrogate}",
    }
    assert stored[1]["tool_calls"][0]["function"]["name"] == "send_receipt"
    assert stored[1]["content"] is None
    assert label.redaction_report == {"EMAIL": 3}
    assert label.group_key == content_sha256("prompt", conversation)
