"""What the scheduler's tick reads of every domain at once: its champion (and when that
champion's data was built) and how much training signal is newer than it. One query each,
whatever the number of domains (flywheel.scheduling.schedule).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import CompoundSelect, Select, func, or_, select, union_all
from sqlalchemy.orm import Session

from flywheel.datasets.items import KINDS
from flywheel.datasets.models import DatasetVersion
from flywheel.registry.models import CHAMPION, ModelVersion, PromotionEvent, Run


@dataclass(frozen=True)
class Champion:
    """What the tick needs of a domain's champion: whether there is one, and when the
    dataset version it was trained on was built (None: no champion, or one without a run)."""

    has_champion: bool
    data_time: datetime | None


def champions(session: Session) -> dict[uuid.UUID, Champion]:
    """Every domain's champion as the tick needs it, in one query: the latest champion
    promotion event of each domain (the same one `current_champion` reads), its model
    version, run and dataset version. Domains never promoted are absent."""
    latest = _latest_champion_events().subquery()
    rows = session.execute(
        select(latest.c.domain_id, latest.c.to_model_version_id, DatasetVersion.created_at)
        .outerjoin(ModelVersion, ModelVersion.id == latest.c.to_model_version_id)
        .outerjoin(Run, Run.id == ModelVersion.training_run_id)
        .outerjoin(DatasetVersion, DatasetVersion.id == Run.dataset_version_id)
        .where(latest.c.rank == 1)
    )
    return {
        domain_id: Champion(version_id is not None, data_time if version_id else None)
        for domain_id, version_id, data_time in rows
    }


def new_signal_counts(session: Session) -> dict[uuid.UUID, int]:
    """Training items created since each domain's champion's dataset version was built
    (every item when there is none), for every domain in one query: what a scheduled cycle
    would have that the champion lacked. A domain with nothing new is absent."""
    totals: dict[uuid.UUID, int] = {}
    for domain_id, count in session.execute(_signal_counts()):
        totals[domain_id] = totals.get(domain_id, 0) + int(count)
    return totals


def _latest_champion_events() -> Select[Any]:
    rank = func.row_number().over(
        partition_by=PromotionEvent.domain_id,
        order_by=(PromotionEvent.created_at.desc(), PromotionEvent.id.desc()),
    )
    return select(
        PromotionEvent.domain_id, PromotionEvent.to_model_version_id, rank.label("rank")
    ).where(PromotionEvent.alias == CHAMPION)


def _signal_counts() -> CompoundSelect[Any]:
    """(domain id, count) per signal table, UNION ALL: the rows newer than the domain's
    champion's data (all of them without one)."""
    latest = _latest_champion_events().subquery()
    since = (
        select(latest.c.domain_id, DatasetVersion.created_at.label("since"))
        .join(ModelVersion, ModelVersion.id == latest.c.to_model_version_id)
        .join(Run, Run.id == ModelVersion.training_run_id)
        .join(DatasetVersion, DatasetVersion.id == Run.dataset_version_id)
        .where(latest.c.rank == 1)
        .cte("since")
    )
    parts = []
    for kind in KINDS:
        model = kind.model
        parts.append(
            select(model.domain_id, func.count())
            .outerjoin(since, since.c.domain_id == model.domain_id)
            .where(or_(since.c.since.is_(None), model.created_at > since.c.since))
            .group_by(model.domain_id)
        )
    return union_all(*parts)
