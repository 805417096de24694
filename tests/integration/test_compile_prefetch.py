"""Redaction beside the compiler (`prefetch`): a child process finds the spans of the compiled
domain's texts only, on a connection of its own; what it finds changes no stored item, and a
child that fails costs only its head start."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import utcnow
from flywheel.models import Domain, LabeledCompletion, PreferencePair, SftExample
from flywheel.redaction import find_spans
from flywheel.signals.compile import compile_feedback, prefetch
from flywheel.signals.compile.items import Texts
from flywheel.signals.spans_ahead import text_digest
from flywheel.tenancy import service as tenancy
from tests.conftest import Caller, make_caller
from tests.integration.test_compile import Feedback

QUESTION = "Hi, I am Maria Lopez, call me at (415) 555-0132 about my refund."
ANSWER = "Dear Maria Lopez, the refund of order 7 went out today."
FIXED = "Dear Maria Lopez, the refund of order 7 went out today; write to maria@acme.io."
OTHER_TENANT = "Globex only: reach Priya Okafor at priya@globex.io"
AT = utcnow() - timedelta(days=3)


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def _feed(feedback: Feedback) -> None:
    """A rating, a correction and a comparison, all about PII-laden texts, stamped alike."""
    first = feedback.interaction(ANSWER, _messages(QUESTION))
    second = feedback.interaction("Refund sent.", _messages(QUESTION))
    feedback.thumbs(first, True, "u-1", at=AT)
    feedback.thumbs(second, False, "u-2", at=AT)
    feedback.event("correction", {"text": FIXED}, on=second, rater="u-3", at=AT)
    other = "Ask Maria Lopez at +44 20 7946 0958."
    feedback.compare([ANSWER, other], 0, "u-4", messages=_messages(QUESTION), at=AT)


@pytest.fixture
def any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child starts for compiles of any size (these domains are tiny)."""
    monkeypatch.setattr(prefetch, "AHEAD_MIN_EVENTS", 0)


def _finished(run: prefetch.Prefetch) -> dict[bytes, Any]:
    """What the child sent, once it has read and sent everything."""
    assert run.child is not None
    assert run.child.process.wait(60) == 0
    run.child.reader.join(60)
    return dict(run.texts.ahead)


def _prefetched(engine: Engine, caller: Caller, sessions: sessionmaker[Session]) -> Any:
    with sessions() as session:
        domain_id = session.scalars(select(Domain.id).where(Domain.tenant_id == caller.tenant_id))
        texts = Texts()
        run = prefetch.Prefetch(
            engine, texts, caller.tenant_id, domain_id.one(), full=True, events=0
        )
        with run:
            found = _finished(run)
    assert texts.ahead == {}  # emptied once the compile is over
    return found


@pytest.mark.postgres_only
@pytest.mark.usefixtures("any_size")
@pytest.mark.commits("the child reads on a connection of its own")
def test_the_child_finds_the_compiled_domains_texts_only(
    sessions: sessionmaker[Session], committing_engine: Engine
) -> None:
    acme, globex = make_caller(sessions), make_caller(sessions, tenant="globex")
    _feed(Feedback(sessions, acme))
    other = Feedback(sessions, globex)
    other.interaction(OTHER_TENANT, _messages(OTHER_TENANT))

    found = _prefetched(committing_engine, acme, sessions)

    expected = {QUESTION, "Be brief.", ANSWER, "Refund sent.", FIXED}
    expected |= {"Ask Maria Lopez at +44 20 7946 0958."}
    assert set(found) == {text_digest(raw) for raw in expected}
    assert text_digest(OTHER_TENANT) not in found
    assert all(found[text_digest(raw)] == find_spans(raw) for raw in expected)
    assert found[text_digest(QUESTION)]  # it did find something: names and a phone


@pytest.mark.postgres_only
@pytest.mark.commits("the child reads on a connection of its own")
def test_the_child_is_stopped_with_the_compile_and_starts_only_for_large_ones(
    sessions: sessionmaker[Session], committing_engine: Engine
) -> None:
    acme = make_caller(sessions)
    _feed(Feedback(sessions, acme))
    with sessions() as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == acme.tenant_id)
        ).one()
    small = prefetch.AHEAD_MIN_EVENTS - 1
    with prefetch.Prefetch(
        committing_engine, Texts(), acme.tenant_id, domain_id, full=True, events=small
    ) as run:
        assert run.child is None
    large = prefetch.AHEAD_MIN_EVENTS
    with prefetch.Prefetch(
        committing_engine, Texts(), acme.tenant_id, domain_id, full=True, events=large
    ) as run:
        assert run.child is not None
        process = run.child.process
        command = " ".join(str(arg) for arg in process.args)
        assert str(committing_engine.url.host) not in command  # the connection goes by pipe
        assert str(committing_engine.url.password or "@") not in command
    assert process.returncode is not None  # stopped (or done) when the compile ends
    with prefetch.Prefetch(
        committing_engine, Texts(), acme.tenant_id, domain_id, full=False, events=large
    ) as run:
        assert run.child is None  # a recompile of some prompts


@pytest.mark.usefixtures("any_size")
def test_a_child_that_cannot_connect_costs_only_its_head_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nowhere = create_engine("postgresql+psycopg://nobody@127.0.0.1:9/nothing")
    texts = Texts()
    with caplog.at_level(logging.INFO, logger=prefetch.__name__):
        with prefetch.Prefetch(
            nowhere, texts, uuid.uuid4(), uuid.uuid4(), full=True, events=0
        ) as run:
            assert run.child is not None
            run.child.process.wait(60)
        assert texts("Hi Maria Lopez,").text != "Hi Maria Lopez,"  # found here instead
    assert "compile spans ahead exited 1" in caplog.text
    assert "connection" in caplog.text


def _items(sessions: sessionmaker[Session], domain_id: Any) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    with sessions() as session:
        for table in (PreferencePair, SftExample, LabeledCompletion):
            query = select(table).where(table.domain_id == domain_id)
            for item in session.scalars(query):
                values = {
                    key: value
                    for key, value in vars(item).items()
                    if key
                    not in ("_sa_instance_state", "id", "created_at", "domain_id", "source_ref")
                }
                rows.append((table.__tablename__, sorted(values.items(), key=str)))
    return sorted(rows, key=str)


@pytest.mark.commits("the child reads on a connection of its own")
def test_a_compile_with_the_head_start_stores_what_one_without_stores(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two domains with the same feedback, one compiled with the prefetch, one without: the
    same items (surrogates are scoped by conversation, not by domain)."""
    acme = make_caller(sessions)
    feedback = Feedback(sessions, acme)
    billing_id = feedback.domain_id
    with sessions() as session:
        tenant = tenancy.get_tenant(session=session, name=acme.tenant)
        twin_id = tenancy.create_domain(session=session, tenant=tenant, name="twin").id
        session.commit()
    _feed(feedback)
    feedback.domain_id = twin_id
    _feed(feedback)
    found: list[int] = []
    original = prefetch.Prefetch.rows

    def finished_first(self: prefetch.Prefetch, rows: Any) -> Any:
        found.append(len(_finished(self)) if self.child is not None else 0)
        return original(self, rows)

    monkeypatch.setattr(prefetch.Prefetch, "rows", finished_first)
    monkeypatch.setattr(prefetch, "AHEAD_MIN_EVENTS", 0)
    compile_feedback(sessions, tenant_id=acme.tenant_id, domain_id=billing_id)
    monkeypatch.setattr(prefetch, "AHEAD_MIN_EVENTS", 2**62)
    compile_feedback(sessions, tenant_id=acme.tenant_id, domain_id=twin_id)

    with_head_start = _items(sessions, billing_id)
    assert with_head_start == _items(sessions, twin_id)
    assert len(with_head_start) >= 4  # pairs, a label, a correction's SFT example
    redacted = " ".join(str(row) for row in with_head_start)
    assert "Maria" not in redacted
    assert "555-0132" not in redacted
    is_postgres = sessions.kw["bind"].dialect.name == "postgresql"
    assert found == ([6, 0] if is_postgres else [0, 0])  # the first compile's texts were found


@pytest.mark.postgres_only
@pytest.mark.usefixtures("any_size")
@pytest.mark.commits("the child reads on a connection of its own")
def test_the_child_skips_interactions_nobody_gave_feedback_on(
    sessions: sessionmaker[Session], committing_engine: Engine
) -> None:
    acme = make_caller(sessions)
    feedback = Feedback(sessions, acme)
    _feed(feedback)
    feedback.interaction("Nobody rated this, Dr. Haddad.", _messages("A call with no feedback"))

    found = _prefetched(committing_engine, acme, sessions)

    assert text_digest(ANSWER) in found
    assert text_digest("Nobody rated this, Dr. Haddad.") not in found
    assert text_digest("A call with no feedback") not in found
