"""The checks of a simulated crawl against the synthetic web, from what the web served
and what the hosts recorded, not from anything the daemons say of themselves: every
extracted URL crawled once (or once per re-crawl window), nothing crawled twice."""

from __future__ import annotations

from collections import Counter

from dedupnet.adapters.storage.store import FINISH_URL
from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import fingerprint_many, normalize
from dedupnet.harness.web import SyntheticWeb

__all__ = ["carriers", "check_extracted", "finished_twice", "refetch_gap", "window_counts"]


def carriers(web: SyntheticWeb, seeds: list[str], depth: dict[str, int],
              max_depth: int | None) -> dict[str, list[str]]:
    """Every URL a crawler extracted, with what carried it: "(seed)", or the fetched pages
    that link or redirect to it."""
    found: dict[str, list[str]] = {}
    for s in seeds:
        found.setdefault(normalize(s), []).append("(seed)")
    for page in sorted(web.answer_counts):
        if max_depth is not None and depth.get(page, 0) >= max_depth:
            continue  # its links are not followed (the crawler stores the depth with the URL)
        redirect = web.redirect_of(page)
        for link in dict.fromkeys([redirect[1]] if redirect else web.links_of(page)):
            found.setdefault(link, []).append(page)
    return found


def check_extracted(web: SyntheticWeb, seeds: list[str], depth: dict[str, int],
                    max_depth: int | None = None, *, killed: frozenset[str] = frozenset(),
                    gone: frozenset[str] = frozenset(), windows: int = 1) -> tuple[list[str], int]:
    """The design guide's invariant, checked from what the web served, not from anything
    the daemons say: every URL a crawler extracted (a seed, a link of a page the web
    answered, a redirect's target) ends crawled exactly once, or, if robots.txt forbids
    it, not at all; and nothing is crawled that no fetched page led to. Variants of one
    URL (``#x``, un-normalised spellings) are one URL after normalisation, which is how
    a duplicate of a crawled URL is recorded. Returns one line per violation (the URL,
    what went wrong, the fetched pages that carried it, when and by whom it was
    requested) and the number of re-fetches excused: requests for a URL that one host
    in ``killed`` (SIGKILLed during the run) made again, all by itself. A crawler records
    a page in the same transaction that takes its task (local_host/crawler/crawl.py), so a
    crawler killed between the web's answer and that transaction fetches the page again
    when it restarts: at least once, never by another host. No crawler can do better:
    the request is a side effect outside its store. A host in ``gone`` (taken away for
    good with its data) does not come back: what it fetched and could not report is
    fetched again by the host its task went to; those re-fetches are excused too. Who made a request is the client
    address the web saw (the daemons' crawlers send from their host's IP). With
    ``windows`` K (re-crawl by age, ``--windows``) "once" is K times: once in each window."""
    extracted = carriers(web, seeds, depth, max_depth)
    times: dict[str, list[float]] = {}
    origin = dict(zip(web.hosts, web.origins))
    for t, host, path, _client in web.request_log:
        try:
            times.setdefault(normalize(origin[host] + path), []).append(t)
        except (KeyError, ValueError, BadURL):
            continue  # robots.txt and garbled targets: not a crawl of a URL
    out = []

    def seen(url: str) -> str:
        via = extracted.get(url, [])
        at = ", ".join(f"{t:.1f}" for t in times.get(url, [])[:5])
        by = ", ".join(web.answered_by.get(url, [])[:5])
        return (f"; carried by {len(via)} page(s), e.g. {', '.join(via[:3])}" if via else "") + \
               (f"; requested at t={at}" if at else "") + (f" by {by}" if by else "")

    excused = 0
    for url in sorted(extracted):
        n = web.answer_counts.get(url, 0)
        by = set(web.answered_by.get(url, ()))
        if n > windows and len(by) == 1 and by <= killed:
            excused += n - windows
            continue
        by_gone = sum(1 for client in web.answered_by.get(url, ()) if client in gone)
        if n > windows and n - by_gone <= windows:
            excused += n - windows
            continue
        if web.disallowed(url):
            if web.fetch_counts.get(url, 0):
                out.append(f"{url}: robots.txt forbids it, fetched {web.fetch_counts[url]} time(s){seen(url)}")
        elif n == 0:
            out.append(f"{url}: extracted, never crawled (lost){seen(url)}")
        elif n > windows:
            out.append(f"{url}: crawled {n} times (duplicate{f' over {windows} windows' if windows > 1 else ''}){seen(url)}")
        elif n < windows:
            out.append(f"{url}: crawled {n} of {windows} times (missed a window){seen(url)}")
    for url in sorted(set(web.answer_counts) - set(extracted)):
        out.append(f"{url}: crawled, but no fetched page or seed led to it{seen(url)}")
    return out, excused


def refetch_gap(web: SyntheticWeb) -> float | None:
    """The shortest time between two answered requests for one URL (the web's request
    log; a flaky page's 503s are not answers), or None if no URL was fetched twice."""
    origin = dict(zip(web.hosts, web.origins))
    times: dict[str, list[float]] = {}
    for t, host, path, _client in web.request_log:
        if path == "/robots.txt":
            continue  # each crawler reads it once per site
        try:
            times.setdefault(normalize(origin[host] + path), []).append(t)
        except (KeyError, ValueError, BadURL):
            continue
    gaps = []
    for url, ts in times.items():
        i = web.lookup(url)
        if i is not None and web.flaky[i]:
            ts = ts[web.spec.flaky_failures:]
        gaps += [b - a for a, b in zip(ts, ts[1:])]
    return round(min(gaps), 3) if gaps else None


def finished_twice(stores: list, skipped: set[str]) -> int:
    """The harness's own duplicate count: URLs recorded in the finish_URL of more than one
    host (each host finishes a URL once), less robots-disallowed ones, which are finished
    without a request. Independent of the web server's counts, which it should match."""
    seen: Counter[tuple[int, bytes]] = Counter()
    for store in stores:
        batch = store.batch()
        for bucket in store.fp_buckets(FINISH_URL):
            batch.add(b"SMEMBERS", bucket)
        for bucket, members in enumerate(store.execute(batch)):
            seen.update((bucket, m) for m in members)
    excluded = set(stores[0].fp_members(fingerprint_many(sorted(skipped)))) if skipped else set()
    return sum(c - 1 for key, c in seen.items() if c > 1 and key not in excluded)


def window_counts(web: SyntheticWeb, expected: set[str], k: int) -> dict[str, int]:
    """Of the URLs a crawl should fetch, how many the web answered exactly ``k`` times,
    fewer and more (``--windows`` K)."""
    counts = [web.answer_counts.get(u, 0) for u in expected]
    return {"exactly": sum(n == k for n in counts), "fewer": sum(n < k for n in counts),
            "more": sum(n > k for n in counts)}
