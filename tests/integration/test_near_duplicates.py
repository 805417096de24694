"""The near-duplicate pass on a real database: signatures stored, links to the earliest item."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.errors import InvalidInput
from flywheel.models import (
    Domain,
    LabeledCompletion,
    PreferencePair,
    SftExample,
    Tenant,
    VerifiableTask,
)
from flywheel.signals import dedup
from flywheel.signals.dedup import SIGNATURE_BYTES, link_near_duplicates
from flywheel.tenancy import service as tenancy
from tests.conftest import Caller

Signal = SftExample | PreferencePair | LabeledCompletion | VerifiableTask

REPLY = (
    "Hi Maria, thanks for reaching out about your invoice. I checked your account and the "
    "duplicate charge of 42 dollars on March 3 was a pre-authorisation hold that our payment "
    "provider releases within five business days. You do not need to do anything; if it is "
    "still there next week, reply to this message and I will refund it manually. Sorry for "
    "the worry, and have a good day."
)
NEAR_REPLY = REPLY.replace("Maria", "John").replace("a good day", "a nice day")
OTHER = (
    "To reset your password, open the sign-in page, choose 'Forgot password' and follow the "
    "link we email you. The link expires after thirty minutes, so use it soon. If no email "
    "arrives, check your spam folder or ask your workspace admin to resend the invitation."
)
PROMPT = [{"role": "user", "content": "Why was I charged twice this month?"}]
START = datetime(2026, 1, 1, tzinfo=UTC)
NO_LINKS = dict.fromkeys(
    ["sft_examples", "preference_pairs", "labeled_completions", "verifiable_tasks"], 0
)


def domain_id(sessions: sessionmaker[Session], caller: Caller) -> uuid.UUID:
    with sessions() as session:
        query = select(Domain.id).where(
            Domain.tenant_id == caller.tenant_id, Domain.name == caller.domain
        )
        return session.execute(query).scalar_one()


def add(
    session: Session, model: type[Signal], domain: uuid.UUID, minute: int, **fields: Any
) -> uuid.UUID:
    """A signal row as ingest leaves it: unsigned, unlinked, created `minute`s after START."""
    tenant_id = session.execute(select(Domain.tenant_id).where(Domain.id == domain)).scalar_one()
    row = model(
        tenant_id=tenant_id,
        domain_id=domain,
        source_kind="api",
        group_key=f"g-{minute}",
        content_sha256=hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest(),
        ingestor_version="test",
        created_at=START + timedelta(minutes=minute),
        **fields,
    )
    session.add(row)
    session.flush()
    return row.id


def sft(session: Session, domain: uuid.UUID, minute: int, completion: str) -> uuid.UUID:
    return add(session, SftExample, domain, minute, messages=PROMPT, completion=completion)


def links(sessions: sessionmaker[Session], model: type[Signal]) -> dict[uuid.UUID, uuid.UUID]:
    with sessions() as session:
        rows = session.execute(select(model.id, model.duplicate_of_id)).all()
    return {row_id: canonical for row_id, canonical in rows if canonical is not None}


def run_pass(sessions: sessionmaker[Session], domain: uuid.UUID) -> dict[str, int]:
    with unit_of_work(sessions) as session:
        return link_near_duplicates(session, domain_id=domain)


def test_near_duplicates_link_to_the_earliest_item(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain = domain_id(sessions, acme)
    with unit_of_work(sessions) as session:
        # Inserted out of order: the earliest by created_at is the canonical one.
        later = sft(session, domain, 3, NEAR_REPLY)
        first = sft(session, domain, 1, REPLY)
        sft(session, domain, 2, OTHER)
        again = sft(session, domain, 4, REPLY.replace("Sorry for the worry, and ", ""))

    assert run_pass(sessions, domain) == {**NO_LINKS, "sft_examples": 2}
    assert links(sessions, SftExample) == {later: first, again: first}
    with sessions() as session:
        signatures = session.scalars(select(SftExample.minhash)).all()
    assert len(signatures) == 4
    assert all(
        signature is not None and len(signature) == SIGNATURE_BYTES for signature in signatures
    )


def pair(session: Session, domain: uuid.UUID, minute: int, chosen: str, rejected: str) -> uuid.UUID:
    fields = {"messages": PROMPT, "chosen": chosen, "rejected": rejected, "why": "rated"}
    return add(session, PreferencePair, domain, minute, **fields)


def label(session: Session, domain: uuid.UUID, minute: int, text: str, good: bool) -> uuid.UUID:
    fields = {"messages": PROMPT, "completion": text, "is_desirable": good, "why": "rated"}
    return add(session, LabeledCompletion, domain, minute, **fields)


def task(session: Session, domain: uuid.UUID, minute: int, prompt: str, tests: str) -> uuid.UUID:
    return add(session, VerifiableTask, domain, minute, prompt=prompt, hidden_tests=tests)


def test_each_signal_table_is_linked_on_its_own_text(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain = domain_id(sessions, acme)
    with unit_of_work(sessions) as session:
        first_pair = pair(session, domain, 1, REPLY, OTHER)
        near_pair = pair(session, domain, 2, NEAR_REPLY, OTHER)
        pair(session, domain, 3, OTHER, REPLY)  # swapped: the opposite preference
        good = label(session, domain, 1, REPLY, good=True)
        label(session, domain, 2, NEAR_REPLY, good=False)  # a contradiction, not a duplicate
        near_good = label(session, domain, 3, NEAR_REPLY, good=True)
        first_task = task(session, domain, 1, REPLY, "assert f() == 1")
        near_task = task(session, domain, 2, NEAR_REPLY, "assert f() == 2")

    counts = run_pass(sessions, domain)

    assert counts == {
        "sft_examples": 0,
        "preference_pairs": 1,
        "labeled_completions": 1,
        "verifiable_tasks": 1,
    }
    assert links(sessions, PreferencePair) == {near_pair: first_pair}
    assert links(sessions, LabeledCompletion) == {near_good: good}
    # A task is its prompt: other hidden tests do not make it another task.
    assert links(sessions, VerifiableTask) == {near_task: first_task}


def test_other_domains_are_never_read_or_linked(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    domain = domain_id(sessions, acme)
    with unit_of_work(sessions) as session:
        tenant = session.get_one(Tenant, acme.tenant_id)
        elsewhere = tenancy.create_domain(session=session, tenant=tenant, name="shipping").id
        foreign = sft(session, elsewhere, 0, REPLY)
        own = sft(session, domain, 1, NEAR_REPLY)

    assert run_pass(sessions, domain) == NO_LINKS
    assert links(sessions, SftExample) == {}
    with sessions() as session:
        assert session.get_one(SftExample, foreign).minhash is None
        assert session.get_one(SftExample, own).minhash is not None


@contextmanager
def recorded_statements(engine: Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)
        # Inside the test's transaction (tests/conftest.py) the session's begin and commit are a
        # savepoint and its release: the test's, not the product's.
        if statements[:1] and statements[0].startswith("SAVEPOINT"):
            assert statements[-1].startswith("RELEASE SAVEPOINT"), statements
            del statements[-1], statements[0]


def test_a_second_pass_with_nothing_new_reads_and_links_nothing(
    sessions: sessionmaker[Session], acme: Caller, engine: Engine
) -> None:
    domain = domain_id(sessions, acme)
    with unit_of_work(sessions) as session:
        first = sft(session, domain, 1, REPLY)
        near = sft(session, domain, 2, NEAR_REPLY)
    assert run_pass(sessions, domain)["sft_examples"] == 1

    with recorded_statements(engine) as statements:
        assert run_pass(sessions, domain) == NO_LINKS
    # The domain's lock (PostgreSQL), one look for unsigned rows per table, and nothing else.
    looks = [statement for statement in statements if "pg_advisory_xact_lock" not in statement]
    assert len(statements) - len(looks) == (engine.dialect.name == "postgresql")
    assert [statement.split()[0] for statement in looks] == ["SELECT"] * 4
    assert links(sessions, SftExample) == {near: first}

    with unit_of_work(sessions) as session:
        newer = sft(session, domain, 3, REPLY.replace("42 dollars", "42 euros"))
        sft(session, domain, 4, OTHER)
    assert run_pass(sessions, domain)["sft_examples"] == 1
    assert links(sessions, SftExample) == {near: first, newer: first}


def test_rows_are_read_and_written_in_chunks(
    sessions: sessionmaker[Session], acme: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dedup, "CHUNK_ROWS", 2)
    monkeypatch.setattr(dedup, "WRITE_ROWS", 2)
    domain = domain_id(sessions, acme)
    with unit_of_work(sessions) as session:
        first = sft(session, domain, 0, REPLY)
        copies = [
            sft(session, domain, minute, f"{REPLY} Ticket {minute}.") for minute in range(1, 6)
        ]

    assert run_pass(sessions, domain)["sft_examples"] == 5
    assert links(sessions, SftExample) == dict.fromkeys(copies, first)


def test_objects_loaded_in_the_session_see_the_link(
    sessions: sessionmaker[Session], acme: Caller
) -> None:
    """The caller owns the transaction and may hold the rows it just inserted."""
    domain = domain_id(sessions, acme)
    with unit_of_work(sessions) as session:
        first = sft(session, domain, 1, REPLY)
        near = sft(session, domain, 2, NEAR_REPLY)
        link_near_duplicates(session, domain_id=domain)

        assert session.get_one(SftExample, near).duplicate_of_id == first
        assert session.get_one(SftExample, first).minhash is not None


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_a_threshold_outside_zero_to_one_is_refused(
    sessions: sessionmaker[Session], acme: Caller, threshold: float
) -> None:
    domain = domain_id(sessions, acme)
    with sessions() as session, pytest.raises(InvalidInput, match="threshold"):
        link_near_duplicates(session, domain_id=domain, threshold=threshold)
