"""The in-process per-key rate limit: an exact moving window, as `limits`' own is."""

from __future__ import annotations

import asyncio
from unittest import mock

from limits import RateLimitItemPerSecond, strategies
from limits.storage import MemoryStorage

from api.auth_stores import InProcessMovingWindow


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_allowed_then_refused_until_its_oldest_hit_leaves_the_window() -> None:
    clock = Clock()
    window = InProcessMovingWindow(clock)
    item = RateLimitItemPerSecond(3, 2)  # 3 hits in any 2 s

    async def scenario() -> list[object]:
        seen: list[object] = []
        for step in (0.0, 0.5, 0.5):
            clock.now += step
            seen.append(await window.hit(item, "key", "k1"))
        seen.append(await window.hit(item, "key", "k1"))  # a 4th within 2 s of the 1st
        seen.append(await window.test(item, "key", "k1"))
        stats = await window.get_window_stats(item, "key", "k1")
        seen.append((stats.remaining, stats.reset_time))
        clock.now += 1.0  # 2.0 s after the 1st hit: it has left the window
        seen.append(await window.hit(item, "key", "k1"))
        seen.append(await window.hit(item, "key", "k1"))
        seen.append(await window.hit(item, "key", "k2"))  # another key has its own window
        return seen

    expected = [True, True, True, False, False, (0, 1_002.0), True, False, True]
    assert asyncio.run(scenario()) == expected


def test_it_decides_as_limits_moving_window_does_on_the_same_hits() -> None:
    """Same verdicts as `limits`' MovingWindowRateLimiter over a run of irregular hits."""
    clock = Clock()
    ours = InProcessMovingWindow(clock)
    item = RateLimitItemPerSecond(5, 1)
    gaps = [0.01, 0.3, 0.05, 0.2, 0.02, 0.6, 0.01, 0.01, 0.9, 0.4, 0.1, 0.05] * 4

    async def verdicts() -> list[bool]:
        found = []
        for gap in gaps:
            clock.now += gap
            found.append(await ours.hit(item, "key", "k"))
        return found

    theirs = strategies.MovingWindowRateLimiter(MemoryStorage())
    expected = []
    theirs_clock = Clock()
    with mock.patch("time.time", side_effect=theirs_clock):  # `limits` reads time.time()
        for gap in gaps:
            theirs_clock.now += gap
            expected.append(theirs.hit(item, "key", "k"))
    assert asyncio.run(verdicts()) == expected
    assert True in expected  # the run exercises both verdicts
    assert False in expected
