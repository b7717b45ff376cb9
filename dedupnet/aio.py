"""The one adapter between trio and redis-py: store calls run in worker threads.

redis-py's client is synchronous; each :class:`~dedupnet.store.Store` call is one
round trip, so a thread per call costs little next to the batch it carries, and
the event loop never blocks on Redis. A capacity limiter bounds the threads (and
so the connections) a process uses.
"""

from __future__ import annotations

import functools
from typing import Any

import trio

from .store import Store


class AsyncStore:
    """``await astore.fp_contains(...)`` runs ``store.fp_contains(...)`` in a worker thread."""

    def __init__(self, store: Store, *, max_threads: int = 4):
        self.store = store
        self._limiter = trio.CapacityLimiter(max_threads)

    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(method, *args, **kwargs)

        call.__name__ = name
        return call
