"""The soak's verdict (bench/bench_soak_rss.py) is about the crawl: a run's last samples are
the hosts handing their tasks back and exiting, when the centers' RSS jumps by a few MB,
and a verdict taken there fails daemons whose memory had levelled off long before."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_soak_rss", Path(__file__).parent.parent / "bench" / "bench_soak_rss.py")
bench_soak_rss = importlib.util.module_from_spec(_spec)
sys.modules["bench_soak_rss"] = bench_soak_rss
_spec.loader.exec_module(bench_soak_rss)

HOSTS = [f"local:127.0.{n}.1{i}" for n in (1, 2, 3) for i in range(3)]


def row(center: float, host: float, pages: int, hosts=HOSTS) -> dict:
    return {"center:1": center, **{h: host for h in hosts}, "pages": pages}


def soak() -> list:
    """The shape of a 3 x 3 soak: the centers alone first, a crawl that levels off, its last
    page, a report being made, then the hosts gone one by one and the centers' jump."""
    samples = [(5, {"center:1": 64.0, "pages": 0})]
    samples += [(10 + 10 * i, row(70 + min(i, 5), 73.0, 1000 * i)) for i in range(20)]
    samples += [(210 + 10 * i, row(75.0, 73.0, 19_000)) for i in range(5)]  # the report
    samples += [(260, row(78.3, 78.5, 19_000, HOSTS[:4])), (265, {"center:1": 78.5, "pages": 19_000})]
    return samples


def test_the_second_half_ends_with_the_last_page_while_every_daemon_is_up():
    half, last = bench_soak_rss.second_half(soak())
    assert last == (200, row(75.0, 73.0, 19_000))
    assert half[0] == 100 and half[1]["pages"] == 9_000
    assert last[1]["center:1"] - half[1]["center:1"] == 0.0


def test_admitted_is_the_sum_over_networks():
    report = "  pages per network           net:1:41002\n  URLs admitted per network   net:1:52877 net:2:42099 net:3:44513\n"
    assert bench_soak_rss.admitted(report) == 139_489
    assert bench_soak_rss.admitted("nothing") is None
