"""The live status page: what an operator opens in a browser to see a
network and its peers, served on a daemon's HTTP endpoint (``--http HOST:PORT``, the
same server as ``/metrics``).

``GET /`` is one static file, ``dedupnet/adapters/monitor/status.html`` (HTML and a little JavaScript, no
build step), which polls ``GET /status.json`` every two seconds and redraws itself.
The JSON is the daemon's own ``status()`` body (what ``dedupnet status --json``
prints: pools, members, sets in flight, counters, and for a center the detail of
:func:`center_host.daemon.center_detail`), plus what only a page needs: admitted URLs
and pages a second over the last 10 s and, for the charts, over the last 10 minutes,
duplicates dropped by stage, Redis memory per key family (refreshed every 10 s: a SCAN
is not free) and the process's recent warnings and errors. Its fields are documented in
docs/STATUS.md.

``dedupnet sim --http PORT`` serves the same page for a whole one-process simulation
(dedupnet/harness/simpage.py): every network's center on one page, and the hosts.

Why polling rather than server-sent events: the endpoint is a one-request-per-connection
responder with deadlines on everything (dedupnet/adapters/monitor/metrics.py); a poll every 2 s costs a
center one status body, and a page left open can never hold a connection or a task.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
import trio

from dedupnet.adapters.monitor.levels import Levels
from dedupnet.adapters.storage.store import glob_escape
from dedupnet.adapters.monitor.metrics import CONTENT_TYPE, Counters, Route, render_prometheus, serve_http

log = logging.getLogger("dedupnet.adapters.monitor.status_page")

__all__ = ["RecentErrors", "recent_errors", "key_family", "key_memory", "StatusView", "serve_status"]

#: Seconds between two polls of the page (its JavaScript reads it from the JSON).
POLL_INTERVAL = 2.0
#: Admitted URLs a second are measured over this many seconds.
RATE_WINDOW = 10.0
#: Redis memory per key family is measured at most this often (SCAN + MEMORY USAGE).
MEMORY_EVERY = 10.0
#: The rates' history the page charts: one point every ``HISTORY_STEP`` seconds over the
#: last ``HISTORY_SPAN``, kept by the daemon so a page opened now shows the minutes before.
HISTORY_STEP, HISTORY_SPAN = 10.0, 600.0
#: How long the memory scan may take before the page goes on without it.
MEMORY_TIMEOUT = 3.0
#: Sets listed one by one, oldest first.
OLDEST_SETS = 10
#: Upper bounds (seconds) and labels of the age columns of sets in flight.
AGE_BUCKETS = ((1.0, "<1s"), (10.0, "1-10s"), (60.0, "10-60s"), (600.0, "1-10min"), (math.inf, ">=10min"))

_HTML_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    # The page loads nothing but itself and status.json; nothing it shows can run (every
    # value is set as text), and this says so to the browser as well.
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
}
_JSON_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def page_html() -> bytes:
    """The page: package data, so an installed dedupnet has it too (pyproject.toml)."""
    return resources.files("dedupnet.adapters.monitor").joinpath("status.html").read_bytes()


# -- recent errors -----------------------------------------------------------------------
class RecentErrors(logging.Handler):
    """A bounded ring of the latest WARNING and ERROR records, for the page: an operator
    sees what went wrong lately without the daemon's log at hand. Messages are cut to
    ``max_length`` characters (a log line may carry a peer's input)."""

    def __init__(self, capacity: int = 50, max_length: int = 500):
        super().__init__(logging.WARNING)
        self._ring: deque[dict] = deque(maxlen=capacity)
        self.max_length = max_length

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not lose the record
            message = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            message += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        self._ring.append({"time": round(record.created, 3), "level": record.levelname, "logger": record.name,
                           "message": message[:self.max_length]})

    def records(self) -> list[dict]:
        """Oldest first (a deque append is atomic; a copy is safe from any thread)."""
        return list(self._ring)


_RING: RecentErrors | None = None


def recent_errors() -> RecentErrors:
    """The process's ring, installed once on the ``dedupnet`` logger (every daemon logs
    under it). Warnings reach the ring even when the log shows errors only (``--log-level
    ERROR``, the simulation's default): the handlers already there keep showing what they
    showed before."""
    global _RING
    if _RING is None:
        _RING = RecentErrors()
        logger = logging.getLogger("dedupnet")
        level = logger.getEffectiveLevel()
        if level > logging.WARNING:
            for handler in logging.getLogger().handlers:
                if handler.level < level:
                    handler.setLevel(level)
            logger.setLevel(logging.WARNING)
        logger.addHandler(_RING)
    return _RING


# -- Redis memory per key family -----------------------------------------------------------
_NUMERIC = re.compile(r"^\d+$")


def key_family(rest: str) -> str:
    """``finish_URL:517`` -> ``finish_URL``; ``task_pool:fp:3`` -> ``task_pool:fp``: a
    key's name under its daemon's prefix, less the bucket numbers."""
    parts = rest.split(":")
    while len(parts) > 1 and _NUMERIC.match(parts[-1]):
        parts.pop()
    return ":".join(parts)


def key_memory(server: Any, prefix: str, *, cluster: bool = False) -> dict[str, int]:
    """MEMORY USAGE (every element: SAMPLES 0) of each key under ``prefix``, found by
    SCAN, keyed by the name after ``<prefix>:``. On a Redis Cluster a daemon's own keys
    carry their prefix as a hash tag (``{<prefix>}:pool``, or ``{<prefix>:center1}:pool``
    for a run's prefix): those are found too, their braces dropped."""
    escaped = glob_escape(prefix)
    patterns = [f"{escaped}:*"] + ([f"{{{escaped}:*", f"{{{escaped}}}:*"] if cluster else [])
    keys = sorted({k.decode() for pattern in patterns for k in server.scan_iter(match=pattern, count=1000)})
    sizes: dict[str, int] = {}
    for i in range(0, len(keys), 1000):
        chunk = keys[i:i + 1000]
        pipe = server.pipeline(transaction=False)
        for k in chunk:
            pipe.execute_command("MEMORY", "USAGE", k, "SAMPLES", "0")
        for k, size in zip(chunk, pipe.execute(raise_on_error=False)):
            if not isinstance(size, int):
                continue  # gone since the SCAN
            name = k.replace("{", "", 1).replace("}", "", 1) if k.startswith("{") else k
            sizes[name[len(prefix) + 1:]] = size
    return sizes


def memory_by_family(server: Any, prefix: str, *, cluster: bool = False) -> dict[str, int]:
    families: Counter[str] = Counter()
    for rest, size in key_memory(server, prefix, cluster=cluster).items():
        families[key_family(rest)] += size
    return dict(sorted(families.items()))


# -- counters ---------------------------------------------------------------------------
_SERIES = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$')
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def by_label(snapshot: dict[str, int], name: str, label: str) -> dict[str, int]:
    """``{value of label: count}`` over the series of counter ``name`` in a
    :meth:`Counters.snapshot` (a status body carries the snapshot, not the object)."""
    out: Counter[str] = Counter()
    for series, value in snapshot.items():
        m = _SERIES.match(series)
        if m is None or m["name"] != name:
            continue
        labels = dict(_LABEL_PAIR.findall(m["labels"] or ""))
        out[labels.get(label, "")] += value
    return dict(sorted(out.items()))


# -- a center's detail (part of CenterDaemon.status()) ------------------------------------
def member_order(name: str) -> tuple:
    """Members in address order: 127.0.1.9 before 127.0.1.10, net:2 before net:10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.:]", name))


# -- one daemon's page --------------------------------------------------------------------
class StatusView:
    """One daemon's ``/status.json``: its ``status()`` body, plus what only the page
    shows (the module's docstring). ``store``: the daemon's store, whose keys' memory is
    measured (None: not measured). ``errors``: include the process's recent errors."""

    def __init__(self, status: Callable[[], Awaitable[dict]], counters: Counters, store: Any = None, *,
                 errors: bool = True, crawl: Callable[[], Awaitable[dict]] | None = None):
        self.status = status
        self.crawl = crawl
        self.counters = counters
        self.store = store
        self.errors = recent_errors() if errors else None
        self._samples: deque[tuple[float, int, int]] = deque()
        self._memory: dict[str, int] | None = None
        self._memory_at = -math.inf
        self._memory_error: str | None = None
        self._history: deque[tuple[float, int, int]] = deque(maxlen=int(HISTORY_SPAN / HISTORY_STEP))
        self.sample()

    def sample(self) -> None:
        """Record the admitted-URL and page counters (every second, :meth:`run`); the
        window keeps the latest sample that is at least ``RATE_WINDOW`` old, so at most 11
        or so, and every ``HISTORY_STEP`` seconds one goes into the chart's history."""
        now = time.monotonic()
        self._samples.append((now, self.counters.total("urls_admitted"), self.counters.total("pages_done")))
        while len(self._samples) > 1 and self._samples[1][0] <= now - RATE_WINDOW:
            self._samples.popleft()
        if not self._history or now - self._history[-1][0] >= HISTORY_STEP - 0.5:  # one point of the chart's
            self._history.append(self._samples[-1])

    def admitted(self) -> dict:
        """URLs admitted a second over the last ``RATE_WINDOW`` seconds (from the oldest
        sample to now; in a daemon's first seconds, since it started); None in its
        first 0.1 s."""
        return self._rate(1, "urls_admitted")

    def pages(self) -> dict:
        """Pages a host's crawler has done, and a second over the same window."""
        return self._rate(2, "pages_done")

    def _rate(self, field: int, counter: str) -> dict:
        t0, n0, t1, n1 = self._samples[0][0], self._samples[0][field], time.monotonic(), self.counters.total(counter)
        rate = (n1 - n0) / (t1 - t0) if t1 - t0 >= 0.1 else None
        return {"total": n1, "per_s": None if rate is None else round(rate, 1), "window": round(t1 - t0, 1)}

    def history(self) -> dict:
        """URLs admitted and pages crawled a second, per ``step`` seconds, oldest first
        (the last point: since the latest step, as long as it has lasted)."""
        points = [*self._history, (time.monotonic(), self.counters.total("urls_admitted"),
                                   self.counters.total("pages_done"))]
        pairs = [(a, b) for a, b in zip(points, points[1:]) if b[0] - a[0] >= 0.5]
        return {"step": HISTORY_STEP,
                "admitted_per_s": [round((b[1] - a[1]) / (b[0] - a[0]), 1) for a, b in pairs],
                "pages_per_s": [round((b[2] - a[2]) / (b[0] - a[0]), 1) for a, b in pairs]}

    async def run(self) -> None:
        while True:
            await trio.sleep(1.0)
            self.sample()

    async def memory(self) -> dict:
        """Memory per key family, measured at most every ``MEMORY_EVERY`` seconds in a
        worker thread with a deadline; a failed or slow scan keeps the last figures and
        says why."""
        if self.store is None:
            return {}
        if time.monotonic() - self._memory_at >= MEMORY_EVERY:
            self._memory_at = time.monotonic()
            from dedupnet.adapters.storage.store import is_cluster_url

            scan = lambda: memory_by_family(self.store.redis, self.store.prefix,  # noqa: E731
                                            cluster=is_cluster_url(self.store.url))
            try:
                with trio.fail_after(MEMORY_TIMEOUT):
                    self._memory = await trio.to_thread.run_sync(scan, abandon_on_cancel=True)
                self._memory_error = None
            except Exception as e:  # noqa: BLE001 - Redis down or slow: the page goes on
                self._memory_error = f"{type(e).__name__}: {e}"[:200]
                self.counters.inc("status_errors", part="redis_memory")
                log.warning("status page: Redis memory not measured: %s", self._memory_error)
        return {"redis_memory": self._memory, "redis_memory_error": self._memory_error}

    async def snapshot(self) -> dict:
        body = await self.status()
        body.update(time=round(time.time(), 3), poll_interval=POLL_INTERVAL, admitted=self.admitted(),
                    history=self.history(), pages=self.pages(),
                    dropped=by_label(body.get("counters", {}), "urls_dropped", "stage"), **await self.memory())
        if self.errors is not None:
            body["recent_errors"] = self.errors.records()
        if self.crawl is not None:
            body["crawl"] = await self.crawl()
        return body


def routes(snapshot: Callable[[], Awaitable[dict]]) -> dict[str, Route]:
    """``/`` and ``/status.json`` for :func:`dedupnet.adapters.monitor.metrics.serve_http`."""
    html = page_html()

    async def page() -> tuple:
        return "text/html; charset=utf-8", html, _HTML_HEADERS

    async def status_json() -> tuple:
        return "application/json", orjson.dumps(await snapshot()), _JSON_HEADERS

    return {"/": page, "/status.json": status_json}


async def serve_status(counters: Counters, host: str, port: int, status: Callable[[], Awaitable[dict]],
                       store: Any = None, *, crawl: Callable[[], Awaitable[dict]] | None = None,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A daemon's HTTP endpoint (``--http``): ``/metrics`` (with the levels of
    dedupnet/adapters/monitor/levels.py), ``/`` and ``/status.json`` (with ``crawl``, a center's
    verdict on its network's crawl as ``"crawl"``, and as ``crawl_verdict`` on ``/metrics``).
    Reports the bound port through ``task_status``."""
    view = StatusView(status, counters, store, crawl=crawl)
    levels = Levels(counters, status, crawl)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(view.run)

        async def metrics() -> tuple:
            await levels.refresh(nursery)
            return CONTENT_TYPE, render_prometheus(counters).encode("utf-8")

        table = {**routes(view.snapshot), "/metrics": metrics}
        task_status.started(await nursery.start(serve_http, counters, host, port, table))


# -- the simulation's page -----------------------------------------------------------------
