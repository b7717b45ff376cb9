"""``dedupnet sim --http``: the live status page of a whole one-process simulation (every
network's center and every host on one page, plus the crawl's progress from the synthetic
web's own counts), served with the daemons' own page and JSON (dedupnet/adapters/monitor/status_page.py)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from dedupnet.adapters.monitor.metrics import Counters, serve_http
from dedupnet.adapters.monitor.status_page import POLL_INTERVAL, StatusView, by_label, member_order, recent_errors, routes


class SimStatus:
    """``dedupnet sim --http``: one page for the whole one-process simulation, every
    network's center (a :class:`StatusView` each, the same JSON as a center's own page)
    and every host, plus the crawl's progress from the synthetic web's own counts."""

    def __init__(self, system: Any, web: Any, config: dict):
        self.system, self.web, self.config = system, web, config
        self.started = time.monotonic()
        self.views: dict[int, tuple[Any, StatusView]] = {}
        self.errors = recent_errors()
        self.counters = Counters()  # the page's own endpoint: http_errors
        self.sample()

    def _view(self, n: int, center: Any) -> StatusView:
        held = self.views.get(n)
        if held is None or held[0] is not center:  # a restarted center is a new daemon
            held = self.views[n] = (center, StatusView(center.status, center.counters, center.pools.store, errors=False))
        return held[1]

    def sample(self) -> None:
        for n, center in getattr(self.system, "centers", {}).items():
            self._view(n, center).sample()

    async def run(self) -> None:
        while True:
            await trio.sleep(1.0)
            self.sample()

    async def snapshot(self) -> dict:
        centers = [await self._view(n, c).snapshot() for n, c in sorted(getattr(self.system, "centers", {}).items())]
        hosts = []
        for ip, h in sorted(self.system.hosts.items(), key=lambda kv: member_order(kv[0])):
            body = await h.status() if hasattr(h, "status") else {"ip": ip}
            hosts.append({k: v for k, v in body.items() if k != "counters"}
                         | {"dropped": by_label(body.get("counters", {}), "urls_dropped", "stage")})
        fetched = sum(self.web.answer_counts.values())
        return {
            "role": "sim", "time": round(time.time(), 3), "poll_interval": POLL_INTERVAL, "config": self.config,
            "elapsed": round(time.monotonic() - self.started, 1),
            "progress": {"pages_fetched": fetched, "duplicate_fetches": self.web.duplicate_fetches(),
                         "admitted": sum(c["admitted"]["total"] for c in centers),
                         "admitted_per_s": round(sum(c["admitted"]["per_s"] or 0 for c in centers), 1)},
            "centers": centers, "hosts": hosts, "recent_errors": self.errors.records(),
        }


def serve_sim_status(address: tuple[str, int], config: dict, out=None) -> Callable[[Any, Any], Awaitable[None]]:
    """The ``during`` hook of :func:`dedupnet.harness.sim.simulate` that serves the simulation's
    page on ``address`` while the crawl runs. A port already taken is said on ``out``
    (the crawl goes on without the page)."""

    async def during(system: Any, web: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        view = SimStatus(system, web, config)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(view.run)
            try:
                port = await nursery.start(serve_http, view.counters, *address, routes(view.snapshot))
            except OSError as e:
                print(f"dedupnet sim: no status page on {address[0]}:{address[1]}: {e}", file=out, flush=True)
                nursery.cancel_scope.cancel()
                return
            print(f"  status page: http://{address[0]}:{port}/", file=out, flush=True)
            task_status.started(port)
    return during
