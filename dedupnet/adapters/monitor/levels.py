"""The levels ``/metrics`` shows as gauges — pool sizes, members by state, sets in flight
by stage and age, URLs waiting for a peer network, tasks a host holds, a center's
verdict on its network's crawl — read from the daemon's own ``status()`` body when
``/metrics`` is scraped.

Why from the status body: it is what ``dedupnet status``, the status page and ``status
--cluster`` already read, so a gauge and the page cannot disagree, and the daemons keep
no second bookkeeping. Why at scrape time: a level set by a loop is as old as the loop's
last turn, and one whose member went away would stay at its last value.

A scrape must answer even when the daemon's Redis does not: the status is read in a
task of its own, and a scrape that does not get it within ``LEVELS_TIMEOUT`` shows
``store_up 0`` without the levels (Prometheus then sees them absent, not stale).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from dedupnet.adapters.monitor.metrics import Counters

__all__ = ["LEVELS", "LEVELS_TIMEOUT", "levels_of", "verdict_levels", "Levels"]

log = logging.getLogger("dedupnet.adapters.monitor.levels")

#: Seconds a scrape waits for the daemon's status, and again for a center's verdict.
LEVELS_TIMEOUT = 2.0

#: The gauges set here (dedupnet/adapters/monitor/metric_catalog.py declares them).
LEVELS = frozenset({
    "info", "store_up", "pool_entries", "members", "member_up", "member_silent_seconds", "sets_in_flight",
    "sets_oldest_age_seconds", "sets_held_back", "sets_waiting", "urls_waiting", "task_urls",
    "reported_task_pool", "center_connected", "pages_in_progress", "fetch_slots_in_use", "frontier_sites",
    "frontier_ready_wait_seconds",
})
VERDICTS = ("complete", "in progress", "stuck", "not started", "unknown")

Series = list[tuple[str, dict, float]]


def levels_of(body: dict) -> Series:
    """The gauges of one status body (a center's or a host's)."""
    role = body.get("role", "")
    out: Series = [("info", {"role": role, "network": body.get("network", "")}, 1), ("store_up", {}, 1)]
    out += [("pool_entries", {"pool": pool}, n) for pool, n in sorted(body.get("pools", {}).items())]
    out += [("sets_in_flight", {"stage": stage}, n) for stage, n in sorted(body.get("sets_in_flight", {}).items())]
    if role == "center":
        out += _center_levels(body)
    elif role == "host":
        out.append(("center_connected", {}, int(bool(body.get("connected")))))
        crawler = body.get("crawler")
        if crawler is not None:
            out.append(("pages_in_progress", {}, crawler.get("in_progress", 0)))
            out.append(("fetch_slots_in_use", {}, crawler.get("on_the_wire", 0)))
        frontier = body.get("frontier")
        if frontier is not None:
            out += [("frontier_sites", {"state": "queued"}, frontier["sites_queued"]),
                    ("frontier_sites", {"state": "waiting"}, frontier["sites_waiting"]),
                    ("frontier_ready_wait_seconds", {}, frontier["ready_wait"])]
    return out


def _center_levels(body: dict) -> Series:
    out: Series = []
    states = {(kind, state): 0 for kind in ("host", "peer") for state in ("live", "late", "down")}
    for entry in body.get("liveness", []):
        member, kind = entry["member"], entry["kind"]
        states[kind, entry["state"]] = states.get((kind, entry["state"]), 0) + 1
        out.append(("member_up", {"member": member, "kind": kind}, int(entry["state"] != "down")))
        if entry.get("silent") is not None:
            out.append(("member_silent_seconds", {"member": member, "kind": kind}, entry["silent"]))
        if kind == "host" and entry.get("task_pool") is not None:
            out.append(("reported_task_pool", {"host": member}, entry["task_pool"]))
    out += [("members", {"kind": kind, "state": state}, n) for (kind, state), n in sorted(states.items())]
    out += [("sets_oldest_age_seconds", {"stage": stage}, detail["oldest"])
            for stage, detail in sorted(body.get("sets", {}).items())]
    out.append(("sets_held_back", {}, body.get("frames_held", 0)))
    out += [("sets_waiting", {"member": member}, n) for member, n in sorted(body.get("waiting_for", {}).items())]
    out += [("urls_waiting", {"network": network.removeprefix("net:")}, n)
            for network, n in sorted(body.get("waiting_for_networks", {}).items())]
    out += [("task_urls", {"host": host or "none"}, n) for host, n in sorted(body.get("task_URL_per_host", {}).items())]
    return out


def verdict_levels(verdict: str) -> Series:
    """``crawl_verdict{verdict}``: 1 for ``verdict``, 0 for the others."""
    return [("crawl_verdict", {"verdict": v}, int(v == verdict)) for v in VERDICTS]


class Levels:
    """Refreshes a daemon's level gauges in ``counters`` for each scrape (:meth:`refresh`).
    ``crawl``: a center's verdict on its network (its ``crawl_report``); None for a host."""

    def __init__(self, counters: Counters, status: Callable[[], Awaitable[dict]],
                 crawl: Callable[[], Awaitable[dict]] | None = None):
        self.counters = counters
        self.status = status
        self.crawl = crawl
        self._reading: trio.Event | None = None  # set when the read in progress ends
        self._status_read = False  # the read in progress has its status body

    async def refresh(self, nursery: trio.Nursery) -> None:
        """Read the levels, waiting at most ``LEVELS_TIMEOUT`` for the status and as long
        again for the verdict; a status not read by then is ``store_up 0``. One read at a
        time: a scrape that finds one running waits for it, never starts a second behind
        a Redis that hangs."""
        if self._reading is None:
            self._reading, self._status_read = trio.Event(), False
            nursery.start_soon(self._read, self._reading)
        with trio.move_on_after(2 * LEVELS_TIMEOUT):
            await self._reading.wait()
        if self._reading is not None and not self._status_read:
            self._not_read()

    def _not_read(self) -> None:
        series = [("store_up", {}, 0)] + (verdict_levels("unknown") if self.crawl is not None else [])
        self.counters.replace_gauges((LEVELS | {"crawl_verdict"}) - {"info"}, series)

    async def _read(self, done: trio.Event) -> None:
        try:
            body = await self.status()
        except Exception as e:  # noqa: BLE001 - Redis down: the scrape says so, the daemon goes on
            log.debug("levels not read: %s: %s", type(e).__name__, e)
            self._not_read()
        else:
            self._status_read = True
            self.counters.replace_gauges(LEVELS, levels_of(body))
            if self.crawl is not None:
                verdict = "unknown"
                with trio.move_on_after(LEVELS_TIMEOUT):
                    try:
                        verdict = (await self.crawl())["verdict"]
                    except Exception as e:  # noqa: BLE001 - a host that fails its answer: not judged
                        log.debug("crawl verdict not judged: %s: %s", type(e).__name__, e)
                self.counters.replace_gauges({"crawl_verdict"}, verdict_levels(verdict))
        finally:
            self._reading = None
            done.set()
