"""Benchmark: Redis bytes per URL of a whole deployment's state, by role and key family.

One center and ``--hosts`` hosts (one network), each under its own prefix on one embedded
server, are taken through what a crawl of ``--urls`` distinct URLs writes, by the pools'
own write paths: each host sends its found URLs in sets of ``--set-size`` (saved
unacknowledged, then released into the re-offer log), the center admits them (its
``admitted`` record, the concluded number, the assignment per host in ``task_URL`` and
its ``task_log``, then dropped when acknowledged), the host queues them (``task_pool``,
``task_pool:fp``) and its crawler finishes them (``finish_URL``, the entries gone). No
network, no crawler: what is left at the end is the state a finished crawl keeps.

Printed: the sum of ``MEMORY USAGE`` (``SAMPLES 0``) of every key, per URL, by role and
family, and the growth of ``used_memory``. The same script runs the code before a change
(``PYTHONPATH=<old checkout>``): it uses only the pools' long-standing calls.

Run: ``.venv/bin/python bench/bench_state_bytes.py --urls 10000 100000 1000000``
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import collections
import time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from center_host.events import Admit, Conclude, DropTask, SaveTask  # noqa: E402
from center_host.pools import CenterPools  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.monitor.status_page import key_family  # noqa: E402
from dedupnet.adapters.storage.store_choice import store_for  # noqa: E402
from dedupnet.codec.messages import Frame  # noqa: E402
from dedupnet.codec.wire import encode_frame  # noqa: E402
from local_host import protocol as hp  # noqa: E402
from local_host.pools import HostPools  # noqa: E402
from local_host.frontier.tasks import finish_tasks  # noqa: E402

LOG = 256  # rewind_log's default


def urls_of(start: int, n: int, sites: int) -> list[str]:
    return [f"http://site{i % sites}.example/section{i // 7 % 50}/page-{i}.html" for i in range(start, start + n)]


def measure(r, prefixes: dict[str, str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for role, prefix in prefixes.items():
        fams: collections.Counter[str] = collections.Counter()
        for k in r.scan_iter(match=f"{prefix}:*", count=1000):
            fams[key_family(k.decode()[len(prefix) + 1:])] += r.memory_usage(k, samples=0) or 0
        out[role] = dict(fams)
    return out


def run(url: str, n: int, hosts: int, set_size: int, sites: int) -> tuple[dict, int]:
    center = store_for(url, "s:center")
    host_stores = [store_for(url, f"s:host{h}") for h in range(hosts)]
    cpools = CenterPools(center, task_log=LOG)
    hpools = [HostPools(s, exact=True, release_log=LOG) for s in host_stores]
    for p in hpools:
        p.setup()
    number = 0
    for start in range(0, n, set_size):
        urls = urls_of(start, min(set_size, n - start), sites)
        h = (start // set_size) % hosts
        number += 1
        frame = encode_frame(Frame(dict.fromkeys(urls, 0), f"10.0.0.{h}", number, 1))
        hpools[h].apply([hp.SaveUnacked(number, frame, (b"0-1",))])
        share = collections.defaultdict(list)
        for u in urls:
            share[hash(u.split("/")[2]) % hosts].append(u)
        keys = [f"{number}:10.0.0.{t}" for t in share]
        cpools.apply([Admit(number, tuple(urls)), Conclude(number, b"")]
                     + [SaveTask(k, tuple(share[t])) for k, t in zip(keys, share)])
        hpools[h].apply([hp.Release(number, (b"0-1",), frame)])
        for t, mine in share.items():
            hpools[t].apply([hp.AddTasks(tuple(mine))])
        cpools.apply([DropTask(k) for k in keys])
        for t in share:
            s = host_stores[t]
            entries = s.redis.xrange(s.key("task_pool"))
            eids = [e for e, _ in entries]
            done = [f[b"u"].decode() for _, f in entries]
            s.transact(lambda b, s=s, eids=eids, done=done: finish_tasks(b, s, eids, done, done, None))
    prefixes = {"center": "s:center", **{f"host{h}": f"s:host{h}" for h in range(hosts)}}
    return measure(center.redis, prefixes), center.used_memory()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--urls", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--set-size", type=int, default=1000)
    p.add_argument("--sites", type=int, default=60)
    args = p.parse_args()
    for n in args.urls:
        with EmbeddedRedis() as url:
            base = store_for(url, "s:base").used_memory()
            t0 = time.monotonic()
            fams, used = run(url, n, args.hosts, args.set_size, args.sites)
        total = sum(v for f in fams.values() for v in f.values())
        by = collections.Counter()
        for role, f in fams.items():
            for fam, v in f.items():
                by[("center " if role == "center" else "hosts ") + fam] += v
        detail = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v / n >= 0.05)
        print(f"{n:>10,} URLs: {total / n:6.1f} B/URL (keys), {(used - base) / n:6.1f} (used_memory growth); "
              f"{detail}  [{time.monotonic() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
