"""The compile step of a cycle (`flywheel.compilers` entry point): the domain's new feedback
compiled into training signal, then its near-duplicates linked, as `flywheel compile` does."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.signals.dedup import link_near_duplicates
from ingest.compile.compiler import compile_feedback


def compile_domain(
    sessions: sessionmaker[Session], *, tenant_id: uuid.UUID, domain_id: uuid.UUID
) -> dict[str, Any]:
    report = compile_feedback(sessions, tenant_id=tenant_id, domain_id=domain_id)
    compiled: dict[str, Any] = report.as_json()["domains"][0]
    compiled["near_duplicate"] = link_domain(sessions, domain_id)
    return compiled


def link_domain(sessions: sessionmaker[Session], domain_id: uuid.UUID) -> int:
    """Link the domain's new signal to its near-duplicates; how many were linked."""
    with unit_of_work(sessions) as session:
        return sum(link_near_duplicates(session, domain_id=domain_id).values())
