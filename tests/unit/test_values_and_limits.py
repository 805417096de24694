"""Pure units: text checks, feedback values, key parsing, the per-key rate limit."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from limits import RateLimitItemPerSecond
from pydantic import ValidationError

from api.auth_stores import key_limit, make_auth_stores
from flywheel.errors import RateLimited
from flywheel.feedback.service import NewFeedback, request_fingerprint
from flywheel.feedback.values import (
    MAX_METADATA_DEPTH,
    ComparisonValue,
    RatingValue,
    check_clean_json,
    check_clean_text,
)
from flywheel.settings import Settings
from flywheel.tenancy.service import Principal, Scope, split_key


@pytest.mark.parametrize("text", ["a\x00b", "\ud800", "x\udfffy"])
def test_unstorable_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"NUL|surrogate"):
        check_clean_text(text)


@pytest.mark.parametrize("text", ["", "plain", "ünïcødé ✓ 😀", "tab\tnewline\n"])
def test_ordinary_text_passes(text: str) -> None:
    assert check_clean_text(text) == text


def test_metadata_depth_is_bounded() -> None:
    nested: object = "leaf"
    for _ in range(MAX_METADATA_DEPTH + 2):
        nested = {"k": nested}
    with pytest.raises(ValueError, match="nests deeper"):
        check_clean_json(nested)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (2**63, "64 bits"),
        (-(2**63) - 1, "64 bits"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
    ],
)
def test_metadata_numbers_must_be_portable(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        check_clean_json({"nested": [value]})  # type: ignore[dict-item]
    assert check_clean_json({"ok": [2**63 - 1, 1.5, True]}) == {"ok": [2**63 - 1, 1.5, True]}


def test_rating_is_thumbs_or_stars() -> None:
    assert RatingValue(thumbs="up").thumbs == "up"
    assert RatingValue(stars=5).stars == 5
    with pytest.raises(ValidationError):
        RatingValue(stars=True)  # a bool is not a star count


def test_comparison_preferred_must_be_an_option() -> None:
    assert ComparisonValue(responses=["a", "b"], preferred=1).preferred == 1
    with pytest.raises(ValidationError, match="not among the 2 responses"):
        ComparisonValue(responses=["a", "b"], preferred=2)


def test_fingerprint_is_stable_and_sensitive() -> None:
    event = NewFeedback(kind="rating", value={"stars": 3, "x": 1}, domain="d")
    same = NewFeedback(kind="rating", value={"x": 1, "stars": 3}, domain="d")
    other = NewFeedback(kind="rating", value={"stars": 4, "x": 1}, domain="d")
    assert request_fingerprint(event) == request_fingerprint(same)
    assert request_fingerprint(event) != request_fingerprint(other)


def test_split_key_accepts_only_well_formed_keys() -> None:
    secret = "A" * 43
    assert split_key(f"fwk_0123456789abcdef_{secret}") == ("0123456789abcdef", secret)
    for bad in (
        "",
        "fwk_",
        f"fwk_0123_{secret}",
        f"xyz_0123456789abcdef_{secret}",
        f"fwk_0123456789abcdef_{secret}!",
    ):
        assert split_key(bad) is None


def test_admin_scope_implies_every_scope() -> None:
    admin = Principal(key_id=uuid.uuid4(), tenant_id=uuid.uuid4(), scopes=frozenset({"admin"}))
    writer = Principal(
        key_id=uuid.uuid4(), tenant_id=uuid.uuid4(), scopes=frozenset({"feedback:write"})
    )
    assert all(admin.has_scope(scope) for scope in Scope)
    assert writer.has_scope(Scope.FEEDBACK_WRITE)
    assert not writer.has_scope(Scope.DATA_READ)


def test_key_limit_allows_the_burst_then_refuses_with_a_retry_time() -> None:
    settings = Settings(rate_limit_per_s=2.0, rate_limit_burst=3, redis_url=None)  # 3 in any 2 s
    assert key_limit(settings) == RateLimitItemPerSecond(3, 2)

    async def take() -> None:
        limits = make_auth_stores(settings).limits
        key = uuid.uuid4()
        for _ in range(3):
            await limits.take_key(key)
        with pytest.raises(RateLimited) as refused:
            await limits.take_key(key)
        assert 0 < refused.value.retry_after_s <= 2
        await limits.take_key(uuid.uuid4())  # another key has its own window

    asyncio.run(take())
