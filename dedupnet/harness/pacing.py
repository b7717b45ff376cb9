"""How fast a crawl went against how fast politeness lets it go, from the synthetic web's
own record of what it answered and when (``SyntheticWeb.answered_at``), not from
anything the daemons say.

A crawl that is exact can still be slow because of how a host schedules its sites:
while one site's pages wait out that site's delay, the host's other fetch slots may
stand idle and other sites may wait behind it. These figures say whether that happened.

**The politeness bound** is the shortest crawl possible when every site is crawled by
one host (dedupnet's rule) at the run's politeness: per-site delay ``d`` between the
starts of two requests to a site, at most ``p`` requests at once to it, a web that
answers after ``λ`` seconds, and ``c`` requests at once per host over ``N`` hosts.

* A site that must answer ``n`` requests (its URLs in the ground truth, the 503s of its
  flaky pages and its robots.txt) needs at least
  ``site_bound = max((n - 1)·d + λ, ⌈n/p⌉·λ)`` seconds, about ``n × d`` when the delay
  rules: its last request cannot start before ``n - 1`` delays have passed, nor end
  before it is answered (``p`` = 0: no per-site bound, ``⌈n/p⌉`` is then 1).
* All ``R`` requests over the hosts' ``N·c`` slots need at least ``R·λ / (N·c)``.
* The crawl's bound is the larger of the largest ``site_bound`` and that.

It is a lower bound: it leaves out that a page is only known once a page linking to it
was fetched, and the protocol's own time to admit a URL.

**A site's own bound** is the site crawled alone as fast as politeness allows, each of
its URLs from the moment it was known (a seed: the start of the crawl; else the first
answer of a page that links or redirects to it), so that a site whose pages are found
late is not counted late for it: its robots.txt and URLs in the order they became
known, each request ``max(d, λ/p)`` after the one before and not before its URL was
known, the last answered ``λ`` later. Counted from the site's first known URL, that is
its bound, which is ``site_bound`` when every URL is known at once. The site was held
behind others (``late_sites``) when its last answer came more than
``0.1 × site_bound + 5 s`` after that earliest finish (``1.1 × bound + 5 s`` when every
URL is known at once).

**Sites with work** at a moment: sites with a URL known and not yet answered then.
**Sites being fetched**: sites that answered a request within the second before it.

**What politeness allows**: at a moment with ``W`` sites with work, the system can make
at most ``min(N·c / λ, W · r)`` requests a second, ``r = 1 / max(d, λ/p)`` a site's
own rate; summed over the crawl that is the requests it could have made, against the
requests it made (``rate_share``). It counts a URL as work from the moment it is known,
before the protocol has admitted it: a share of 1 is out of reach by that much.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict

from dedupnet.codec.urls import site_of
from dedupnet.harness.crawlchecks import carriers
from dedupnet.harness.web import SyntheticWeb

__all__ = ["LATE_FACTOR", "LATE_SLACK", "pacing", "pacing_lines", "politeness_bound", "site_requests"]

#: A site is late when its last page comes more than (LATE_FACTOR - 1) × its requests'
#: politeness time + LATE_SLACK seconds after the earliest it could (module docstring).
LATE_FACTOR, LATE_SLACK = 1.1, 5.0
#: "Being fetched": answered a request within this many seconds.
FETCHING_WINDOW = 1.0
#: The figures over time are given in this many equal parts of the crawl.
PARTS = 10


def site_requests(web: SyntheticWeb, fetched: set[str]) -> dict[str, int]:
    """Requests each site must answer in a correct crawl of ``fetched`` (the ground
    truth's URLs): one per URL, the 503s of its flaky pages, and its robots.txt."""
    n: dict[str, int] = defaultdict(lambda: 1)  # robots.txt
    for url in fetched:
        i = web.lookup(url)
        n[site_of(url)] += 1 + (web.spec.flaky_failures if i is not None and web.flaky[i] else 0)
    return dict(n)


def _site_bound(n: int, delay: float, per_site: int, latency: float) -> float:
    rounds = math.ceil(n / per_site) if per_site > 0 else 1
    return max((n - 1) * delay + latency, rounds * latency)


def politeness_bound(cfg, web: SyntheticWeb, fetched: set[str]) -> dict:
    """The politeness bound of a run of ``cfg`` over the ground truth ``fetched``: the
    crawl's (``bound``), its two parts, and every site's (``sites``)."""
    d, p, lat = cfg.per_site_delay, cfg.per_site_concurrency, cfg.web_latency
    per_site = {s: _site_bound(n, d, p, lat) for s, n in site_requests(web, fetched).items()}
    requests = sum(site_requests(web, fetched).values())
    hosts = max(cfg.networks * cfg.hosts, 1)
    slots = requests * lat / (hosts * max(cfg.concurrency, 1))
    largest = max(per_site.values(), default=0.0)
    return {"bound": round(max(largest, slots), 3), "largest_site": round(largest, 3), "slots": round(slots, 3),
            "sites": per_site}


def _first_answers(web: SyntheticWeb, t0: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per URL, its first and last answer, in seconds since ``t0``."""
    first = {u: ts[0] - t0 for u, ts in web.answered_at.items() if ts}
    last = {u: ts[-1] - t0 for u, ts in web.answered_at.items() if ts}
    return first, last


def _known_at(web: SyntheticWeb, seeds: list[str], depth: dict[str, int], max_depth: int | None,
              first: dict[str, float]) -> dict[str, float]:
    """When each extracted URL was first known: 0 for a seed, else the first answer of a
    page that carried it."""
    known = {}
    for url, by in carriers(web, seeds, depth, max_depth).items():
        times = [0.0 if c == "(seed)" else first[c] for c in by if c == "(seed)" or c in first]
        if times:
            known[url] = min(times)
    return known


def _own_finish(releases: list[float], gap: float, latency: float) -> float:
    """When a site's last request is answered at the earliest, its requests released at
    ``releases`` and started ``gap`` apart at least."""
    t = -math.inf
    for r in sorted(releases):
        t = max(r, t + gap)
    return t + latency


def _late_sites(cfg, web: SyntheticWeb, fetched: set[str], known: dict[str, float],
                last: dict[str, float]) -> dict:
    """Each site's last answer against its own bound (module docstring)."""
    releases: dict[str, list[float]] = defaultdict(list)
    for url in fetched:
        if url in known:
            i = web.lookup(url)
            times = 1 + (web.spec.flaky_failures if i is not None and web.flaky[i] else 0)
            releases[site_of(url)] += [known[url]] * times
    end: dict[str, float] = {}
    for url, t in last.items():
        end[site_of(url)] = max(end.get(site_of(url), t), t)
    p = cfg.per_site_concurrency
    gap = max(cfg.per_site_delay, cfg.web_latency / p if p > 0 else 0.0)
    worst_ratio, worst_excess, late, worst_site = 0.0, 0.0, 0, None
    for s, t_end in end.items():
        if not releases.get(s):
            continue
        start = min(releases[s])
        bound = _own_finish([start, *releases[s]], gap, cfg.web_latency) - start  # robots.txt first
        work = _site_bound(len(releases[s]) + 1, cfg.per_site_delay, p, cfg.web_latency)
        took = t_end - start
        late += took - bound > (LATE_FACTOR - 1) * work + LATE_SLACK
        if took - bound > worst_excess:
            worst_excess, worst_site = took - bound, s
        worst_ratio = max(worst_ratio, took / bound if bound > 0 else 0.0)
    return {"late_sites": late, "worst_site_ratio": round(worst_ratio, 2),
            "worst_site_excess": round(worst_excess, 2), "worst_site": worst_site}


def _over_time(known: dict[str, float], first: dict[str, float], wall: float) -> list[dict]:
    """Sites with work and sites being fetched, at the end of each of PARTS parts of the crawl."""
    work: dict[str, list[tuple[float, float]]] = defaultdict(list)
    answers: dict[str, list[float]] = defaultdict(list)
    for url, t in known.items():
        if url in first:
            work[site_of(url)].append((t, first[url]))
    for url, t in first.items():
        answers[site_of(url)].append(t)
    out = []
    for k in range(1, PARTS + 1):
        t = wall * k / PARTS
        with_work = sum(any(a <= t < b for a, b in spans) for spans in work.values())
        fetching = sum(any(t - FETCHING_WINDOW < a <= t for a in ts) for ts in answers.values())
        out.append({"t": round(t, 2), "sites_with_work": with_work, "sites_fetched_1s": fetching})
    return out


def pacing(cfg, web: SyntheticWeb, seeds: list[str], reach, wall: float, t0: float | None,
           timeline: list[dict]) -> dict:
    """The report's pacing figures (module docstring); ``t0``: the crawl's start on the
    web's clock (``trio.current_time()``), None when unknown (only the bound is given)."""
    bound = politeness_bound(cfg, web, reach.fetched)
    out = {"politeness_bound": bound["bound"], "bound_largest_site": bound["largest_site"],
           "bound_slots": bound["slots"], "bound_ratio": round(wall / bound["bound"], 2) if bound["bound"] else None}
    out.update(_slots(cfg, web, wall, timeline))
    if t0 is None:
        return out
    first, last = _first_answers(web, t0)
    known = _known_at(web, seeds, reach.depth, cfg.max_depth, first)
    out.update(_late_sites(cfg, web, reach.fetched, known, last))
    out["sites_over_time"] = _over_time(known, first, wall)
    out.update(_against_allowed(cfg, web, t0, wall, _work_steps(known, first)))
    return out


def _work_steps(known: dict[str, float], first: dict[str, float]) -> tuple[list[float], list[int]]:
    """Sites with work as a step function: the times it changes, and its value from each."""
    events = []
    for url, t in known.items():
        if first.get(url, t) > t:
            events += [(t, 1, site_of(url)), (first[url], -1, site_of(url))]
    events.sort(key=lambda e: (e[0], e[1]))
    open_urls: Counter[str] = Counter()
    times, values, n = [], [], 0
    for t, step, site in events:
        before = open_urls[site] > 0
        open_urls[site] += step
        n += (open_urls[site] > 0) - before
        times.append(t)
        values.append(n)
    return times, values


def _against_allowed(cfg, web: SyntheticWeb, t0: float, wall: float, steps: tuple[list[float], list[int]],
                     slices: int = 400) -> dict:
    """The requests made against those politeness allows (module docstring), the crawl
    cut in ``slices`` equal slices; {} when nothing bounds the rate (no delay, no latency)."""
    d, lat, p = cfg.per_site_delay, cfg.web_latency, cfg.per_site_concurrency
    site_gap = max(d, lat / p if p > 0 else 0.0)
    if site_gap <= 0 or wall <= 0:
        return {}
    cap = cfg.networks * cfg.hosts * cfg.concurrency / lat if lat > 0 else math.inf
    times, values = steps
    dt, allowed = wall / slices, 0.0
    for i in range(slices):
        k = bisect.bisect_right(times, (i + 0.5) * dt) - 1
        allowed += min(cap, (values[k] if k >= 0 else 0) / site_gap) * dt
    made = sum(1 for t, *_ in web.request_log if 0 <= t - t0 <= wall)
    return {"requests_allowed": round(allowed), "requests_made": made,
            "rate_share": round(made / allowed, 2) if allowed else None}


def _slots(cfg, web: SyntheticWeb, wall: float, timeline: list[dict]) -> dict:
    """Fetch slots in use: the mean as the web saw it (requests being answered), the
    crawlers' own count when the run could sample it, and per part of the crawl. The
    samples are a curve, each interval between two of them counted at the mean of its
    ends (trapezoids): a busy process samples less often, and a plain mean of the samples
    would count its busy moments less. The crawlers hold a slot longer than the web
    answers (connecting, and waiting for a loaded CPU): their count is the larger."""
    total = max(cfg.networks * cfg.hosts * cfg.concurrency, 1)
    key = "slots_in_use" if any("slots_in_use" in s for s in timeline) else "web_in_flight"
    samples = [s for s in timeline if key in s]
    weighted = [(b["t"], (a[key] + b[key]) / 2, b["t"] - a["t"]) for a, b in zip(samples, samples[1:])]
    parts = []
    for k in range(PARTS):
        lo, hi = wall * k / PARTS, wall * (k + 1) / PARTS
        parts.append(_mean([(v, w) for t, v, w in weighted if lo <= t < hi]))
    crawlers = _mean([(v, w) for _, v, w in weighted]) if key == "slots_in_use" else None
    return {"fetch_slots": total, "slots_in_use_web": round(web.busy_seconds / wall, 2) if wall else None,
            "slots_in_use_crawlers": crawlers, "slots_over_time": parts}


def _mean(values: list[tuple[float, float]]) -> float | None:
    """The mean of (value, weight) pairs, to one decimal; None without weight."""
    weight = sum(w for _, w in values)
    return round(sum(v * w for v, w in values) / weight, 1) if weight > 0 else None


def _row(values: list) -> str:
    return " ".join("-" if v is None else f"{v:g}" for v in values)


def pacing_lines(r) -> str:
    """The report's lines of pacing against politeness (empty for a report without them)."""
    if r.politeness_bound is None:
        return ""
    ratio = "n/a" if r.bound_ratio is None else f"{r.bound_ratio:.2f}x"
    crawlers = "" if r.slots_in_use_crawlers is None else f"; {r.slots_in_use_crawlers:g} held by the crawlers"
    lines = [f"  politeness bound            {r.politeness_bound:>10.1f} s   crawl took {r.wall_time:.1f} s = {ratio}"
             f"   (largest site {r.bound_largest_site:.1f} s, all requests over all slots {r.bound_slots:.1f} s)",
             f"  fetch slots in use (mean)   {_num(r.slots_in_use_web)} of {r.fetch_slots:,}   (being answered by "
             f"the web{crawlers})",
             f"    by tenth of the crawl     {_row(r.slots_over_time)}"]
    if r.sites_over_time:
        lines += [f"  sites with work             {_row([p['sites_with_work'] for p in r.sites_over_time])}"
                  f"   (by tenth of the crawl)",
                  f"  sites fetched within 1 s    {_row([p['sites_fetched_1s'] for p in r.sites_over_time])}"]
    if r.rate_share is not None:
        lines.append(f"  requests / politeness allows {r.requests_made:>9,} of {r.requests_allowed:,} = "
                     f"{r.rate_share:.0%}   (min(all slots / latency, sites with work / a site's gap), "
                     f"summed over the crawl)")
    if r.late_sites is not None:
        lines.append(f"  sites late on their bound   {r.late_sites:>10,}   (last page > {LATE_FACTOR - 1:.1f} x its "
                     f"requests x delay + {LATE_SLACK:g} s after the site alone could end; worst "
                     f"{r.worst_site_ratio:g}x, {r.worst_site_excess:g} s over{', ' + r.worst_site if r.worst_site else ''})")
    return "".join("\n" + line for line in lines)


def _num(value) -> str:
    return f"{'n/a':>10}" if value is None else f"{value:>10.1f}"
