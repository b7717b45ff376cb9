"""``dedupnet local --exit-when-complete``: a host leaves and exits 0 once its center
says the whole crawl is complete, and not while it cannot be: real ``dedupnet center``
/ ``dedupnet local`` processes in two networks, their crawlers on the synthetic web.

The hosts are started before the seeds are in: a crawl that has admitted nothing is
"not started", no reason to exit. A host whose other network's center is down stays:
that network's work is unknown, so the verdict is "stuck", never "complete"."""

from __future__ import annotations

import os
import time
from contextlib import asynccontextmanager
from types import SimpleNamespace

import trio

from dedupnet.adapters.storage.store import Store
from dedupnet.harness import procdaemons, procplan, simproc
from dedupnet.harness.report import SimConfig, assign_seeds
from dedupnet.harness.web import SyntheticWeb, WebSpec

#: Far above what the exit on the verdict takes (an ask every second, two passes a
#: second apart, an empty hand-back), far below never.
EXIT_BOUND = 10.0
#: How long a host that cannot see a complete crawl is watched after its last page:
#: several asks of its center.
STAY_FOR = 8.0
COMPLETE_LINE = "the crawl is complete in every network"


class Fetches:
    """When the web last answered a new request, and which daemons have exited when."""

    def __init__(self, web: SyntheticWeb):
        self.web = web
        self.last = [time.monotonic(), 0]
        self.exited: dict[str, float] = {}

    async def watch(self, hosts) -> None:
        while True:
            fetched = sum(self.web.answer_counts.values())
            if fetched != self.last[1]:
                self.last[:] = [time.monotonic(), fetched]
            for h in hosts:
                if h.proc is not None and h.name not in self.exited and h.proc.poll() is not None:
                    self.exited[h.name] = time.monotonic()
            await trio.sleep(0.02)


@asynccontextmanager
async def deployment(tmp_path, redis_url, seed: int):
    """The web served, two networks of one host each planned (hosts with
    ``--exit-when-complete``), started by the test; stopped and cleaned up after it."""
    web = SyntheticWeb(WebSpec(pages=150, sites=6, seed=seed), port=0)
    cfg = SimConfig(networks=2, hosts=1, pages=150, sites=6, seed=seed, set_size=50, concurrency=8)
    prefix = f"localexit-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        centers, hosts = procplan.plan_daemons(cfg, redis_url, prefix, tmp_path)
        for h in hosts:
            h.argv.append("--exit-when-complete")
        try:
            yield SimpleNamespace(web=web, centers=centers, hosts=hosts, seen=Fetches(web), nursery=nursery,
                                  env=procplan.daemon_env())
        finally:
            await procdaemons.stop_all(centers + hosts, 15)
            for d in centers + hosts:
                store = Store(redis_url, d.prefix)
                store.delete_prefix()
                store.close()
            nursery.cancel_scope.cancel()


async def test_hosts_exit_soon_after_the_last_page_of_a_complete_crawl(redis_url, tmp_path):
    async with deployment(tmp_path, redis_url, 5) as run:
        web, centers, hosts, seen = run.web, run.centers, run.hosts, run.seen
        seeds = web.seeds(3)
        reach = web.reachable_detail(seeds)
        await procdaemons.start_all(centers, hosts, tmp_path, run.env, 60)
        run.nursery.start_soon(seen.watch, hosts)
        await trio.sleep(3.0)  # several asks: a crawl not started yet is no reason to exit
        assert not seen.exited, [h.log_tail() for h in hosts]
        by_ip = {h.name: h for h in hosts}
        for ip, urls in assign_seeds(list(by_ip), seeds).items():
            await trio.to_thread.run_sync(simproc._push, redis_url, by_ip[ip].prefix, urls)
        with trio.move_on_after(90):
            while len(seen.exited) < len(hosts):
                await trio.sleep(0.1)
        logs = "\n".join(f"--- {h.name}\n{h.log_tail()}" for h in hosts)
        assert len(seen.exited) == len(hosts), (
            f"hosts still running {time.monotonic() - seen.last[0]:.1f} s after the last page; "
            f"{len(web.answer_counts)} of {len(reach.fetched)} fetched\n{logs}")
        gaps = {ip: round(t - seen.last[0], 2) for ip, t in seen.exited.items()}
        print(f"exited after the last page (s): {gaps}")
        for h in hosts:
            text = h.log_path.read_text()
            assert h.proc.returncode == 0, logs
            assert sum(COMPLETE_LINE in line and "INFO" in line for line in text.splitlines()) == 1, logs
            assert "Traceback" not in text, logs
            assert gaps[h.name] < EXIT_BOUND, f"exited {gaps} s after the last page\n{logs}"
        assert set(web.answer_counts) == reach.fetched  # 0 lost
        assert max(web.answer_counts.values()) == 1  # 0 duplicates
        assert all(c.alive() for c in centers)


async def test_a_host_stays_while_another_networks_center_is_down(redis_url, tmp_path):
    async with deployment(tmp_path, redis_url, 6) as run:
        center, host = run.centers[0], run.hosts[0]  # network 1 only: network 2's center never starts
        assert (center.network, host.network) == (1, 1)
        center.start(tmp_path, run.env)
        host.start(tmp_path, run.env)
        with trio.fail_after(60):
            while not ((await host.poll_status()) or {}).get("connected"):
                host.check_alive()
                await trio.sleep(0.2)
        run.nursery.start_soon(run.seen.watch, [host])
        await trio.to_thread.run_sync(simproc._push, redis_url, host.prefix, run.web.seeds(3))
        with trio.fail_after(60):  # it crawls what it can
            while not (run.web.answer_counts and time.monotonic() - run.seen.last[0] > 2.0):
                await trio.sleep(0.1)
        await trio.sleep(STAY_FOR)
        assert host.alive(), f"the host exited while network 2's center is down:\n{host.log_tail()}"
        assert COMPLETE_LINE not in host.log_path.read_text()
        assert await procdaemons.stop_all([host, center], 15) == [] and host.proc.returncode == 0
