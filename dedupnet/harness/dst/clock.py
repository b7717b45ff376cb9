"""One seeded scheduler with a virtual clock: everything that happens in a simulation
is a callback on its heap, run in (time, order of scheduling) order, so one seed gives
one history whatever the machine or its load."""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import deque
from collections.abc import Callable


class Handle:
    __slots__ = ("alive",)

    def __init__(self) -> None:
        self.alive = True

    def cancel(self) -> None:
        self.alive = False


class Scheduler:
    """The heap of callbacks, the clock, the run's random source and its trace.

    ``trace`` is a hash over what the cores were given and what they sent, so two runs
    that differ anywhere differ in it; ``recent`` keeps the last entries in readable
    form for a failure's report."""

    def __init__(self, seed: int, *, recent: int = 400):
        self.now = 0.0
        self.rng = random.Random(seed)
        self._heap: list = []
        self._order = 0
        self._hash = hashlib.blake2b(digest_size=16)
        self.recent: deque[tuple] = deque(maxlen=recent)
        self.steps = 0

    def at(self, when: float, fn: Callable, *args) -> Handle:
        handle = Handle()
        self._order += 1
        heapq.heappush(self._heap, (max(when, self.now), self._order, handle, fn, args))
        return handle

    def after(self, delay: float, fn: Callable, *args) -> Handle:
        return self.at(self.now + delay, fn, *args)

    def run(self, until: float, stop: Callable[[], bool] | None = None, check_every: float = 1.0) -> bool:
        """Run callbacks up to virtual time ``until``; ``stop`` is asked every
        ``check_every`` virtual seconds and ends the run when true (returns True then)."""
        next_check = self.now + check_every
        heap = self._heap
        while heap:
            when = heap[0][0]
            if when > until:
                break
            if stop is not None and when >= next_check:
                self.now = next_check
                if stop():
                    return True
                next_check = self.now + check_every
                continue
            _, _, handle, fn, args = heapq.heappop(heap)
            if not handle.alive:
                continue
            self.now = when
            self.steps += 1
            fn(*args)
        if heap:
            self.now = max(self.now, until)
        return bool(stop and stop())

    def record(self, *entry) -> None:
        """One step of the history, into the hash and the recent trace."""
        self._hash.update(repr((round(self.now, 9), entry)).encode())
        self.recent.append((self.now, entry))

    def record_bytes(self, who: str, data: bytes) -> None:
        self._hash.update(who.encode())
        self._hash.update(data)

    @property
    def trace_hash(self) -> str:
        return self._hash.hexdigest()

    def idle(self) -> bool:
        return not any(h.alive for _, _, h, _, _ in self._heap)
