"""Benchmark: the protocol's capacity, real daemons under a crawler's load of found URLs.

``--networks`` x ``--hosts`` daemons as an operator runs them (``dedupnet center`` and
``dedupnet local --no-crawl``, one OS process each, each with its own embedded Redis in a
data dir of its own, as deployed: AOF on, durable acknowledgements), talking real TCP on
loopback. One feeder process per host plays that host's crawler: it writes the links it
"found" into the host's ``URL_pool`` with the crawler's own write
(:func:`local_host.frontier.tasks.fill_discovered`, in one MULTI/EXEC per group of pages), never
more than ``--backlog`` entries ahead of the host's walker, as a crawler's fetch rate
would bound it. ``--urls`` distinct URLs over ``--sites`` sites; each URL is found
1 + Poisson(``--finds`` - 1) times, each time by a host drawn at random (any network),
the repeats up to ``--spread`` windows later: several hosts find the same URL at once
and later on.

Without a crawler the admitted URLs stay in the hosts' ``task_pool`` (and on their
centers' ledgers, unreported): that is what the exactness check reads. Every distinct
URL pushed must be queued in exactly one host's ``task_pool`` and be in its home
center's ``admitted`` record; anything else is counted as admitted twice, lost, or
admitted without being pushed.

Printed while it runs: admitted URLs/s per center, the hosts' backlog, RSS. At each
checkpoint (every tenth of ``--urls`` admitted): CPU per 1,000 admitted URLs by role
(daemon processes; their Redis servers apart), Redis bytes per URL by role (``MEMORY
USAGE`` of every key, and ``used_memory`` growth), RSS. Before the daemons start, the
store bench (bench/bench_store.py) measures what one Redis server checks per second on
this machine at this moment; the summary gives each center's rate against it. A JSON
summary ends the output (and ``--json FILE``).

Run: ``.venv/bin/python bench/bench_capacity.py --urls 10000000 --sites 100000``
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import redis
import trio

# This checkout's code, for the bench and (procplan.daemon_env) its daemons, whatever is
# installed: a baseline run from a worktree of main measures main.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dedupnet.adapters.children import free_port  # noqa: E402
from dedupnet.adapters.monitor.status_page import key_family  # noqa: E402
from dedupnet.adapters.storage.store import ADMITTED, TASK_POOL, URL_POOL, Store  # noqa: E402
from dedupnet.codec.homes import HomeMap  # noqa: E402
from dedupnet.codec.urls import fingerprint_many, normalize  # noqa: E402
from dedupnet.harness.cluster import center_ip, host_ip, lan  # noqa: E402
from dedupnet.harness.procdaemons import Daemon, cpu_seconds, poll_all, start_all, stop_all  # noqa: E402
from dedupnet.harness.procplan import daemon_env  # noqa: E402
from local_host.frontier import sites  # noqa: E402
from local_host.frontier.tasks import fill_discovered  # noqa: E402

#: Links per crawler write: the crawler commits the pages that finished together, each
#: with its links (a few dozen a page), in one transaction.
LINKS_PER_WRITE = 1000
_MULT = 2654435761  # odd, not a multiple of 5: i -> site spreads a run's URLs over every site


# -- the workload -----------------------------------------------------------------------
def url_of(i: int, n_sites: int) -> str:
    return f"http://site{i * _MULT % n_sites}.example/s{i % 97}/page-{i}.html"


def plan(window: int, args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Window ``window``'s finds (the same in every process): URL ids, the host (0..H-1)
    that finds each, and how many windows later it does. The first find of a URL is in
    its own window, its repeats up to ``spread`` windows later."""
    lo, hi = window * args.window, min((window + 1) * args.window, args.urls)
    if lo >= hi:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    rng = np.random.default_rng([args.seed, window])
    counts = 1 + rng.poisson(args.finds - 1, hi - lo)
    ids = np.repeat(np.arange(lo, hi, dtype=np.int64), counts)
    hosts = rng.integers(0, args.networks * args.hosts, len(ids))
    first = np.zeros(len(ids), bool)
    first[np.concatenate(([0], np.cumsum(counts)[:-1]))] = True
    later = np.where(first, 0, rng.integers(0, args.spread + 1, len(ids)))
    return ids, hosts, later


def windows(args) -> int:
    return -(-args.urls // args.window)


def feed(h: int, url: str, prefix: str, args, pushed, stop, record: str) -> None:
    """Host ``h``'s crawler: its finds, window by window, into its URL_pool as the
    crawler writes links, never more than ``backlog`` entries ahead of its walker, until
    all are pushed or ``stop`` is set. The ids it pushed go to ``record``: the
    exactness check counts from what was pushed, not from what was planned."""
    store = Store(url, prefix)
    out = open(record, "ab")
    cache: dict[int, tuple] = {}
    for w in range(windows(args) + args.spread):
        cache = {k: v for k, v in cache.items() if k > w - args.spread - 1}
        mine = []
        for d in range(args.spread + 1):
            src = w - d
            if 0 <= src < windows(args):
                if src not in cache:
                    cache[src] = plan(src, args)
                ids, hosts, later = cache[src]
                mine.append(ids[(hosts == h) & (later == d)])
        ids = np.concatenate(mine) if mine else np.empty(0, np.int64)
        urls = [url_of(int(i), args.sites) for i in ids]
        for k in range(0, len(urls), LINKS_PER_WRITE):
            while store.stream_len(URL_POOL) > args.backlog and not stop.is_set():
                time.sleep(0.02)
            if stop.is_set():
                out.close()
                return
            chunk = urls[k:k + LINKS_PER_WRITE]
            store.transact(functools.partial(fill_discovered, store=store, urls=chunk))
            ids[k:k + LINKS_PER_WRITE].tofile(out)
            out.flush()
            with pushed.get_lock():
                pushed[h] += len(chunk)
    out.close()
    store.close()


# -- the store bench, the daemons -------------------------------------------------------
def store_rate(n: int) -> dict | None:
    """bench/bench_store.py's batched check rate on this machine now (its own server)."""
    if n <= 0:
        return None
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_store.py"), "--urls", str(n),
                          "--baseline-sample", "1000"], capture_output=True, text=True, timeout=1800)
    m = re.search(r"check \(fingerprint\+lookup\)\s+([\d,]+) URLs/s", out.stdout)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"bench_store.py failed:\n{out.stdout}\n{out.stderr[-2000:]}")
    return {"urls": n, "check_urls_per_s": int(m.group(1).replace(",", "")), "output": out.stdout.strip().splitlines()}


def plan_daemons(args, logdir: Path) -> tuple[list[Daemon], list[Daemon]]:
    """The operator's command lines: every daemon its own embedded Redis (``--data-dir``)."""
    cli = [sys.executable, "-m", "dedupnet.cli"]
    conf: list[str] = []
    if args.bucket_bits:  # as docs/DEPLOY.md has an operator who expects a large store set it
        config = logdir / "dedupnet.toml"
        config.write_text(f"bucket_bits = {args.bucket_bits}\n")
        conf = ["--config", str(config)]
    ports = {n: free_port(center_ip(n)) for n in range(1, args.networks + 1)}
    centers, hosts = [], []
    for n, port in ports.items():
        data = logdir / f"center{n}"
        argv = [*cli, "center", *conf, "--network", str(n), "--ip", center_ip(n), "--lan", lan(n),
                "--listen", f"{center_ip(n)}:{port}", "--data-dir", str(data), "--prefix", f"cap:center{n}",
                "--log-level", "WARNING", "--no-discovery"]
        argv += [x for m, p in ports.items() if m != n for x in ("--peer", f"{m},{center_ip(m)}:{p},{lan(m)}")]
        centers.append(Daemon(f"center{n}", "center", n, (center_ip(n), port), f"cap:center{n}", argv,
                              logdir / f"center{n}.log", data_dir=data))
        for i in range(args.hosts):
            ip = host_ip(n, i)
            data = logdir / f"host-{ip}"
            argv = [*cli, "local", *conf, "--network", str(n), "--ip", ip, "--lan", lan(n), "--center",
                    f"{center_ip(n)}:{port}", "--listen", f"{ip}:{free_port(ip)}", "--data-dir", str(data),
                    "--prefix", f"cap:host:{ip}", "--log-level", "WARNING", "--no-crawl"]
            hosts.append(Daemon(ip, "host", n, (ip, int(argv[argv.index("--listen") + 1].rsplit(":", 1)[1])),
                                f"cap:host:{ip}", argv, logdir / f"host-{ip}.log", data_dir=data))
    return centers, hosts


#: What the bench itself sends a daemon's Redis at a checkpoint, not the daemon's work.
BENCH_COMMANDS = frozenset({"info", "memory|usage"})


class Server:
    """A daemon's own Redis: its memory, CPU and RSS."""

    def __init__(self, d: Daemon):
        self.url = d.redis_url("")
        self.prefix = d.prefix
        self.r = redis.Redis.from_url(self.url)
        self.pid = int(self.r.info("server")["process_id"])
        self.base = self.used()
        self.cpu0 = self.cpu()

    def used(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def command_usec(self) -> Counter:
        """The server's time in each of the daemon's commands so far (INFO commandstats),
        in µs; the bench's own look at the server (:data:`BENCH_COMMANDS`) left out."""
        return Counter({name: int(v["usec"]) for name, v in
                        ((k.removeprefix("cmdstat_"), v) for k, v in self.r.info("commandstats").items())
                        if name not in BENCH_COMMANDS})

    def keys(self) -> Counter:
        """MEMORY USAGE (SAMPLES 0) of every key of the daemon, by family."""
        fams: Counter = Counter()
        names = [k for k in self.r.scan_iter(match=f"{self.prefix}:*", count=5000)]
        for i in range(0, len(names), 5000):
            pipe = self.r.pipeline(transaction=False)
            for k in names[i:i + 5000]:
                pipe.memory_usage(k, samples=0)
            for k, size in zip(names[i:i + 5000], pipe.execute()):
                fams[family(k.decode()[len(self.prefix) + 1:])] += size or 0
        return fams


def family(rest: str) -> str:
    """A key's family, one per kind whatever site or member it is of: ``ledger:<ip>``,
    ``task_pool:site:<site>``."""
    if rest.startswith(sites.QUEUE):
        return sites.QUEUE + "<site>"
    return re.sub(r"\d+\.\d+\.\d+\.\d+", "<ip>", key_family(rest))


def rss_mb(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / 1e6
    except psutil.Error:
        return 0.0


def role_of(d: Daemon) -> str:
    return "center" if d.role == "center" else "host"


def checkpoint(daemons: list[Daemon], servers: dict[str, Server], admitted: int, pushed: int, t: float,
               keys: bool) -> dict:
    """Costs so far, summed by role (center, host): daemon CPU, Redis CPU, Redis bytes, RSS."""
    row: dict = {"t": round(t, 1), "admitted": admitted, "pushed": pushed, "roles": {}}
    for role in ("center", "host"):
        mine = [d for d in daemons if role_of(d) == role]
        cpu = sum(d.cpu_used() for d in mine)
        rcpu = sum(servers[d.name].cpu() - servers[d.name].cpu0 for d in mine)
        used = sum(servers[d.name].used() - servers[d.name].base for d in mine)
        fams: Counter = Counter()
        if keys:
            for d in mine:
                fams.update(servers[d.name].keys())
        usec: Counter = Counter()
        for d in mine:
            usec.update(servers[d.name].command_usec())
        row["roles"][role] = {
            "daemon_cpu_s": round(cpu, 2), "redis_cpu_s": round(rcpu, 2),
            "daemon_cpu_ms_per_1k": round(1000 * cpu / max(admitted, 1) * 1000, 2),
            "redis_cpu_ms_per_1k": round(1000 * rcpu / max(admitted, 1) * 1000, 2),
            "used_memory_growth_b_per_url": round(used / max(admitted, 1), 2),
            "rss_mb": {d.name: round(rss_mb(d.proc.pid), 1) for d in mine},
            "redis_rss_mb": {d.name: round(rss_mb(servers[d.name].pid), 1) for d in mine},
            "redis_command_usec": dict(usec),
        }
        if keys:
            total = sum(fams.values())
            row["roles"][role]["key_bytes_per_url"] = round(total / max(admitted, 1), 2)
            row["roles"][role]["key_bytes_by_family"] = {f: round(v / max(admitted, 1), 2) for f, v in
                                                         fams.most_common() if v / max(admitted, 1) >= 0.05}
    return row


def since(row: dict, before: dict | None) -> None:
    """The marginal costs: CPU per 1,000 URLs admitted since the checkpoint before."""
    n = row["admitted"] - (before["admitted"] if before else 0)
    row["interval_s"] = round(row["t"] - (before["t"] if before else 0), 1)
    row["interval_urls_per_s"] = round(n / max(row["interval_s"], 0.1))
    for role, v in row["roles"].items():
        b = before["roles"][role] if before else {"daemon_cpu_s": 0, "redis_cpu_s": 0}
        for k in ("daemon", "redis"):
            cpu = v[f"{k}_cpu_s"] - b[f"{k}_cpu_s"]
            v[f"interval_{k}_cpu_ms_per_1k"] = round(1e6 * cpu / n, 2) if n else 0.0
        # Where the Redis CPU since the last went, by command: what grows with the store.
        usec = Counter(v.get("redis_command_usec", {}))
        usec.subtract(b.get("redis_command_usec", {}))
        v["interval_redis_command_ms_per_1k"] = {c: round(u / n, 2) for c, u in usec.most_common(8)
                                                 if n and u > 0}


def print_checkpoint(row: dict) -> None:
    print(f"  checkpoint {row['admitted']:,} admitted at {row['t']:.0f} s ({row['interval_urls_per_s']:,} URLs/s "
          "since the last): " + "; ".join(
              f"{r}s CPU {v['daemon_cpu_ms_per_1k']:.0f} ms/1k, since the last {v['interval_daemon_cpu_ms_per_1k']:.0f} "
              f"(their Redis {v['redis_cpu_ms_per_1k']:.0f}, {v['interval_redis_cpu_ms_per_1k']:.0f}), "
              f"{v['key_bytes_per_url']:.1f} B/URL keys, {v['used_memory_growth_b_per_url']:.1f} used_memory, "
              f"RSS MB {'/'.join(f'{x:.0f}' for x in v['rss_mb'].values())}"
              for r, v in row["roles"].items()), flush=True)
    print("    their Redis since the last, ms/1k by command: " + "; ".join(
        f"{r}s " + ", ".join(f"{c} {ms:.1f}" for c, ms in list(v["interval_redis_command_ms_per_1k"].items())[:5])
        for r, v in row["roles"].items()), flush=True)


def steady(timeline: list[dict], n: int) -> dict[str, int]:
    """Each center's rate from 10 % to 90 % of the URLs admitted (start-up and the last
    sets' drain left out)."""
    rows = [r for r in timeline if 0.1 * n <= sum(r["admitted"].values()) <= 0.9 * n]
    if len(rows) < 2:
        return {}
    dt = rows[-1]["t"] - rows[0]["t"]
    return {c: round((rows[-1]["admitted"][c] - rows[0]["admitted"][c]) / dt) for c in rows[0]["admitted"]}


def quiet(d: Daemon, st: dict | None) -> bool:
    if not st:
        return False
    pools = st.get("pools", {})
    if d.role == "center":
        return not any(st.get("sets_in_flight", {}).values()) and not pools.get("task_URL")
    return (bool(st.get("connected")) and not pools.get("URL_pool") and not pools.get("unacked_sets")
            and not st.get("sets_in_flight", {}).get("unacked"))


# -- exactness --------------------------------------------------------------------------
def check_exact(args, centers: list[Daemon], hosts: list[Daemon], servers: dict[str, Server], logdir: Path) -> dict:
    """Every distinct URL pushed queued in exactly one host's task_pool and in its home
    center's admitted record; counted from the ids the feeders recorded as pushed."""
    queued, in_stream = [], 0
    for h in hosts:
        store = Store(servers[h.name].url, h.prefix)
        urls = sites.queued_urls(store)
        handed = [f[b"u"].decode() for _, f in store.redis.xrange(store.key(TASK_POOL))]
        in_stream += len(handed)
        queued.append(fingerprint_many(urls + handed))
        store.close()
    tasks = np.sort(np.concatenate(queued)) if queued else np.empty(0, np.uint64)
    unique, counts = np.unique(tasks, return_counts=True)
    homes = HomeMap({n: 1.0 for n in range(1, args.networks + 1)})
    cstores = {c.network: Store(servers[c.name].url, c.prefix) for c in centers}
    ids = np.unique(np.concatenate([np.fromfile(logdir / f"pushed-{i}.bin", dtype=np.int64)
                                    for i in range(len(hosts))]))
    pushed_fps, not_home, in_other = [], 0, 0
    for lo in range(0, len(ids), 200_000):
        urls = [url_of(int(i), args.sites) for i in ids[lo:lo + 200_000]]
        fps = fingerprint_many(urls)
        pushed_fps.append(fps)
        home = np.array([homes.home_of(u) for u in urls])
        for n, s in cstores.items():
            found = s.fp_contains(ADMITTED, fps)
            not_home += int((~found[home == n]).sum())
            in_other += int(found[home != n].sum())
    for s in cstores.values():
        s.close()
    pushed = np.unique(np.concatenate(pushed_fps))
    return {
        "distinct_pushed": int(len(pushed)), "tasks_queued": int(len(tasks)), "tasks_handed_out": in_stream,
        "admitted_twice": int((counts > 1).sum()), "extra_copies": int((counts - 1).sum()),
        "lost": int(len(np.setdiff1d(pushed, unique, assume_unique=True))),
        "admitted_not_pushed": int(len(np.setdiff1d(unique, pushed, assume_unique=True))),
        "missing_from_home_record": not_home, "in_another_centers_record": in_other,
    }


# -- the run ----------------------------------------------------------------------------
async def run(args, logdir: Path, store: dict | None) -> dict:
    centers, hosts = plan_daemons(args, logdir)
    daemons = centers + hosts
    env = daemon_env()
    summary: dict = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "store_bench": store}
    feeders: list[mp.Process] = []
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    try:
        t = time.perf_counter()
        await start_all(centers, hosts, logdir, env, timeout=120)
        print(f"{len(centers)} centers, {len(hosts)} hosts connected in {time.perf_counter() - t:.1f} s "
              f"(logs and data in {logdir})", flush=True)
        servers = {d.name: Server(d) for d in daemons}
        for d in daemons:
            d.mark_cpu()
        pushed = ctx.Array("q", len(hosts))
        for i, h in enumerate(hosts):
            p = ctx.Process(target=feed, args=(i, servers[h.name].url, h.prefix, args, pushed, stop,
                                               str(logdir / f"pushed-{i}.bin")), daemon=True)
            p.start()
            feeders.append(p)
        t0 = time.perf_counter()
        marks = [args.urls * k // 10 for k in range(1, 11)]
        # The first poll prints and samples too: a short run's timeline is never empty.
        checkpoints, timeline, last_print, last = [], [], -args.progress, (0.0, {c.name: 0 for c in centers})
        feed_cpu = {p.pid: 0.0 for p in feeders}
        moved = (0.0, 0)  # when the admitted total last grew, and to what
        while True:
            await trio.sleep(1.0)
            st = await poll_all(daemons)
            now = time.perf_counter() - t0
            admitted = {c.name: int((st.get(c.name) or c.status or {}).get("admitted_total", 0)) for c in centers}
            total = sum(admitted.values())
            for p in feeders:
                feed_cpu[p.pid] = max(feed_cpu[p.pid], cpu_seconds(p.pid))
            if args.duration and now > args.duration and not stop.is_set():
                stop.set()
                print(f"  --duration {args.duration:.0f} s: feeding stopped, draining", flush=True)
            done_feeding = all(not p.is_alive() for p in feeders)
            for p in feeders:
                if not p.is_alive() and p.exitcode != 0:
                    raise RuntimeError(f"a feeder exited with code {p.exitcode}")
            if marks and total >= marks[0]:
                while marks and total >= marks[0]:
                    marks.pop(0)
                row = await trio.to_thread.run_sync(checkpoint, daemons, servers, total, sum(pushed[:]), now, True)
                since(row, checkpoints[-1] if checkpoints else None)
                checkpoints.append(row)
                print_checkpoint(row)
            if now - last_print >= args.progress:
                dt = now - last[0]
                rates = {n: (admitted[n] - last[1][n]) / dt for n in admitted}
                backlog = sum((st.get(h.name) or {}).get("pools", {}).get("URL_pool", 0) for h in hosts)
                rss = {d.name: round(rss_mb(d.proc.pid), 1) for d in daemons}
                rss.update({f"redis:{d.name}": round(rss_mb(servers[d.name].pid), 1) for d in daemons})
                load = os.getloadavg()[0]
                timeline.append({"t": round(now, 1), "admitted": dict(admitted), "pushed": sum(pushed[:]),
                                 "backlog": backlog, "rss_mb": rss, "load": load})
                print(f"[{now:6.0f} s] pushed {sum(pushed[:]):>11,}  admitted {total:>11,}  "
                      + "  ".join(f"{n} {r:,.0f}/s" for n, r in rates.items())
                      + f"  URL_pools {backlog:,}  RSS MB: centers "
                      + "/".join(f"{rss[c.name]:.0f}" for c in centers) + ", hosts "
                      + "/".join(f"{rss[h.name]:.0f}" for h in hosts) + ", their Redis "
                      + "/".join(f"{rss['redis:' + d.name]:.0f}" for d in daemons) + f"  load {load:.1f}", flush=True)
                last_print, last = now, (now, dict(admitted))
            if done_feeding and all(quiet(d, st.get(d.name)) for d in daemons):
                break
            if total > moved[1]:
                moved = (now, total)
            if now > args.timeout or now - moved[0] > args.stall:
                waiting = {c.name: (c.status or {}).get("waiting_for_networks") for c in centers}
                raise RuntimeError(f"not quiescent after {now:.0f} s, nothing admitted for {now - moved[0]:.0f} s "
                                   f"({total:,} admitted); URLs waiting for their home networks: {waiting}")
        wall = time.perf_counter() - t0
        final = await trio.to_thread.run_sync(checkpoint, daemons, servers, total, sum(pushed[:]), wall, True)
        since(final, checkpoints[-1] if checkpoints else None)
        print_checkpoint(final)
        if not checkpoints or checkpoints[-1]["admitted"] != total:
            checkpoints.append(final)
        exact = await trio.to_thread.run_sync(check_exact, args, centers, hosts, servers, logdir)
        counters = {d.name: d.counters() for d in daemons}
        summary.update({
            "wall_s": round(wall, 1), "pushed": sum(pushed[:]), "admitted": total,
            "admitted_per_s": {n: round(a / wall) for n, a in admitted.items()},
            "steady_admitted_per_s": steady(timeline, args.urls),
            "feeder_cpu_s": round(sum(feed_cpu.values()), 1),
            "load_avg_median": sorted(r["load"] for r in timeline)[len(timeline) // 2] if timeline else None,
            "sets_sent": sum(counters[h.name].get("sets_sent", 0) for h in hosts),
            "exact": exact, "checkpoints": checkpoints, "final": final, "timeline": timeline,
        })
        return summary
    finally:
        stop.set()
        for p in feeders:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        with trio.CancelScope(shield=True):
            problems = await stop_all(daemons, 60)
        for p in problems:
            print(f"  warning: {p}", file=sys.stderr)


def targets(s: dict) -> dict:
    """The figures against their targets: each center at least half its store's check
    rate; no role's cost per URL more than 20 % higher at the end than at the first
    checkpoint of at least 1,000,000 URLs before the end (else the first checkpoint)."""
    out: dict = {}
    if s["store_bench"]:
        check = s["store_bench"]["check_urls_per_s"]
        out["center_over_store"] = {n: round(r / check, 4) for n, r in s["admitted_per_s"].items()}
        out["center_at_least_half_store"] = all(r >= 0.5 * check for r in s["admitted_per_s"].values())
    cps = s["checkpoints"]
    first = next((c for c in cps[:-1] if c["admitted"] >= 1_000_000), cps[0])
    end = cps[-1]
    growth = {}
    for role in ("center", "host"):
        for k in ("daemon_cpu_ms_per_1k", "redis_cpu_ms_per_1k", "interval_daemon_cpu_ms_per_1k",
                  "interval_redis_cpu_ms_per_1k", "key_bytes_per_url", "used_memory_growth_b_per_url"):
            a, b = first["roles"][role].get(k), end["roles"][role].get(k)
            if a:
                growth[f"{role} {k}"] = round(b / a, 3)
    out["cost_growth_from"] = first["admitted"]
    out["cost_growth_to"] = end["admitted"]
    out["cost_growth"] = growth
    out["cost_growth_within_20pct"] = all(g <= 1.2 for g in growth.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, default=10_000_000, help="distinct URLs (default 10,000,000)")
    ap.add_argument("--sites", type=int, default=100_000, help="sites they are spread over (default 100,000)")
    ap.add_argument("--networks", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=2, help="hosts per network")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--finds", type=float, default=2.0, help="times each URL is found, on average (>= 1)")
    ap.add_argument("--window", type=int, default=20_000, help="URL ids per window of the find plan")
    ap.add_argument("--spread", type=int, default=5, help="a repeat find comes up to this many windows later")
    ap.add_argument("--backlog", type=int, default=50_000, help="URL_pool entries a feeder keeps at most")
    ap.add_argument("--store-urls", type=int, default=1_000_000, help="bench_store.py's size (0: not run)")
    ap.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--timeout", type=float, default=6 * 3600.0)
    ap.add_argument("--stall", type=float, default=900.0, help="give up when nothing is admitted for this long")
    ap.add_argument("--duration", type=float, help="stop feeding after this many seconds, drain, then check "
                                                   "what was pushed (default: feed every URL)")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--bucket-bits", type=int, default=0,
                    help="every daemon's bucket_bits (its config file; default: the daemons' own default)")
    ap.add_argument("--keep", action="store_true", help="keep the daemons' logs and data")
    args = ap.parse_args()
    if args.finds < 1:
        ap.error("--finds must be at least 1")
    sample = [url_of(i, args.sites) for i in range(0, args.urls, max(args.urls // 1000, 1))]
    assert all(normalize(u) == u for u in sample), "the URLs must be normalised, as the crawler's links are"

    store = store_rate(args.store_urls)
    if store:
        print(f"store bench ({store['urls']:,} URLs): check {store['check_urls_per_s']:,} URLs/s", flush=True)
    logdir = Path(tempfile.mkdtemp(prefix="dedupnet-capacity-"))
    ok = False
    try:
        summary = trio.run(run, args, logdir, store)
        summary["targets"] = targets(summary)
        ok = True
    finally:
        if ok and not args.keep:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"logs and data kept in {logdir}", file=sys.stderr)
    e = summary["exact"]
    f = summary["final"]["roles"]
    print(f"\n{summary['pushed']:,} URLs pushed ({e['distinct_pushed']:,} distinct, {args.sites:,} sites) in "
          f"{summary['wall_s']:.0f} s; {summary['admitted']:,} admitted")
    for n, r in summary["admitted_per_s"].items():
        ratio = f", {r / store['check_urls_per_s']:.3f} of the store's check rate" if store else ""
        print(f"  {n}: {r:,} admitted URLs/s{ratio}; from 10 to 90 % of the URLs: "
              f"{summary['steady_admitted_per_s'].get(n, 0):,}/s")
    if store:
        print(f"  store bench check rate {store['check_urls_per_s']:,} URLs/s")
    for role, v in f.items():
        print(f"  {role}s: CPU {v['daemon_cpu_ms_per_1k']:.0f} ms per 1,000 URLs (their Redis "
              f"{v['redis_cpu_ms_per_1k']:.0f}); Redis bytes per URL {v['key_bytes_per_url']:.1f} keys, "
              f"{v['used_memory_growth_b_per_url']:.1f} used_memory growth: "
              + ", ".join(f"{k} {b}" for k, b in v["key_bytes_by_family"].items()))
    print(f"  admitted twice {e['admitted_twice']}, lost {e['lost']}, admitted but not pushed "
          f"{e['admitted_not_pushed']}, missing from the home center's record {e['missing_from_home_record']}, "
          f"in another center's record {e['in_another_centers_record']}")
    t = summary["targets"]
    print(f"  targets: center >= half the store's rate: {t.get('center_at_least_half_store')}; "
          f"cost growth {t['cost_growth_from']:,} -> {t['cost_growth_to']:,} within 20 %: "
          f"{t['cost_growth_within_20pct']} ({', '.join(f'{k} {g}x' for k, g in t['cost_growth'].items())})")
    text = json.dumps(summary)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if e["admitted_twice"] or e["lost"] or e["admitted_not_pushed"] or e["missing_from_home_record"]:
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
