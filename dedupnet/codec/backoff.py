"""How long to wait before trying again: one exponential back-off for every retry loop.

Each use declares its own :class:`Backoff` beside the loop it paces (the store's
retries, a daemon's store calls, reconnecting to a peer, discovery's queries, the
crawler's retries of a page), so its numbers are read where they act, and the rule that
turns them into waits is written once, here. Pure: the random source is passed in, so a
test (or the simulator) draws the same waits from the same seed.

Jitter takes a random part off each wait. Without it, clients that failed together try
again together: when a center restarts, every host that was connected to it dials in the
same instant, again and again, each failure doubling in step; and the tasks of one
daemon blocked on one Redis all hit it at once when it comes back.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff"]

#: The random source of waits drawn without one of their own.
_RANDOM = random.Random()


@dataclass(frozen=True)
class Backoff:
    """Wait ``first`` seconds, then twice the last wait, never more than ``cap``; each
    wait is then cut to a random ``1 - jitter`` to 1 of itself. ``attempts``: tries in
    all (so ``attempts - 1`` waits), None for as long as the caller goes on."""

    first: float
    cap: float
    jitter: float = 0.0
    attempts: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"back-off: need 0 < first <= cap, got first={self.first}, cap={self.cap}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"back-off: jitter is a fraction from 0 to 1, got {self.jitter}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"back-off: at least one attempt, got {self.attempts}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after ``failures`` failed tries in a row (1 or more)."""
        if failures < 1:
            raise ValueError(f"back-off: a wait follows a failure, got failures={failures}")
        # Doubling stops at the cap; the exponent is bounded so a long outage cannot overflow.
        base = min(self.first * 2.0 ** min(failures - 1, 1023), self.cap)
        if not self.jitter:
            return base
        return base * (1 - self.jitter + self.jitter * (rng or _RANDOM).random())

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits between tries, in order: ``attempts - 1`` of them, or without end."""
        failures = 0
        while self.attempts is None or failures < self.attempts - 1:
            failures += 1
            yield self.delay(failures, rng)
