"""A host at rest: the Redis commands a cluster of one center and one host (with its
crawler, nothing to crawl) sends per second, by command, from the server's
``INFO commandstats`` before and after a quiet stretch. What the daemons' timers cost
while nothing happens (docs/BENCHMARKS.md, "A host at rest: what polling costs").

    .venv/bin/python bench/bench_host_at_rest.py [--seconds 20]
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import random
import time

import redis
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness.cluster import open_cluster  # noqa: E402
from local_host.crawler.settings import CrawlerSettings  # noqa: E402

#: Seconds the cluster runs before the count starts (start-up writes are not rest).
SETTLE = 3.0


def _calls(client: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}


async def run(url: str, seconds: float) -> None:
    client = redis.Redis.from_url(url)
    async with open_cluster(url, 1, 1, prefix=f"rest{random.random()}", crawler=CrawlerSettings()):
        await trio.sleep(SETTLE)
        before, t0 = _calls(client), time.monotonic()
        await trio.sleep(seconds)
        after, elapsed = _calls(client), time.monotonic() - t0
    rates = {k: (n - before.get(k, 0)) / elapsed for k, n in after.items() if k != "info" and n > before.get(k, 0)}
    print(f"{sum(rates.values()):.1f} commands/s at rest over {elapsed:.0f} s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the count (default 20)")
    args = parser.parse_args()
    with EmbeddedRedis() as url:
        trio.run(run, url, args.seconds)


if __name__ == "__main__":
    main()
