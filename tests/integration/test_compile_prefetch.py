"""The compiler's redaction head start (`prefetch`): it finds the spans of the compiled
domain's texts only, on a connection of its own, and what it finds changes no stored item."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import utcnow
from flywheel.models import Domain, LabeledCompletion, PreferencePair, SftExample
from flywheel.redaction import find_spans
from flywheel.signals.compile import compile_feedback, prefetch
from flywheel.signals.compile.items import Texts
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


def _prefetched(engine: Engine, caller: Caller, sessions: sessionmaker[Session]) -> Texts:
    with sessions() as session:
        domain_id = session.scalars(select(Domain.id).where(Domain.tenant_id == caller.tenant_id))
        texts = Texts()
        with prefetch.Prefetch(engine, texts, caller.tenant_id, domain_id.one(), full=True) as run:
            run.thread.join(timeout=60)  # let it read everything before it is told to stop
    return texts


@pytest.mark.postgres_only
@pytest.mark.commits("the prefetch reads on a connection of its own")
def test_prefetch_finds_the_compiled_domains_texts_only(
    sessions: sessionmaker[Session], committing_engine: Engine
) -> None:
    acme, globex = make_caller(sessions), make_caller(sessions, tenant="globex")
    _feed(Feedback(sessions, acme))
    other = Feedback(sessions, globex)
    other.interaction(OTHER_TENANT, _messages(OTHER_TENANT))

    texts = _prefetched(committing_engine, acme, sessions)

    expected = {QUESTION, "Be brief.", ANSWER, "Refund sent.", FIXED}
    expected |= {"Ask Maria Lopez at +44 20 7946 0958."}
    assert set(texts.finds) == expected
    assert OTHER_TENANT not in texts.finds
    assert all(texts.finds[raw] == find_spans(raw) for raw in expected)
    assert texts.finds[QUESTION]  # it did find something: names and a phone


@pytest.mark.postgres_only
@pytest.mark.commits("the prefetch reads on a connection of its own")
def test_prefetch_stops_at_the_first_evidence_row(
    sessions: sessionmaker[Session], committing_engine: Engine
) -> None:
    acme = make_caller(sessions)
    _feed(Feedback(sessions, acme))
    with sessions() as session:
        domain_id = session.scalars(select(Domain.id).where(Domain.tenant_id == acme.tenant_id))
        run = prefetch.Prefetch(
            committing_engine, Texts(), acme.tenant_id, domain_id.one(), full=True
        )
        with run:
            rows = list(run.rows(iter(["row"])))
            assert not run.thread.is_alive()  # joined before the first row was handed on
    assert rows == ["row"]
    assert run.stopping.is_set()


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


@pytest.mark.commits("the prefetch reads on a connection of its own")
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
        self.thread.join(timeout=60)  # the whole head start, whatever the timing
        found.append(len(self.texts.finds))
        return original(self, rows)

    monkeypatch.setattr(prefetch.Prefetch, "rows", finished_first)
    compile_feedback(sessions, tenant_id=acme.tenant_id, domain_id=billing_id)
    monkeypatch.setattr(prefetch.Prefetch, "_prefetch", lambda self: None)
    compile_feedback(sessions, tenant_id=acme.tenant_id, domain_id=twin_id)

    with_head_start = _items(sessions, billing_id)
    assert with_head_start == _items(sessions, twin_id)
    assert len(with_head_start) >= 4  # pairs, a label, a correction's SFT example
    redacted = " ".join(str(row) for row in with_head_start)
    assert "Maria" not in redacted
    assert "555-0132" not in redacted
    is_postgres = sessions.kw["bind"].dialect.name == "postgresql"
    assert found == ([6, 0] if is_postgres else [0, 0])  # the first compile's cache was filled


@pytest.mark.postgres_only
@pytest.mark.commits("the prefetch reads on a connection of its own")
def test_prefetch_skips_interactions_nobody_gave_feedback_on(
    sessions: sessionmaker[Session], committing_engine: Engine
) -> None:
    acme = make_caller(sessions)
    feedback = Feedback(sessions, acme)
    _feed(feedback)
    feedback.interaction("Nobody rated this, Dr. Haddad.", _messages("A call with no feedback"))

    texts = _prefetched(committing_engine, acme, sessions)

    assert ANSWER in texts.finds
    assert "Nobody rated this, Dr. Haddad." not in texts.finds
    assert "A call with no feedback" not in texts.finds
