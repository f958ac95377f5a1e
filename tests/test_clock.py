"""The consumer's view of Redis' clock: what a late request's send time is sent as."""

from __future__ import annotations

from consumer.clock import WINDOW_S, RedisClock


def test_unknown_until_a_reply_was_seen() -> None:
    assert RedisClock().to_redis_ms(5.0) is None


def test_the_least_delayed_reply_sets_the_offset() -> None:
    clock = RedisClock()
    clock.observe(10.000, 1_000_000)  # read 0 ms after it ran (the fastest)
    clock.observe(10.500, 1_000_480)  # read 20 ms late: a busy event loop
    assert clock.to_redis_ms(11.0) == 1_001_000


def test_a_drifting_clock_is_followed_after_two_windows() -> None:
    clock = RedisClock()
    clock.observe(0.0, 1_000_000)
    # Redis' clock now runs 50 ms ahead of where the first reply put it.
    for i in range(1, 4):
        clock.observe(i * WINDOW_S, 1_000_000 + int(i * WINDOW_S * 1000) + 50)
    assert clock.to_redis_ms(3 * WINDOW_S) == 1_000_000 + int(3 * WINDOW_S * 1000) + 50
