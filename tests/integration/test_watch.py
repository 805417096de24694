"""Live watch: a champion whose users like it clearly less than its predecessor is flagged,
and rolled back (audited) when the domain asks for it; too little feedback judges nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work
from flywheel.models import Domain, FeedbackEvent, Interaction, PromotionEvent
from flywheel.registry import service
from flywheel.registry.mlflow_registry import MlflowRegistry
from flywheel.registry.watch import WatchResult, watch_domain
from flywheel.tenancy.service import get_domain
from tests.conftest import Caller
from tests.integration.test_registry import PASSED, register


def served(
    sessions: sessionmaker[Session], caller: Caller, version: str, ups: int, downs: int
) -> None:
    """Interactions served by `acme.billing` v`version`, each rated once."""
    with unit_of_work(sessions) as session:
        domain_id = session.scalars(
            select(Domain.id).where(Domain.tenant_id == caller.tenant_id)
        ).one()
        for n in range(ups + downs):
            interaction = Interaction(
                tenant_id=caller.tenant_id, domain_id=domain_id,
                messages=[{"role": "user", "content": f"q{n}"}], response=f"a{n}",
                model_name="acme.billing", model_version=version, request_sha256="",
            )  # fmt: skip
            session.add(interaction)
            session.flush()
            thumbs = "up" if n < ups else "down"
            session.add(
                FeedbackEvent(
                    tenant_id=caller.tenant_id,
                    domain_id=domain_id,
                    interaction_id=interaction.id,
                    kind="rating",
                    value={"thumbs": thumbs},
                    request_sha256="",
                )
            )


@pytest.fixture
def two_champions(
    sessions: sessionmaker[Session], acme: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> MlflowRegistry:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    register(sessions, registry, acme, tmp_path, "one", PASSED)
    register(sessions, registry, acme, tmp_path, "two", PASSED)
    for version in ("1", "2"):
        with unit_of_work(sessions) as session:
            service.promote(
                session=session, registry=registry,
                domain=get_domain(session, acme.tenant_id, "billing"), version=version, actor="t",
            )  # fmt: skip
    return registry


def watch(sessions: sessionmaker[Session], registry: MlflowRegistry, caller: Caller) -> WatchResult:
    with unit_of_work(sessions) as session:
        return watch_domain(
            session=session,
            registry=registry,
            domain=get_domain(session, caller.tenant_id, "billing"),
        )


def test_a_clear_live_drop_is_flagged_and_rolled_back_when_configured(
    sessions: sessionmaker[Session], acme: Caller, two_champions: MlflowRegistry
) -> None:
    served(sessions, acme, "1", ups=40, downs=10)  # 80%
    served(sessions, acme, "2", ups=20, downs=30)  # 40%

    flagged = watch(sessions, two_champions, acme)
    assert flagged.is_flagged
    assert flagged.rolled_back_to is None
    assert flagged.champion.thumbs_up_rate == pytest.approx(0.4)

    with unit_of_work(sessions) as session:
        session.execute(update(Domain).values(config={"auto_rollback": True}))
    rolled = watch(sessions, two_champions, acme)

    assert rolled.rolled_back_to == "1"
    assert two_champions.alias_version("acme.billing", "champion") == "1"
    with sessions() as session:
        event = session.scalars(
            select(PromotionEvent).order_by(PromotionEvent.created_at.desc())
        ).first()
    assert event is not None
    assert (event.action, event.actor) == ("auto_rollback", "watch")
    assert "below" in event.reason
    assert event.evidence["live"]["p_value"] < 0.05


def test_too_little_or_no_worse_feedback_judges_nothing(
    sessions: sessionmaker[Session], acme: Caller, two_champions: MlflowRegistry
) -> None:
    served(sessions, acme, "1", ups=8, downs=2)
    served(sessions, acme, "2", ups=4, downs=6)
    assert not watch(sessions, two_champions, acme).is_flagged

    served(sessions, acme, "1", ups=30, downs=10)
    served(sessions, acme, "2", ups=34, downs=6)
    result = watch(sessions, two_champions, acme)
    assert not result.is_flagged
    assert result.reason == "no significant drop"
