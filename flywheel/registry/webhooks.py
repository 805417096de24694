"""Webhooks to serving stacks: every champion move, signed, delivered at least once.

Where they go: `FLYWHEEL_WEBHOOK_URLS` (comma-separated, every domain of the deployment) and a
domain's own `webhooks: [url, ...]` in its config (checked by `domain_webhooks`). They are
signed with `FLYWHEEL_WEBHOOK_SECRET`; without it nothing is sent (rows wait, pending).
The webhook settings are read from the environment of the process that moves the alias.

Outbox: `enqueue` writes one `WebhookDelivery` row per URL in the transaction of the
`PromotionEvent` it announces (the registry service calls it), so a move that rolls back is
never announced and one that commits is never lost. Nothing is sent from inside that
transaction: `deliver_due` sends pending rows afterwards (right after the promotion's command
or request commits, for a bounded time, never failing it; `flywheel models webhooks deliver`
and the worker's periodic task send what is still due). Failed attempts are retried with
exponential backoff and jitter up to `FLYWHEEL_WEBHOOK_MAX_ATTEMPTS`, then recorded failed.
Delivery is at least once: a receiver dedupes on `X-Flywheel-Delivery`.

The request:

    POST <url>
    Content-Type: application/json
    X-Flywheel-Event: promoted | rolled_back
    X-Flywheel-Delivery: <delivery id, the same on every retry>
    X-Flywheel-Signature: sha256=<hex HMAC-SHA256 of the raw body, keyed with the secret>

    {"delivery_id": "...", "event": "promoted", "timestamp": "<ISO 8601 UTC, this attempt>",
     "data": {"domain", "tenant", "action", "registered_model", "from_version", "to_version",
              "model_version_id", "adapter_uri", "base_model", "registry_uri", "actor",
              "reason", "is_forced", "promotion_event_id", "promoted_at"}}

Receivers check the signature on the raw bytes before parsing them, and reject a timestamp
older than a few minutes (a replayed request): `verify_signature` does both.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import AnyHttpUrl, TypeAdapter, ValidationError
from sqlalchemy import select, tuple_, update
from sqlalchemy.orm import Session, sessionmaker

from flywheel.db import unit_of_work, utcnow
from flywheel.errors import InvalidInput
from flywheel.registry.models import ModelVersion, PromotionEvent, WebhookDelivery
from flywheel.settings import Settings
from flywheel.tenancy.models import Domain, Tenant
from flywheel.tenancy.service import get_domain

if TYPE_CHECKING:
    import httpx

SIGNATURE_HEADER = "X-Flywheel-Signature"
EVENT_HEADER = "X-Flywheel-Event"
DELIVERY_HEADER = "X-Flywheel-Delivery"
MAX_AGE_S = 300.0
"""How old a signed timestamp `verify_signature` accepts by default."""
CLAIM_S = 30.0
"""A sender's claim on a row outlives its request by this: then another may retry it."""

_URLS = TypeAdapter(list[AnyHttpUrl])


def domain_webhooks(domain: Domain) -> list[str]:
    """The domain config's `webhooks` URLs; InvalidInput naming the bad one."""
    raw = (domain.config or {}).get("webhooks") or []
    try:
        return [str(url) for url in _URLS.validate_python(raw)]
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidInput(
            f"domain {domain.name}'s webhooks config: {where or 'webhooks'}: {first['msg']}"
        ) from error


def enqueue(
    session: Session,
    *,
    event: PromotionEvent,
    target: ModelVersion,
    current: ModelVersion | None,
    settings: Settings | None = None,
) -> list[WebhookDelivery]:
    """One pending delivery per configured URL for this (flushed) move, in its transaction."""
    domain = session.get_one(Domain, event.domain_id)
    urls = dict.fromkeys((settings or Settings()).webhook_url_list + domain_webhooks(domain))
    if not urls:
        return []
    data = _payload(session, domain, event, target, current)
    kind = "promoted" if event.action == "promote" else "rolled_back"
    rows = [
        WebhookDelivery(
            tenant_id=event.tenant_id,
            domain_id=event.domain_id,
            promotion_event_id=event.id,
            event=kind,
            url=url,
            body=data,
            status="pending",
            attempts=0,
            next_attempt_at=utcnow(),
        )
        for url in urls
    ]
    session.add_all(rows)
    session.flush()
    return rows


def _payload(
    session: Session,
    domain: Domain,
    event: PromotionEvent,
    target: ModelVersion,
    current: ModelVersion | None,
) -> dict[str, Any]:
    return {
        "domain": domain.name,
        "tenant": session.get_one(Tenant, domain.tenant_id).name,
        "action": event.action,
        "registered_model": target.registered_model,
        "from_version": current.version if current else None,
        "to_version": target.version,
        "model_version_id": str(target.id),
        "adapter_uri": target.adapter_uri,
        "base_model": target.base_model,
        "registry_uri": f"models:/{target.registered_model}@{event.alias}",
        "actor": event.actor,
        "reason": event.reason,
        "is_forced": event.is_forced,
        "promotion_event_id": str(event.id),
        "promoted_at": event.created_at.isoformat(),
    }


def sign(secret: str, body: bytes) -> str:
    """The `X-Flywheel-Signature` value of `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    body: bytes,
    header: str | None,
    *,
    max_age_s: float | None = MAX_AGE_S,
    now: datetime | None = None,
) -> bool:
    """Whether `header` is the signature of the raw `body` under `secret` (compared in
    constant time) and, unless `max_age_s` is None, the body's signed `timestamp` is at most
    that old (and not from the future by as much): a replay of an old request fails."""
    if not header or not hmac.compare_digest(sign(secret, body).encode(), header.encode()):
        return False
    if max_age_s is None:
        return True
    try:
        sent = datetime.fromisoformat(json.loads(body)["timestamp"])
    except (ValueError, KeyError, TypeError):
        return False
    if sent.tzinfo is None:
        return False
    age = ((now or datetime.now(UTC)) - sent).total_seconds()
    return -max_age_s <= age <= max_age_s


def wire_body(row: WebhookDelivery, *, at: datetime) -> bytes:
    """The bytes one attempt sends (and signs): the stored payload with this attempt's time."""
    envelope = {
        "delivery_id": str(row.id),
        "event": row.event,
        "timestamp": at.isoformat(),
        "data": row.body,
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()


def backoff_s(attempts: int, settings: Settings) -> float:
    """The wait after the `attempts`-th failed attempt: doubling, capped, 50-100% of it."""
    delay = min(settings.webhook_backoff_max_s, settings.webhook_backoff_s * 2.0 ** (attempts - 1))
    return delay * (1 - random.random() / 2)  # jitter, not a secret


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    retried: int = 0
    errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "delivered": self.delivered,
            "failed": self.failed,
            "retried": self.retried,
            "errors": self.errors,
        }


@dataclass(frozen=True)
class Scope:
    """Which pending rows a sender takes: all, one domain's, or one move's."""

    domain_id: uuid.UUID | None = None
    promotion_event_id: uuid.UUID | None = None

    def where(self) -> list[Any]:
        clauses: list[Any] = [WebhookDelivery.status == "pending"]
        if self.domain_id is not None:
            clauses.append(WebhookDelivery.domain_id == self.domain_id)
        if self.promotion_event_id is not None:
            clauses.append(WebhookDelivery.promotion_event_id == self.promotion_event_id)
        return clauses


def deliver_due(
    sessions: sessionmaker[Session],
    *,
    budget_s: float,
    scope: Scope | None = None,
    settings: Settings | None = None,
    client: httpx.Client | None = None,
) -> DeliveryReport:
    """Send the pending deliveries in `scope` that are due, and those that fall due within
    `budget_s` (waiting out their backoff), each attempt recorded in its own transaction.
    Nothing is sent without a webhook secret."""
    import httpx

    current = settings or Settings()
    report = DeliveryReport()
    if current.webhook_secret is None:
        report.errors.append("FLYWHEEL_WEBHOOK_SECRET is not set: nothing sent")
        return report
    secret = current.webhook_secret.get_secret_value()
    deadline = utcnow() + timedelta(seconds=budget_s)
    owned = client or httpx.Client(timeout=current.webhook_timeout_s, follow_redirects=False)
    try:
        claim_s = CLAIM_S + current.webhook_timeout_s
        while (row := _next_due(sessions, scope or Scope(), deadline, claim_s)) is not None:
            _attempt(sessions, owned, row, secret, current, report)
    finally:
        if client is None:
            owned.close()
    return report


def _next_due(
    sessions: sessionmaker[Session], scope: Scope, deadline: datetime, claim_s: float
) -> WebhookDelivery | None:
    """A due row claimed by this sender (waiting for one that falls due by `deadline`); None
    when none is due in time. A retry due after `deadline` is left for a later sender even
    when this one gets to it late (on a loaded machine a budget of 0 once sent a retry whose
    backoff had run out meanwhile)."""
    while True:
        with unit_of_work(sessions) as session:
            soonest = session.scalars(
                select(WebhookDelivery)
                .where(*scope.where())
                .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
                .limit(1)
            ).first()
            if soonest is None or soonest.next_attempt_at is None:
                return None
            if soonest.next_attempt_at > deadline:
                return None
            wait = (soonest.next_attempt_at - utcnow()).total_seconds()
            if wait <= 0 and _claim(session, soonest, claim_s):
                return soonest
        time.sleep(max(wait, 0))


def _claim(session: Session, row: WebhookDelivery, claim_s: float) -> bool:
    """Take the row for one attempt (compare-and-set on its attempt count, so two senders
    never send the same attempt): its attempt counted, due again when the claim runs out."""
    claimed_until = utcnow() + timedelta(seconds=claim_s)
    taken = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == row.id,
            WebhookDelivery.status == "pending",
            WebhookDelivery.attempts == row.attempts,
        )
        .values(attempts=WebhookDelivery.attempts + 1, next_attempt_at=claimed_until)
        .execution_options(synchronize_session=False)
    )
    session.expunge(row)  # a snapshot from here: this transaction writes only the claim
    row.attempts += 1
    return bool(getattr(taken, "rowcount", 0) == 1)


def _attempt(
    sessions: sessionmaker[Session],
    client: httpx.Client,
    row: WebhookDelivery,
    secret: str,
    settings: Settings,
    report: DeliveryReport,
) -> None:
    import httpx

    body = wire_body(row, at=datetime.now(UTC))
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(secret, body),
        EVENT_HEADER: row.event,
        DELIVERY_HEADER: str(row.id),
        "User-Agent": "flywheel-webhooks/1",
    }
    code: int | None = None
    try:
        response = client.post(row.url, content=body, headers=headers)
        code = response.status_code
        error = None if response.is_success else f"HTTP {code}"
    except httpx.HTTPError as failure:
        error = f"{type(failure).__name__}: {failure}"[:1000]
    _record(sessions, row, code, error, settings, report)


def _record(
    sessions: sessionmaker[Session],
    row: WebhookDelivery,
    code: int | None,
    error: str | None,
    settings: Settings,
    report: DeliveryReport,
) -> None:
    now = utcnow()
    values: dict[str, Any] = {"last_status_code": code, "last_error": error}
    if error is None:
        values |= {"status": "delivered", "delivered_at": now, "next_attempt_at": None}
        report.delivered += 1
    elif row.attempts >= settings.webhook_max_attempts:
        values |= {"status": "failed", "next_attempt_at": None}
        report.failed += 1
        report.errors.append(f"{row.url}: {error} (after {row.attempts} attempts)")
    else:
        wait = backoff_s(row.attempts, settings)
        values["next_attempt_at"] = now + timedelta(seconds=wait)
        report.retried += 1
    with unit_of_work(sessions) as session:
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == row.id)
            .values(**values)
            .execution_options(synchronize_session=False)
        )


def deliver_after_move(
    sessions: sessionmaker[Session], promotion_event_id: uuid.UUID
) -> DeliveryReport:
    """Best effort, right after a move committed: its webhooks (see `deliver_soon`)."""
    return deliver_soon(sessions, Scope(promotion_event_id=promotion_event_id))


def deliver_soon(sessions: sessionmaker[Session], scope: Scope) -> DeliveryReport:
    """Best effort: the pending webhooks in `scope`, for at most FLYWHEEL_WEBHOOK_SEND_BUDGET_S.
    Never raises: what is left waits for a later sender."""
    try:
        settings = Settings()
        return deliver_due(
            sessions, budget_s=settings.webhook_send_budget_s, scope=scope, settings=settings
        )
    except Exception as error:  # the move is done; its webhooks are retried later
        return DeliveryReport(errors=[f"webhooks not sent yet: {type(error).__name__}: {error}"])


@dataclass(frozen=True)
class DeliveryPage:
    items: list[WebhookDelivery]
    next_after: uuid.UUID | None


def list_deliveries(
    *,
    session: Session,
    tenant_id: uuid.UUID,
    domain: str,
    status: str | None = None,
    after: uuid.UUID | None = None,
    limit: int = 100,
) -> DeliveryPage:
    """A page of the domain's deliveries, oldest first (keyset on creation time and id)."""
    domain_id = get_domain(session, tenant_id, domain).id
    query = select(WebhookDelivery).where(WebhookDelivery.domain_id == domain_id)
    if status is not None:
        query = query.where(WebhookDelivery.status == status)
    if after is not None:
        mark = session.get(WebhookDelivery, after)
        if mark is None or mark.domain_id != domain_id:
            raise InvalidInput(f"after: no delivery {after} in {domain}")
        query = query.where(
            tuple_(WebhookDelivery.created_at, WebhookDelivery.id)
            > tuple_(mark.created_at, mark.id)
        )
    order = (WebhookDelivery.created_at, WebhookDelivery.id)
    items = list(session.scalars(query.order_by(*order).limit(limit + 1)))
    if len(items) > limit:
        return DeliveryPage(items[:limit], items[limit - 1].id)
    return DeliveryPage(items, None)
