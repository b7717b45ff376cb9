"""The one back-off (dedupnet/codec/backoff.py), driven directly with seeded random sources."""

from __future__ import annotations

import itertools
import random

import pytest

from dedupnet.codec.backoff import Backoff


def test_waits_double_from_the_first_up_to_the_cap():
    b = Backoff(first=0.1, cap=1.0)
    assert list(itertools.islice(b.delays(), 7)) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert b.delay(10_000) == 1.0  # a long outage stays at the cap


def test_attempts_bound_the_waits():
    assert list(Backoff(first=0.05, cap=2.0, attempts=6).delays()) == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8])
    assert list(Backoff(first=0.05, cap=2.0, attempts=1).delays()) == []


def test_jitter_cuts_each_wait_by_at_most_its_fraction():
    b = Backoff(first=1.0, cap=8.0, jitter=0.5)
    rng = random.Random(3)
    waits = [b.delay(n, rng) for n in range(1, 5) for _ in range(200)]
    bases = [1.0, 2.0, 4.0, 8.0]
    for i, base in enumerate(bases):
        drawn = waits[i * 200 : (i + 1) * 200]
        assert all(base / 2 <= w <= base for w in drawn)
        assert max(drawn) - min(drawn) > base / 4  # spread out, not one value


def test_the_same_seed_draws_the_same_waits_and_another_seed_others():
    b = Backoff(first=0.1, cap=5.0, jitter=0.5)
    first = list(itertools.islice(b.delays(random.Random(7)), 10))
    assert first == list(itertools.islice(b.delays(random.Random(7)), 10))
    assert first != list(itertools.islice(b.delays(random.Random(8)), 10))


def test_hosts_failing_together_spread_their_retries():
    """Many clients that lost one server at once: with jitter their next tries differ."""
    b = Backoff(first=0.1, cap=5.0, jitter=0.5)
    rng = random.Random(11)
    assert len({round(b.delay(4, rng), 6) for _ in range(100)}) > 90
    assert len({Backoff(first=0.1, cap=5.0).delay(4) for _ in range(100)}) == 1


@pytest.mark.parametrize("kwargs", [dict(first=0, cap=1), dict(first=2, cap=1), dict(first=1, cap=2, jitter=1.5),
                                    dict(first=1, cap=2, attempts=0)])
def test_nonsense_is_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_a_wait_follows_a_failure():
    with pytest.raises(ValueError):
        Backoff(first=1, cap=2).delay(0)
