"""Creating, listing and reading suites: a tenant's named set of its own domains, each with a
sampling weight, and a curriculum.

    create_suite(session=..., tenant_id=..., name="support", members={"billing": 0.7, ...})
    get_suite(session, tenant_id, "support") -> LoadedSuite (the suite, its member domains)

Members are looked up by name among the tenant's own domains only (another tenant's domain is
not found, as any unknown name). Weights are relative shares of the suite's draws: finite and
above 0. A suite has at least two members (one domain trains with `flywheel train`).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from flywheel.errors import Conflict, InvalidInput, NotFound
from flywheel.suites.models import CURRICULA, Suite, SuiteMember, SuiteRun
from flywheel.tenancy.models import Domain
from flywheel.tenancy.service import check_name, get_domain

MIN_MEMBERS = 2


@dataclass(frozen=True)
class Member:
    domain: Domain
    weight: float


@dataclass(frozen=True)
class LoadedSuite:
    """A suite with its member domains (in name order), looked up once."""

    suite: Suite
    members: tuple[Member, ...]

    @property
    def name(self) -> str:
        return self.suite.name

    def as_json(self) -> dict[str, Any]:
        return {
            "id": str(self.suite.id),
            "name": self.suite.name,
            "curriculum": self.suite.curriculum,
            "members": {member.domain.name: member.weight for member in self.members},
            "created_at": self.suite.created_at.isoformat(),
        }


def parse_member(text: str) -> tuple[str, float]:
    """`NAME=WEIGHT` as a member's domain and weight; InvalidInput otherwise.

    >>> parse_member("billing=0.7")
    ('billing', 0.7)
    """
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise InvalidInput(f"--domain {text!r} must be NAME=WEIGHT, e.g. billing=0.7")
    try:
        weight = float(raw)
    except ValueError as error:
        message = f"the weight of domain {name!r} must be a number, not {raw!r}"
        raise InvalidInput(message) from error
    return name.strip(), weight


def check_members(members: dict[str, float]) -> None:
    if len(members) < MIN_MEMBERS:
        raise InvalidInput(
            f"a suite needs at least {MIN_MEMBERS} member domains, not {len(members)}: "
            "one domain trains on its own (flywheel train)"
        )
    for name, weight in members.items():
        if not (math.isfinite(weight) and weight > 0):
            raise InvalidInput(f"the weight of domain {name!r} must be above 0, not {weight}")


def create_suite(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    name: str,
    members: dict[str, float],
    curriculum: str = "easy_first",
) -> LoadedSuite:
    """A new suite of the tenant's domains; Conflict when the name is taken."""
    check_name(name, what="suite")
    check_members(members)
    if curriculum not in CURRICULA:
        raise InvalidInput(f"curriculum must be easy_first or none, not {curriculum!r}")
    domains = {member: get_domain(session, tenant_id, member) for member in sorted(members)}
    suite = Suite(tenant_id=tenant_id, name=name, curriculum=curriculum)
    session.add(suite)
    try:
        session.flush()
    except IntegrityError as error:
        raise Conflict(f"suite {name!r} already exists") from error
    for member, domain in domains.items():
        session.add(SuiteMember(suite_id=suite.id, domain_id=domain.id, weight=members[member]))
    session.flush()
    return LoadedSuite(suite, tuple(Member(domains[m], members[m]) for m in domains))


def get_suite(session: Session, tenant_id: uuid.UUID, name: str) -> LoadedSuite:
    """The tenant's suite of that name with its members; NotFound otherwise."""
    suite = session.scalar(select(Suite).where(Suite.tenant_id == tenant_id, Suite.name == name))
    if suite is None:
        raise NotFound(f"suite {name!r} not found")
    return _loaded(session, suite)


def list_suites(*, session: Session, tenant_id: uuid.UUID) -> list[LoadedSuite]:
    """The tenant's suites, by name."""
    found = session.scalars(select(Suite).where(Suite.tenant_id == tenant_id).order_by(Suite.name))
    return [_loaded(session, suite) for suite in found]


def list_suite_runs(*, session: Session, suite: Suite) -> list[SuiteRun]:
    """The suite's runs, newest first."""
    query = select(SuiteRun).where(SuiteRun.suite_id == suite.id)
    return list(session.scalars(query.order_by(SuiteRun.created_at.desc())))


def _loaded(session: Session, suite: Suite) -> LoadedSuite:
    rows = session.execute(
        select(Domain, SuiteMember.weight)
        .join(SuiteMember, SuiteMember.domain_id == Domain.id)
        .where(SuiteMember.suite_id == suite.id)
        .order_by(Domain.name)
    )
    return LoadedSuite(suite, tuple(Member(domain, weight) for domain, weight in rows))
