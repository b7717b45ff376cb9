"""Benchmark: what a center's Redis spends per URL on a host's ledger as it grows, in the
three layouts it has had (docs/PROTOCOL.md section 12): a set of the URLs' text
(``ledger:<host>``), deflated blocks with a bucketed fingerprint set beside them
(``ledger_fp:<host>``, 256 buckets), and the blocks alone (their bits are written only
for the blocks a report touches: nothing per URL given).

Prints, at each tenth of ``--urls`` given in tasks of ``--task`` URLs, the server's CPU
per URL given (``INFO commandstats``, the write commands) and ``used_memory`` per URL.
No crawler: nothing is reported, as in bench/bench_capacity.py.

Run: ``.venv/bin/python bench/bench_ledger_redis.py [--urls 2500000] [--task 500]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, whatever is installed

from center_host.ledger import deflate  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import Store  # noqa: E402
from dedupnet.codec.urls import fingerprint_many  # noqa: E402

LAYOUTS = ("text", "fingerprints", "blocks")


def task_urls(rnd: random.Random, t: int, n: int) -> list[str]:
    return sorted({f"http://site{rnd.randrange(100_000)}.example/d{t % 97}/p{t}-{i}.html" for i in range(n)})


def write_usec(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_sadd", "cmdstat_hset"))


def run(url: str, layout: str, urls: int, task: int) -> list[tuple[int, float, float]]:
    client = redis.Redis.from_url(url)
    client.execute_command("FLUSHALL", "SYNC")  # the layout before freed at once: its bytes are not counted here
    client.config_resetstat()
    store = Store(url, "ledger")
    base = client.info("memory")["used_memory"]
    rnd = random.Random(1)
    rows, last, given, tenth = [], 0, 0, urls // 10
    for t in range(urls // task):
        batch = store.batch()
        part = task_urls(rnd, t, task)
        if layout == "text":
            batch.add(b"SADD", store.key("ledger:h"), *part)
        else:
            if layout == "fingerprints":
                batch.fingerprints(b"SADD", store.key("ledger_fp:h"), fingerprint_many(part))
            batch.add(b"HSET", store.key("ledger_blocks:h"), t + 1, deflate(part))
        store.execute(batch)
        given += len(part)
        if (t + 1) * task % tenth == 0:
            spent = write_usec(client)
            rows.append((given, (spent - last) / tenth, (client.info("memory")["used_memory"] - base) / given))
            last = spent
    store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=2_500_000, help="URLs given to one host (default 2,500,000)")
    parser.add_argument("--task", type=int, default=500, help="URLs a task (default 500)")
    args = parser.parse_args()
    with EmbeddedRedis() as url:
        results = {layout: run(url, layout, args.urls, args.task) for layout in LAYOUTS}
    print("URLs on the ledger | " + " | ".join(f"{layout}: us / URL, B / URL" for layout in LAYOUTS))
    for i, (given, *_) in enumerate(results["text"]):
        print(f"{given:>12,} | " + " | ".join(f"{results[layout][i][1]:.3f}, {results[layout][i][2]:.1f}"
                                            for layout in LAYOUTS))


if __name__ == "__main__":
    main()
