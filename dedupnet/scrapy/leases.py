"""Which tasks a Scrapy spider holds, and which requests carry them: the scheduler's
lease book.

A task taken from ``task_pool`` is leased until Scrapy is done with every request made
for it (its fetch, its retries); only then is it finished (``dedupnet.scrapy``'s module
doc). The book is told what happens to requests and says which leases are finished;
it does no I/O, so the scheduler feeds it and the tests drive it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scrapy import Request

from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import normalize

#: Request meta key: the task_pool entry id (str) a request is fetched for.
TASK_META = "dedupnet_task"
#: Request meta key: the scheduler checked the task against robots.txt (and set
#: ``dont_obey_robotstxt``, which a request copied from it must not keep).
ROBOTS_META = "dedupnet_robots"


@dataclass
class Lease:
    """One task taken from task_pool and not finished yet."""

    eid: bytes
    url: str  # normalised task URL
    #: URLs fetched for it (the task URL, then each redirecting URL): all go into finish_URL.
    chain: list[str] = field(default_factory=list)
    #: The URL of the request of it now queued here or in the engine.
    current: str = ""
    #: Requests of it queued here or handed to the engine and not yet done with.
    live: int = 0


class TaskBook:
    """Which tasks are leased, which requests carry them, which are finished.

    Events in (:meth:`taken`, :meth:`handed`, :meth:`child`, :meth:`released`), the
    finished leases out (:meth:`finished`). No I/O: the scheduler feeds it."""

    def __init__(self) -> None:
        self.leases: dict[bytes, Lease] = {}
        #: id(request) -> (request, entry id) for task requests handed to the engine.
        self.out: dict[int, tuple[Request, bytes]] = {}
        self.done: list[Lease] = []

    def __len__(self) -> int:
        return len(self.leases)

    def taken(self, eid: bytes, url: str) -> Lease | None:
        """A task read from task_pool; None if it is leased here already (a re-delivery)."""
        if eid in self.leases:
            return None
        lease = self.leases[eid] = Lease(eid, url, [url], url, live=1)
        return lease

    def lease_of(self, request: Request) -> Lease | None:
        eid = request.meta.get(TASK_META)
        return self.leases.get(eid.encode()) if isinstance(eid, str) else None

    def handed(self, request: Request) -> None:
        """A task request went to the engine (it is in the engine's in-progress set
        from now until Scrapy is done with it)."""
        lease = self.lease_of(request)
        if lease is not None:
            self.out[id(request)] = (request, lease.eid)

    def child(self, request: Request, url: str | None) -> str:
        """A request carrying a task's meta came back to the scheduler (``url``: its
        normalised URL, None if bad). Returns ``"retry"`` (it belongs to the task: queue
        it), ``"redirect"`` (the task's page was a redirect: the task is done with the
        current URL; the target is a discovered URL) or ``"other"`` (a new request that
        copied the meta: an ordinary discovered request)."""
        lease = self.lease_of(request)
        if lease is None or url is None:
            return "other"
        hops = request.meta.get("redirect_urls") or []
        if url == lease.current:
            lease.live += 1
            return "retry"
        if hops and normal_url(hops[-1]) == lease.current:
            return "redirect"
        return "other"

    def released(self, in_progress) -> int:
        """Task requests the engine no longer holds are done with; returns how many."""
        gone = [k for k, (req, _) in self.out.items() if req not in in_progress]
        for k in gone:
            _, eid = self.out.pop(k)
            self._drop(eid)
        return len(gone)

    def not_fetched(self, request: Request) -> None:
        """A task request queued here that is done with without a fetch (robots.txt
        forbids it, or cannot be had): its task is finished."""
        lease = self.lease_of(request)
        if lease is not None:
            self._drop(lease.eid)

    def _drop(self, eid: bytes) -> None:
        lease = self.leases.get(eid)
        if lease is None:
            return
        lease.live -= 1
        if lease.live <= 0:
            del self.leases[eid]
            self.done.append(lease)

    def finished(self) -> list[Lease]:
        out, self.done = self.done, []
        return out


def forget_task(request: Request) -> None:
    """A request that carries a task's meta but is not that task's fetch (a redirect's
    target, a request made with copied meta) loses what the scheduler put there."""
    request.meta.pop(TASK_META, None)
    if request.meta.pop(ROBOTS_META, None):
        request.meta.pop("dont_obey_robotstxt", None)


def normal_url(url: str) -> str | None:
    """The URL by the host's rules, None if they refuse it (the caller counts and drops it)."""
    try:
        return normalize(url)
    except BadURL:
        return None
