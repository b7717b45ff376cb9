"""Queued URLs of the shape a broad crawl finds, for the benches and tests that measure
what a queue costs: a URL of ``http://s1.example/p/1`` form compresses far better than
real ones, so a figure measured on it says nothing.

Sites have skewed sizes (Zipf: a few big, most small); a page's links mostly share its
section's path; paths mix slugs of common words, numeric ids, file endings and some
query strings; URLs arrive page by page, sites interleaved, as a crawler's links do.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator

WORDS = ("docs api guide blog news product products item items category tag user users page article "
         "articles post posts reference tutorial install download release notes faq help support search "
         "wiki forum thread topic en de fr static assets images video about team careers events press "
         "library module class function index archive 2019 2020 2021 2022 2023 2024 how-to "
         "getting-started configuration advanced overview changelog security shop cart").split()
TLDS = ("com", "org", "net", "io", "de", "co.uk", "fr", "edu")
PREFIXES = ("www.", "", "docs.", "blog.", "shop.", "en.")


def site_names(n: int, rng: random.Random) -> list[str]:
    return [f"{rng.choice(PREFIXES)}{rng.choice(WORDS)}{rng.choice(WORDS)}{i}.{rng.choice(TLDS)}" for i in range(n)]


def _slug(rng: random.Random) -> str:
    return "-".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))


def page_links(site: str, rng: random.Random, k: int) -> list[str]:
    """``k`` links of one page of ``site``, most of them in the page's section."""
    scheme = "https://" if rng.random() < 0.75 else "http://"
    section = "".join("/" + rng.choice(WORDS) for _ in range(rng.randint(0, 3)))
    out = []
    for _ in range(k):
        r = rng.random()
        if r < 0.5:
            path = f"{section}/{_slug(rng)}{rng.choice(('', '.html', '/', '.php', '.htm'))}"
        elif r < 0.7:
            path = f"{section}/{rng.randint(1, 10 ** rng.randint(2, 7))}"
        elif r < 0.85:
            path = f"{section}/{rng.choice(WORDS)}?id={rng.randint(1, 10 ** 6)}"
            if rng.random() < 0.4:
                path += f"&page={rng.randint(1, 50)}"
        else:
            path = "".join("/" + _slug(rng) for _ in range(rng.randint(1, 3))) + rng.choice(("", ".html"))
        out.append(scheme + site + path)
    return out


def pages(sites: int, seed: int = 1) -> Iterator[list[str]]:
    """Endless pages' links (each list one page's), sites drawn by Zipf's law; a URL may
    come again on a later page, as on the web."""
    rng = random.Random(seed)
    names = site_names(sites, rng)
    cumulative, total = [], 0.0
    for rank in range(sites):
        total += 1 / (rank + 1)
        cumulative.append(total)
    while True:
        site = names[min(bisect.bisect(cumulative, rng.random() * total), sites - 1)]
        yield page_links(site, rng, rng.randint(5, 40))


def distinct_urls(n: int, sites: int, seed: int = 1) -> Iterator[list[str]]:
    """``n`` distinct URLs, page by page (the repeats a page has dropped)."""
    seen: set[str] = set()
    for links in pages(sites, seed):
        fresh = [u for u in dict.fromkeys(links) if u not in seen][:n - len(seen)]
        seen.update(fresh)
        if fresh:
            yield fresh
        if len(seen) >= n:
            return
