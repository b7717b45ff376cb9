"""What a simulation's processes spent in CPU, by role, and per page fetched.

Every process of the run is counted, from seeding to quiescence: the Redis server
(``INFO cpu``: its own user + system seconds, every node of a cluster), and either

* one process (``dedupnet sim``): the centers' work (timed inside, :class:`CpuMeter`),
  the synthetic web's connections and the harness's own sampling of progress (timed
  the same way), and the rest of the process — the hosts' daemons and crawlers — as
  the process's CPU time less those three; or
* ``--processes``: each center's and host's process (/proc/<pid>/stat, over every
  life), and the harness's own process: its polling of the daemons (timed) and the
  rest, the synthetic web it serves.

The roles add up to the total by construction. "Per page" divides by the requests the
web answered (the report's "requests to the web"), so a figure is comparable across
layouts and checkouts.
"""

from __future__ import annotations

import threading
import time

from dedupnet.adapters.storage.redis_cluster import merged_info

__all__ = ["CpuMeter", "Timed", "cpu_figures", "cpu_lines", "redis_cpu"]


class Timed:
    """Awaits a coroutine, adding the CPU time of this thread spent *inside* it (each
    step between two suspensions) to a meter: what other tasks do while it waits is
    not counted."""

    def __init__(self, coro, meter: "CpuMeter"):
        self._coro, self._meter = coro, meter

    def __await__(self):
        it = self._coro.__await__()
        value, error = None, None
        while True:
            t = time.thread_time()
            try:
                yielded = it.throw(error) if error is not None else it.send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                self._meter.add(time.thread_time() - t)
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                it.close()
                raise
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine, as await would
                error = e


class CpuMeter:
    """CPU time of the centers' work when they run in this process, for the report's
    "center CPU per 1,000 URLs": each center's core (``reactor._handle``), the carrying
    out of its actions (``reactor._execute``, step by step) and its Redis client calls
    (``store.run``, in the worker thread). Not counted: reading and decoding frames in
    the transport tasks and the heartbeats, which --processes (whole-process CPU) does
    count; so the in-process figure is a lower bound of the same thing."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def attach(self, daemon) -> None:
        """Instrument one center daemon (once; a restarted center is a new daemon)."""
        if getattr(daemon, "_sim_cpu_meter", None) is self:
            return
        daemon._sim_cpu_meter = self
        reactor, store = daemon.reactor, daemon.store
        handle, execute, run = reactor._handle, reactor._execute, store.run

        def timed_handle(event):
            t = time.thread_time()
            try:
                return handle(event)
            finally:
                self.add(time.thread_time() - t)

        async def timed_execute(actions):
            return await Timed(execute(actions), self)

        def timed_call(fn, args, kwargs):
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(time.thread_time() - t)

        async def timed_run(fn, *args, **kwargs):
            return await run(timed_call, fn, args, kwargs)

        reactor._handle, reactor._execute, store.run = timed_handle, timed_execute, timed_run

    def attach_web(self, web) -> None:
        """Instrument the synthetic web's connections (before it serves): each one's
        steps, from reading a request to sending its answer."""
        handle = web._handle

        async def timed_handle(stream):
            return await Timed(handle(stream), self)

        web._handle = timed_handle


def redis_cpu(server) -> float | None:
    """CPU seconds (user + system) the server has used since it started, every node of
    a cluster added up; None if it does not say."""
    try:
        info = merged_info(server, "cpu")
    except Exception:  # noqa: BLE001 - a figure of the report, never the run's failure
        return None
    if "used_cpu_user" not in info:
        return None
    return float(info["used_cpu_user"]) + float(info.get("used_cpu_sys", 0.0))


def cpu_figures(roles: dict[str, float | None], pages: int) -> dict:
    """The report's CPU fields from each role's CPU seconds (roles without a figure are
    left out): seconds and milliseconds per page, by role and in all."""
    known = {role: max(s, 0.0) for role, s in roles.items() if s is not None}
    total = sum(known.values())
    return dict(
        cpu_s={role: round(s, 3) for role, s in known.items()},
        cpu_total_s=round(total, 3) if known else None,
        cpu_ms_per_page={role: round(s * 1000 / pages, 3) for role, s in known.items()} if pages else {},
        cpu_total_ms_per_page=round(total * 1000 / pages, 3) if known and pages else None,
    )


def cpu_lines(r) -> str:
    """The report's lines on CPU (empty if the run measured none)."""
    if r.cpu_total_s is None:
        return ""
    roles = "   ".join(f"{role} {r.cpu_ms_per_page.get(role, 0.0):.3f}" for role in r.cpu_s)
    per_page = "n/a" if r.cpu_total_ms_per_page is None else f"{r.cpu_total_ms_per_page:.3f} ms"
    return (f"\n  CPU per page                {per_page:>10}   ({r.cpu_total_s:,.1f} s over {r.requests:,} requests"
            f", every process of the run)"
            f"\n    by role, ms per page      {roles}")
