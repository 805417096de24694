"""Reading an interaction back: its feedback in bounded pages, behind opaque cursors.

An interaction can gather tens of thousands of events, so no read returns them all: a page
holds at most `MAX_PAGE_EVENTS`, in (created_at, id) order (a batch's events share one
created_at; the id breaks the tie), and `next_cursor` names the last event returned. A cursor
is bound to its interaction: any other interaction, a tampered or a foreign cursor is
InvalidInput, and another tenant's interaction is NotFound before its cursor is looked at.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from flywheel.errors import InvalidInput, NotFound
from flywheel.feedback.models import FeedbackEvent, Interaction
from flywheel.tenancy.models import Domain

FIRST_PAGE_EVENTS = 100  # the feedback an interaction read embeds
MAX_PAGE_EVENTS = 500
CURSOR_VERSION = 1

Position = tuple[datetime, uuid.UUID]  # (created_at, id) of the last event of a page


@dataclass(frozen=True)
class EventPage:
    events: list[FeedbackEvent]
    next_cursor: str | None  # None: no more events


def get_interaction(
    *, session: Session, tenant_id: uuid.UUID, interaction_id: uuid.UUID
) -> tuple[Interaction, str, EventPage]:
    """The interaction, its domain's name and the first page of its feedback.

    NotFound for an unknown id or another tenant's.
    """
    interaction, domain = _find_interaction(session, tenant_id, interaction_id)
    page = _read_page(session, tenant_id, interaction_id, None, FIRST_PAGE_EVENTS)
    return interaction, domain, page


def list_feedback(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    interaction_id: uuid.UUID,
    cursor: str | None,
    limit: int,
) -> EventPage:
    """The page of the interaction's feedback after `cursor` (from the start without one).

    NotFound for another tenant's interaction; InvalidInput for a bad cursor or limit.
    """
    if not 1 <= limit <= MAX_PAGE_EVENTS:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE_EVENTS}, not {limit}")
    _find_interaction(session, tenant_id, interaction_id)
    after = None if cursor is None else decode_cursor(cursor, interaction_id)
    return _read_page(session, tenant_id, interaction_id, after, limit)


def _find_interaction(
    session: Session, tenant_id: uuid.UUID, interaction_id: uuid.UUID
) -> tuple[Interaction, str]:
    found = session.execute(
        select(Interaction, Domain.name)
        .join(Domain, Domain.id == Interaction.domain_id)
        .where(Interaction.id == interaction_id, Interaction.tenant_id == tenant_id)
    ).one_or_none()
    if found is None:
        raise NotFound(f"interaction {interaction_id} not found")
    return found[0], found[1]


def _read_page(
    session: Session,
    tenant_id: uuid.UUID,
    interaction_id: uuid.UUID,
    after: Position | None,
    limit: int,
) -> EventPage:
    """One indexed range scan of (interaction_id, created_at, id); one row more than the page
    tells whether another page follows."""
    query = (
        select(FeedbackEvent)
        .where(FeedbackEvent.interaction_id == interaction_id, FeedbackEvent.tenant_id == tenant_id)
        .order_by(FeedbackEvent.created_at, FeedbackEvent.id)
        .limit(limit + 1)
    )
    if after is not None:
        query = query.where(tuple_(FeedbackEvent.created_at, FeedbackEvent.id) > tuple_(*after))
    events = list(session.scalars(query))
    if len(events) <= limit:
        return EventPage(events=events, next_cursor=None)
    last = events[limit - 1]
    return EventPage(
        events=events[:limit], next_cursor=encode_cursor(interaction_id, last.created_at, last.id)
    )


def encode_cursor(interaction_id: uuid.UUID, created_at: datetime, event_id: uuid.UUID) -> str:
    """URL-safe base64 of [version, interaction, created_at, event id]; opaque to clients."""
    payload = [CURSOR_VERSION, str(interaction_id), created_at.isoformat(), str(event_id)]
    return base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=").decode()


def decode_cursor(cursor: str, interaction_id: uuid.UUID) -> Position:
    """The position `cursor` names; InvalidInput unless it is one of this interaction's."""
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        version, owner, created_at, event_id = orjson.loads(raw)
        is_ours = version == CURSOR_VERSION and uuid.UUID(owner) == interaction_id
        after = datetime.fromisoformat(created_at)
        position = (after.astimezone(UTC), uuid.UUID(event_id))
    except (ValueError, TypeError, AttributeError, OverflowError) as error:
        # binascii.Error and orjson.JSONDecodeError are ValueErrors; a wrong type in the
        # payload is a TypeError or an AttributeError.
        raise InvalidInput("invalid cursor: pass a next_cursor exactly as returned") from error
    if not is_ours or after.tzinfo is None:
        raise InvalidInput("invalid cursor: it belongs to no page of this interaction")
    return position
