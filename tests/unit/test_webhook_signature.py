"""Webhook signatures: what a receiver checks before it trusts a champion move."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

import pytest

from flywheel.registry.models import WebhookDelivery
from flywheel.registry.webhooks import backoff_s, sign, verify_signature, wire_body
from flywheel.settings import Settings

SECRET = "k3y"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def body_at(at: datetime) -> bytes:
    row = WebhookDelivery(event="promoted", body={"domain": "billing", "to_version": "2"})
    return wire_body(row, at=at)


def test_the_signature_is_the_hex_hmac_sha256_of_the_raw_body() -> None:
    body = body_at(NOW)
    expected = hmac.new(b"k3y", body, hashlib.sha256).hexdigest()

    assert sign(SECRET, body) == f"sha256={expected}"
    assert verify_signature(SECRET, body, sign(SECRET, body), now=NOW + timedelta(seconds=5))
    assert json.loads(body)["timestamp"] == NOW.isoformat()


@pytest.mark.parametrize(
    "forge",
    [
        lambda body: (SECRET, body.replace(b'"2"', b'"3"'), sign(SECRET, body)),  # edited body
        lambda body: (SECRET, body, sign("another key", body)),  # signed with another key
        lambda body: (SECRET, body, None),  # no header
        lambda body: (SECRET, body, ""),
        lambda body: (SECRET, body, sign(SECRET, body).removeprefix("sha256=")),
        lambda body: (SECRET, body, sign(SECRET, body)[:-1] + "0"),
        lambda body: (SECRET, body, "sha256=\u00e9" + sign(SECRET, body)[8:]),  # not ASCII
    ],
)
def test_a_forged_signature_fails(forge: object) -> None:
    body = body_at(NOW)
    secret, sent, header = forge(body)  # type: ignore[operator]

    assert not verify_signature(secret, sent, header, now=NOW)


def test_a_stale_or_future_timestamp_fails_a_replay_check() -> None:
    old = body_at(NOW - timedelta(minutes=10))
    ahead = body_at(NOW + timedelta(minutes=10))

    assert not verify_signature(SECRET, old, sign(SECRET, old), now=NOW)
    assert not verify_signature(SECRET, ahead, sign(SECRET, ahead), now=NOW)
    assert verify_signature(SECRET, old, sign(SECRET, old), now=NOW, max_age_s=None)
    assert verify_signature(SECRET, old, sign(SECRET, old), now=NOW, max_age_s=3600)


def test_a_signed_body_without_a_timestamp_fails_the_replay_check() -> None:
    body = b'{"event": "promoted"}'

    assert not verify_signature(SECRET, body, sign(SECRET, body), now=NOW)


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    settings = Settings(webhook_backoff_s=1.0, webhook_backoff_max_s=5.0)

    waits = [[backoff_s(n, settings) for _ in range(200)] for n in (1, 2, 3, 4)]

    for n, seen in zip((1, 2, 3, 4), waits, strict=True):
        top = min(5.0, 2.0 ** (n - 1))
        assert all(top / 2 <= wait <= top for wait in seen)
        assert max(seen) - min(seen) > top / 10  # jittered, not one fixed wait


def test_webhook_urls_are_checked_when_settings_are_read() -> None:
    assert Settings(webhook_urls=" http://a.example/x ,https://b.example").webhook_url_list == [
        "http://a.example/x",
        "https://b.example",
    ]
    with pytest.raises(ValueError, match="not an http"):
        Settings(webhook_urls="http://a.example,ftp://b.example")
