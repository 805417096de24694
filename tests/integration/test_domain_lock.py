"""`domain_lock`: one kind of work on one domain at a time, and kinds never block each other
(compiles and near-duplicate passes used to share one lock by accident). PostgreSQL only:
SQLite serialises its writers itself."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flywheel.db import domain_lock

pytestmark = pytest.mark.postgres_only


def _tries(engine: Engine, domain_id: uuid.UUID, purpose: str) -> bool:
    """Whether another connection gets the lock within 200 ms."""
    with Session(engine) as session, session.begin():
        session.connection().exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
        try:
            domain_lock(session, domain_id, purpose)
        except OperationalError:
            return False
        return True


def test_a_held_lock_blocks_its_purpose_on_its_domain_only(engine: Engine) -> None:
    domain_id, other_domain = uuid.uuid4(), uuid.uuid4()
    with Session(engine) as holder, holder.begin():
        domain_lock(holder, domain_id, "compile")

        assert not _tries(engine, domain_id, "compile")
        assert _tries(engine, domain_id, "near-duplicates")
        assert _tries(engine, domain_id, "dataset-build")
        assert _tries(engine, other_domain, "compile")
    assert _tries(engine, domain_id, "compile")  # released with the transaction
