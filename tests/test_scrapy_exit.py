"""A Scrapy spider given a center (``DEDUPNET_CENTER``) closes when the whole crawl is
complete, and not while another host still holds tasks, whatever ``DEDUPNET_MAX_IDLE``
says: real ``dedupnet center`` / ``dedupnet local --no-crawl`` daemons in two
networks, the example project's spider in subprocesses, the synthetic web.

Only the first network's spider runs at first: the second host's tasks wait in its
``task_pool`` with nobody to fetch them, so the crawl is in progress however long the
first spider has nothing to do. Then the second spider starts, the crawl completes and
both close on the verdict, each soon after the last page."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

pytest.importorskip("scrapy")

from dedupnet.harness import procdaemons, procplan, simproc  # noqa: E402
from dedupnet.harness.report import SimConfig, assign_seeds  # noqa: E402
from dedupnet.adapters.storage.store import Store  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402
from dedupnet.harness.scrapyhost import Spider  # noqa: E402
from tests.helpers import SCRAPY_HOSTS  # noqa: E402

#: Far above what the close on the verdict takes, far below the crawl without it
#: (which never closes: the spiders run with no idle limit that could end them first).
CLOSE_BOUND = 15.0
#: The fallback idle limit the first spider runs with: its wait for the second host
#: lasts several times longer, and it must not close.
MAX_IDLE = 2.0
COMPLETE_LINE = "the crawl is complete in every network"


async def test_a_spider_closes_on_the_cluster_verdict_and_not_while_another_host_holds_tasks(redis_url, tmp_path):
    web = SyntheticWeb(WebSpec(pages=200, sites=6, seed=7), port=0)
    cfg = SimConfig(networks=2, hosts=1, pages=200, sites=6, seed=7, set_size=100, concurrency=8)
    prefix = f"scrapyexit-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    env = procplan.daemon_env()
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        centers, hosts = procplan.plan_daemons(cfg, redis_url, prefix, tmp_path)
        for h in hosts:
            h.argv.append("--no-crawl")
        assert sorted(h.name for h in hosts) == sorted(SCRAPY_HOSTS)
        by_ip = {h.name: h for h in hosts}
        center = "%s:%d" % centers[0].address
        first, second = (Spider(ip, redis_url, by_ip[ip].prefix, Path(tmp_path),
                                extra=("-s", f"DEDUPNET_CENTER={center}", "-s", f"DEDUPNET_MAX_IDLE={MAX_IDLE:g}"))
                         for ip in SCRAPY_HOSTS)
        seeds = web.seeds(3)
        reach = web.reachable_detail(seeds)
        last_fetch = [time.monotonic(), 0]  # when the fetch count last grew, and the count
        exited: dict[str, float] = {}

        async def watch() -> None:
            while True:
                fetched = sum(web.answer_counts.values())
                if fetched != last_fetch[1]:
                    last_fetch[:] = [time.monotonic(), fetched]
                for s in (first, second):
                    if s.proc is not None and s.ip not in exited and s.proc.poll() is not None:
                        exited[s.ip] = time.monotonic()
                await trio.sleep(0.02)

        try:
            await procdaemons.start_all(centers, hosts, tmp_path, env, 60)
            nursery.start_soon(watch)
            first.start(env)
            with trio.move_on_after(30):
                while not first.ready():
                    await trio.sleep(0.1)
            for ip, urls in assign_seeds(list(by_ip), seeds).items():
                await trio.to_thread.run_sync(simproc._push, redis_url, by_ip[ip].prefix, urls)

            # The first spider crawls its share, then has nothing to do for many times
            # DEDUPNET_MAX_IDLE: the second host holds tasks, so it stays.
            with trio.move_on_after(60):
                while not (web.answer_counts and time.monotonic() - last_fetch[0] > 4 * MAX_IDLE):
                    await trio.sleep(0.1)
            assert web.answer_counts, f"the first spider fetched nothing:\n{first.log()[-3000:]}"
            idle_for = time.monotonic() - last_fetch[0]
            waiting = await procdaemons.poll_all([by_ip[SCRAPY_HOSTS[1]]])
            assert waiting[SCRAPY_HOSTS[1]]["pools"]["task_pool"] > 0, "the second host holds no tasks"
            assert first.alive(), (f"the first spider closed while the second host held tasks "
                                   f"(idle {idle_for:.1f} s):\n{first.log()[-3000:]}")
            assert COMPLETE_LINE not in first.log()

            second.start(env)
            with trio.move_on_after(90):
                while len(exited) < 2:
                    await trio.sleep(0.1)
            logs = "\n".join(f"--- {s.ip}\n{s.log()[-3000:]}" for s in (first, second))
            assert len(exited) == 2, f"spiders still running {time.monotonic() - last_fetch[0]:.1f} s after the " \
                                     f"last page; {len(web.answer_counts)} of {len(reach.fetched)} fetched\n{logs}"
            gaps = {ip: round(t - last_fetch[0], 2) for ip, t in exited.items()}
            print(f"closed after the last page (s): {gaps}")
            for s in (first, second):
                assert s.proc.returncode == 0, logs
                assert COMPLETE_LINE in s.log(), logs
                assert "Traceback" not in s.log(), logs
                assert gaps[s.ip] < CLOSE_BOUND, f"closed {gaps} s after the last page\n{logs}"
            assert set(web.answer_counts) == reach.fetched
            assert max(web.answer_counts.values()) == 1
        finally:
            for s in (first, second):
                s.stop()
            await procdaemons.stop_all(centers + hosts, 15)
            for name in [d.prefix for d in centers + hosts]:
                store = Store(redis_url, name)
                store.delete_prefix()
                store.close()
            nursery.cancel_scope.cancel()
