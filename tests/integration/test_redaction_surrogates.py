"""Redaction on the paths that store training signal: what a model would learn from is a
realistic surrogate, never the person's name and never a `<NAME>` placeholder; the same
person is the same surrogate throughout a record; content hashes stay deterministic."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.models import Domain
from flywheel.signals.candidates import Provenance, SftCandidate, TaskCandidate
from flywheel.signals.content import content_sha256
from flywheel.signals.models import LabeledCompletion, SftExample, VerifiableTask
from flywheel.signals.store import store_candidates
from tests.conftest import Caller
from tests.integration.test_compile import Feedback, pairs

PLACEHOLDER = re.compile(r"<[A-Z_]+>")
GREETING = re.compile(r"^Hi ([A-Z][a-z]+) ([A-Z][a-z]+),")
PROMPT = [
    {
        "role": "user",
        "content": "Hello, my name is Maria Lopez and I was charged twice. "
        "Reach me at maria.lopez@acme.io or (415) 555-0132.",
    }
]
ANSWER = "Hi Maria Lopez, I am sorry about that. Maria, the refund is on its way."


@pytest.fixture
def feedback(sessions: sessionmaker[Session], acme: Caller) -> Feedback:
    return Feedback(sessions, acme)


def assert_surrogated(text: str) -> tuple[str, str]:
    """`text` greets someone who is not Maria Lopez, with no placeholder: who it greets."""
    assert "Maria" not in text, text
    assert "Lopez" not in text, text
    assert PLACEHOLDER.search(text) is None, text
    greeting = GREETING.match(text)
    assert greeting is not None, text
    return greeting.group(1), greeting.group(2)


def test_a_corrected_answer_compiles_to_an_sft_completion_with_a_surrogate_name(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    answer = feedback.interaction("Refunds take a week.", PROMPT)
    feedback.event("correction", {"text": ANSWER}, on=answer, rater="u1")

    feedback.compile()

    with sessions() as session:
        example = session.scalars(select(SftExample)).one()
    first, last = assert_surrogated(example.completion)
    assert f"{first}, the refund" in example.completion  # "Maria" alone: the same surrogate
    prompt = example.messages[0]["content"]
    assert f"my name is {first} {last} and" in prompt  # the same person across the record
    assert "maria" not in prompt.lower(), prompt
    assert PLACEHOLDER.search(prompt) is None, prompt
    assert "(415) 555-0132" not in prompt  # the last digits may repeat, by chance
    assert "acme.io" not in prompt
    assert example.redaction_report == {"NAME": 3, "EMAIL": 1, "PHONE": 1}
    assert example.content_sha256 == content_sha256("sft", example.messages, example.completion)


def test_compiling_the_same_feedback_twice_stores_the_same_surrogates(
    feedback: Feedback, sessions: sessionmaker[Session], acme: Caller
) -> None:
    bad = feedback.interaction("Hi Maria Lopez, no refund for you.", PROMPT)
    feedback.thumbs(bad, up=False, rater="u1")
    feedback.compile()
    with sessions() as session:
        first = session.scalars(select(LabeledCompletion)).one()
        first_values = (first.completion, first.messages, first.content_sha256)

    again = Feedback(sessions, acme)
    again.compile()  # nothing new: the same content hash is already there
    with sessions() as session:
        stored = session.scalars(select(LabeledCompletion)).all()
    assert [(row.completion, row.messages, row.content_sha256) for row in stored] == [first_values]
    assert_surrogated(first.completion)


def test_answers_that_differ_only_in_a_name_still_make_no_pair(
    feedback: Feedback, sessions: sessionmaker[Session]
) -> None:
    """What tells two responses apart is the text with typed placeholders, not surrogates."""
    feedback.thumbs(feedback.interaction("Hi Maria Lopez, done."), up=True, rater="u1")
    feedback.thumbs(feedback.interaction("Hi Jane Doe, done."), up=False, rater="u2")

    feedback.compile()

    assert pairs(sessions) == []


def store(
    sessions: sessionmaker[Session], caller: Caller, *candidates: SftCandidate | TaskCandidate
) -> None:
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        store_candidates(
            session=session,
            tenant_id=caller.tenant_id,
            domain_id=domain_id,
            candidates=list(candidates),
            ingestor_version="test",
        )


def ticket(thread: str, completion: str = ANSWER) -> SftCandidate:
    return SftCandidate(
        Provenance("ticket", f"zendesk:{thread}", group_key=f"zendesk:{thread}"),
        messages=PROMPT,
        completion=completion,
    )


def test_an_ingested_sft_example_has_surrogates_consistent_within_its_thread(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    store(sessions, acme, ticket("4711"), ticket("4712"))

    with sessions() as session:
        rows = {row.group_key: row for row in session.scalars(select(SftExample))}
    first, last = assert_surrogated(rows["zendesk:4711"].completion)
    assert f"my name is {first} {last} and" in rows["zendesk:4711"].messages[0]["content"]
    assert rows["zendesk:4711"].redaction_report == {"NAME": 3, "EMAIL": 1, "PHONE": 1}
    assert "maria" not in str(rows["zendesk:4711"].redaction_report).lower()
    # The same customer in another thread gets a surrogate of its own (not linkable).
    other = rows["zendesk:4712"]
    assert_surrogated(other.completion)
    assert other.content_sha256 != rows["zendesk:4711"].content_sha256


def test_storing_the_same_ticket_again_finds_it_a_duplicate(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    store(sessions, acme, ticket("4711"))
    store(sessions, acme, ticket("4711"))

    with sessions() as session:
        assert len(session.scalars(select(SftExample)).all()) == 1


def test_a_name_found_in_one_text_of_a_ticket_is_replaced_in_its_other_texts(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """ "Maria" alone, mid-sentence, is no name by itself; the prompt said who she is."""
    store(sessions, acme, ticket("4713", "Sorry about that: as Maria noted, the order is late."))

    with sessions() as session:
        example = session.scalars(select(SftExample)).one()
    first = re.search(r"my name is (\w+) ", example.messages[0]["content"])
    assert first is not None
    assert example.completion == f"Sorry about that: as {first[1]} noted, the order is late."


def test_a_code_task_keeps_the_names_its_tests_expect(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """Test data in code names people a test expects back: free-text names are not looked for
    there (e-mail addresses and secrets still are)."""
    tests = 'assert initials("Maria Lopez") == "ML"\nassert initials("Hi Jane Doe") == "HJD"\n'
    task = TaskCandidate(
        Provenance("repository", "repo@1:m.py::initials", group_key="repo"),
        prompt='def initials(name):\n    """Initials of `name` (ask ops@acme.io)."""\n',
        entry_point="initials",
        reference_solution="def initials(name):\n    return ''.join(w[0] for w in name.split())\n",
        hidden_tests=tests,
    )
    store(sessions, acme, task)

    with sessions() as session:
        stored = session.scalars(select(VerifiableTask)).one()
    assert stored.hidden_tests == tests
    assert "ops@acme.io" not in stored.prompt
    assert stored.redaction_report == {"EMAIL": 1}


def test_an_ingested_tool_call_is_redacted_inside_its_arguments_with_the_threads_surrogate(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    import orjson

    messages = [
        {"role": "user", "content": "I am Maria Lopez, resend my receipt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "send_receipt",
                        "arguments": '{"customer": "Maria Lopez", "copies": 2}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sent to Maria Lopez"},
    ]
    candidate = SftCandidate(
        provenance=Provenance(
            source_kind="ticket",
            source_ref="zendesk:99",
            group_key="zendesk:99",
            names=("Maria Lopez",),
        ),
        messages=messages,
        completion="Hi Maria Lopez, done.",
    )
    store(sessions, acme, candidate)

    with sessions() as session:
        row = session.scalars(select(SftExample)).one()
    first, last = assert_surrogated(row.completion)
    arguments = orjson.loads(row.messages[1]["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"customer": f"{first} {last}", "copies": 2}
    assert row.messages[2]["content"] == f"sent to {first} {last}"
    assert row.messages[0]["content"] == f"I am {first} {last}, resend my receipt"
    assert "Maria" not in orjson.dumps(row.messages).decode()
