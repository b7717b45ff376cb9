"""How the crawl's load fell on the web, from the synthetic web's own request log (who
asked which site, when), not from anything the daemons say.

Politeness (``per_site_delay``, ``per_site_concurrency``, robots.txt) is kept by each
host for the sites it crawls, so it holds for the whole system only if every site is
crawled by one host: :func:`load_spread` counts the sites that were not, and the most
hosts one site saw within any second. It also gives how evenly
the pages fell on the networks and hosts. A *page* is any request but robots.txt
(503s, 404s and redirects included: each is a request the site answered).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from dedupnet.harness.cluster import network_of_host

__all__ = ["load_spread"]

ROBOTS = "/robots.txt"
WINDOW = 1.0  # seconds: what "at once" means for a site's politeness


def load_spread(log: Iterable[tuple[float, str, str, str]], *, networks: int, hosts: Iterable[str] = ()) -> dict:
    """Figures of a request log of ``(time, site, target, client address)`` entries, for a
    layout of ``networks`` networks whose hosts are ``hosts`` (and every client in the log):

    * ``pages_per_network``: pages requested by each network's hosts (``net:N``; a client
      outside the layout's addresses is ``net:?``);
    * ``busiest_network_share``: the largest of those over all pages (1/L when even;
      None without pages);
    * ``pages_per_host_max`` / ``pages_per_host_mean``: over every host;
    * ``sites_fetched`` and ``sites_multi_host``: sites requested at all (robots.txt
      included), and by more than one client;
    * ``max_hosts_per_site_1s``: the most distinct clients of one site within one second
      (two requests a second apart or more are not together);
    * ``longest_pause``: the longest time between two pages, from the first to the last
      (a crawl that stands still: what a network cut off costs the others)."""
    per_network: Counter[str] = Counter({f"net:{n}": 0 for n in range(1, networks + 1)})
    per_host: Counter[str] = Counter({h: 0 for h in hosts})
    by_site: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
    times: list[float] = []
    for t, site, target, client in log:
        by_site[site].append((t, client))
        if target == ROBOTS:
            continue
        times.append(t)
        per_host[client] += 1
        n = network_of_host(client)
        per_network[f"net:{n if n is not None else '?'}"] += 1
    pages = sum(per_host.values())
    times.sort()
    busiest = max((v for k, v in per_network.items() if k != "net:?"), default=0)
    most = 0
    for events in by_site.values():
        events.sort()
        inside: Counter[str] = Counter()
        first = 0
        for t, client in events:
            inside[client] += 1
            while events[first][0] <= t - WINDOW:
                gone = events[first][1]
                inside[gone] -= 1
                if not inside[gone]:
                    del inside[gone]
                first += 1
            most = max(most, len(inside))
    return {
        "pages_per_network": dict(sorted(per_network.items(), key=lambda kv: _net_key(kv[0]))),
        "busiest_network_share": round(busiest / pages, 4) if pages else None,
        "pages_per_host_max": max(per_host.values(), default=0),
        "pages_per_host_mean": round(pages / len(per_host), 1) if per_host else None,
        "sites_fetched": len(by_site),
        "sites_multi_host": sum(len({c for _, c in events}) > 1 for events in by_site.values()),
        "max_hosts_per_site_1s": most,
        "longest_pause": round(max((b - a for a, b in zip(times, times[1:])), default=0.0), 3),
    }


def _net_key(name: str) -> tuple[int, int]:
    n = name[len("net:"):]
    return (0, int(n)) if n.isdigit() else (1, 0)
