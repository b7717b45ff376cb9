"""A crawl of the synthetic web by real daemons in several networks, one host each,
crawled by dedupnet's own crawler (``crawler``), by a URLFrontier client per host
(``frontier``: ``examples/urlfrontier/crawl.py``, stubs from the stock .proto, httpx,
nothing of dedupnet) or by a Scrapy spider per host (``scrapy``: the example project's
``follow`` spider on dedupnet's scheduler), so that they can be checked and timed on
the same web.

In ``frontier`` mode every host runs ``--no-crawl --frontier IP:PORT`` and its client
is the only thing that touches it: the seeds go in as ``PutURLs`` discovered items,
and each client fetches from its host's IP, so the web's own request log says who
fetched what. In ``scrapy`` mode every host runs ``--no-crawl`` and its spider, bound
to the host's IP, takes the host's tasks; the seeds go into the hosts' pools once every
spider has taken up its host. The run ends when every daemon is quiescent (nothing in any pool, no set
in flight: a URL leased to a client is still in its host's ``task_pool``).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dedupnet.adapters.children import free_port, spawn
from dedupnet.adapters.storage.store import Store
from dedupnet.harness import procdaemons, procplan, simproc
from dedupnet.harness.procdaemons import Daemon
from dedupnet.harness.report import SimConfig, assign_seeds
from dedupnet.harness.scrapyhost import Spider
from dedupnet.harness.web import Reach, SyntheticWeb, WebSpec

__all__ = ["CLIENT", "PATHS", "Crawl", "crawl"]

CLIENT = Path(__file__).resolve().parents[2] / "examples" / "urlfrontier" / "crawl.py"
#: Status polls in a row that must find every daemon quiescent.
QUIET_POLLS = 3
#: The crawlers a run can have on its hosts.
PATHS = ("crawler", "frontier", "scrapy")


@dataclass
class Crawl:
    """What a run left: the web (its counts and request log), the ground truth from the
    seeds, the seconds from the first page request to the last, and the CPU seconds of
    the daemons and of the clients (URLFrontier clients or spiders, from their launch;
    0 without them) over the run."""

    web: SyntheticWeb
    reach: Reach
    seconds: float
    daemon_cpu: float
    client_cpu: float
    client_lines: list[str] = field(default_factory=list)

    @property
    def pages(self) -> int:
        return sum(self.web.answer_counts.values())

    @property
    def lost(self) -> set[str]:
        return self.reach.fetched - set(self.web.answer_counts)

    @property
    def extra(self) -> set[str]:
        return set(self.web.answer_counts) - self.reach.fetched


async def crawl(cfg: SimConfig, redis_url: str, prefix: str, logdir: Path, *, path: str,
                workers: int = 16, timeout: float = 120.0) -> Crawl:
    """Crawl the web of ``cfg`` (``cfg.hosts`` hosts per network) from ``cfg.seeds``
    seeds to quiescence with the crawlers of ``path`` (one of PATHS; ``workers``:
    requests in flight per client or spider); the daemons' keys are removed afterwards.
    DaemonFailed or TimeoutError (with the logs' place) if it does not get there."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, not {path!r}")
    web = SyntheticWeb(WebSpec(pages=cfg.pages, sites=cfg.sites, seed=cfg.seed), port=0)
    env = procplan.daemon_env()
    clients: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        seeds = web.seeds(cfg.seeds)
        reach = web.reachable_detail(seeds)
        centers, hosts = procplan.plan_daemons(cfg, redis_url, prefix, logdir)
        services, spiders = _fit_hosts(hosts, path, workers, redis_url, logdir)
        daemons = centers + hosts
        try:
            await procdaemons.start_all(centers, hosts, logdir, env, 60)
            plan = assign_seeds([h.name for h in hosts], seeds)
            for d in daemons:
                d.mark_cpu()
            if path == "frontier":
                _start_frontier_clients(hosts, services, plan, workers, logdir, env, clients, logs)
            else:
                await _start_spiders(spiders, plan, redis_url, prefix, logdir, env, clients, logs)
            await _wait_quiescent(web, reach, daemons, clients, logs, timeout, logdir)
            daemon_cpu = sum(d.cpu_used() for d in daemons)
            client_cpu = {name: procdaemons.cpu_seconds(p.pid) for name, p in clients.items()}
        finally:
            _stop_clients(spiders, clients)
            await procdaemons.stop_all(daemons, 15)
            keys = Store(redis_url, prefix)
            keys.delete_prefix()
            keys.close()
            nursery.cancel_scope.cancel()
    times = [t for t, _site, target, _client in web.request_log if target != "/robots.txt"]
    # A URLFrontier client's last line says what it did; a spider's log is Scrapy's.
    lines = [logs[name].read_text(errors="replace").strip().splitlines()[-1:] for name in clients
             if path == "frontier"]
    return Crawl(web, reach, max(times) - min(times) if times else 0.0, daemon_cpu,
                 sum(client_cpu.values()), [x for part in lines for x in part])


def _fit_hosts(hosts: list[Daemon], path: str, workers: int, redis_url: str,
               logdir: Path) -> tuple[dict[str, str], list[Spider]]:
    """The hosts' command lines for ``path``: ``frontier``, each host serves URLFrontier
    (returned: its address per host); ``scrapy``, each host's spider (returned); neither
    crawls itself."""
    services = {}
    spiders = []
    for h in hosts:
        if path == "frontier":
            services[h.name] = f"{h.name}:{free_port(h.name)}"
            h.argv += ["--no-crawl", "--frontier", services[h.name]]
        elif path == "scrapy":
            h.argv.append("--no-crawl")
            # Politeness off, as for the other crawlers: no per-site bound below the total.
            spiders.append(Spider(h.name, redis_url, h.prefix, logdir, (
                "-s", f"CONCURRENT_REQUESTS={workers}", "-s", f"CONCURRENT_REQUESTS_PER_DOMAIN={workers}",
                "-s", "DOWNLOAD_DELAY=0")))
    return services, spiders


def _start_frontier_clients(hosts: list[Daemon], services: dict[str, str], plan: dict[str, list[str]], workers: int,
                            logdir: Path, env: dict, clients: dict[str, subprocess.Popen],
                            logs: dict[str, Path]) -> None:
    """One URLFrontier client per host, its seeds on its command line."""
    for h in hosts:
        argv = [sys.executable, str(CLIENT), "--frontier", services[h.name], "--bind", h.name,
                "--workers", str(workers)] + [a for u in plan[h.name] for a in ("--seed", u)]
        logs[h.name] = logdir / f"client-{h.name}.log"
        with open(logs[h.name], "ab") as log:
            clients[h.name] = spawn(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=logdir, env=env)


async def _start_spiders(spiders: list[Spider], plan: dict[str, list[str]], redis_url: str, prefix: str,
                         logdir: Path, env: dict, clients: dict[str, subprocess.Popen],
                         logs: dict[str, Path]) -> None:
    """Every spider started (``clients`` and ``logs`` get each); the seeds pushed once
    every one has taken up its host."""
    for s in spiders:
        s.start(env)
        clients[s.ip], logs[s.ip] = s.proc, s.log_path
    with trio.move_on_after(60) as scope:
        while not all(s.ready() for s in spiders):
            await trio.sleep(0.1)
            for s in spiders:
                if not s.alive():
                    raise procdaemons.DaemonFailed(f"the spider of {s.ip} exited: {s.log_path}")
    if scope.cancelled_caught:
        raise TimeoutError(f"a spider did not take up its host in 60 s; logs in {logdir}")
    for ip, urls in plan.items():
        await trio.to_thread.run_sync(simproc._push, redis_url, f"{prefix}:host:{ip}", urls)


async def _wait_quiescent(web: SyntheticWeb, reach: Reach, daemons: list[Daemon],
                          clients: dict[str, subprocess.Popen], logs: dict[str, Path], timeout: float,
                          logdir: Path) -> None:
    """Until every daemon is quiescent ``QUIET_POLLS`` polls in a row; DaemonFailed if a
    client exits first, TimeoutError after ``timeout``."""
    quiet = 0
    with trio.move_on_after(timeout) as scope:
        while quiet < QUIET_POLLS:
            await trio.sleep(0.2)
            for name, proc in clients.items():
                if proc.poll() is not None:
                    raise procdaemons.DaemonFailed(f"the crawler of {name} exited: {logs[name]}")
            st = await procdaemons.poll_all(daemons)
            # Not quiescent before the first page: the seeds may still be on their way in.
            quiet = quiet + 1 if web.answer_counts and all(
                procdaemons.is_quiet(d, st.get(d.name)) for d in daemons) else 0
    if scope.cancelled_caught:
        raise TimeoutError(f"not quiescent after {timeout:.0f} s; {len(web.answer_counts)} of "
                           f"{len(reach.fetched)} URLs fetched; logs in {logdir}")


def _stop_clients(spiders: list[Spider], clients: dict[str, subprocess.Popen]) -> None:
    for s in spiders:
        s.stop()
    for proc in clients.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in clients.values():
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
