"""The synthetic web's graph and its ground truth, without a server: which pages exist
on which site, what each links to or redirects to, and what a correct crawl from given
seeds fetches. The shape and the rules are in :mod:`dedupnet.harness.web`'s docstring."""

from __future__ import annotations

import bisect
import collections
import functools
import ipaddress
import random
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Sequence, TypeVar

from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import normalize, site_of

__all__ = ["DEFAULT_BIND", "DEFAULT_PORT", "Reach", "SHAPES", "WebGraph", "WebSpec", "site_host"]

DEFAULT_PORT = 8077
DEFAULT_BIND = "127.77.0.0/16"

# Page kinds.
HTML, REDIRECT, HUGE, PDF, BROKEN, ODD = range(6)

# Link forms: the low 3 bits pick the spelling, bit 3 adds a fragment.
ABS, ROOT, REL, ODD_SPELL, ABS_UPPER = range(5)
FRAGMENT = 8

_PUBLIC_DIRS = ("/", "/d0/", "/d1/", "/d1/x/", "/d2/y/z/")
_PRIVATE_DIRS = ("/private/", "/private/a/")
WORDS = ("crawler", "url", "frontier", "site", "page", "link", "graph", "dedup", "redis", "fingerprint",
          "network", "host", "center", "broadcast", "set", "pool", "task", "seed", "depth", "robots",
          "fetch", "queue", "politeness")


@functools.lru_cache(maxsize=16)
def _bind_network(bind: str) -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(bind, strict=False)
    if net.version != 4:
        raise ValueError(f"bind must be an IPv4 network, got {bind!r}")
    return net


def site_host(k: int, bind: str = DEFAULT_BIND) -> str:
    """The address of site ``k``: address ``(k // 250) * 256 + k % 250 + 1`` of network
    ``bind`` (by default ``127.77.{k // 250}.{k % 250 + 1}``). ValueError if ``k`` is out
    of range or ``bind`` (an IPv4 CIDR) has no room for it."""
    if not 0 <= k < 250 * 256:
        raise ValueError(f"site index {k} out of range")
    net = _bind_network(bind)
    offset = (k // 250) * 256 + k % 250 + 1
    if offset >= net.num_addresses - 1:  # the network's last address is left out
        raise ValueError(f"network {net} has no room for site {k} (a /24 holds 250 sites, a /16 64000)")
    return str(net.network_address + offset)


_T = TypeVar("_T")


class _Dice:
    """The one ``random.Random(seed)`` a graph is drawn from. Only ``random()`` is used,
    whose sequence Python keeps stable across versions; the draws are made in a fixed
    order, so the same spec gives the same graph."""

    def __init__(self, seed: int, sites: int, skew: float = 0.5):
        self.random = random.Random(seed).random
        self.sites = sites
        # Site k is drawn with weight (k+1) ** -skew: 0.5 (the classic web) is mild, 1 is Zipf's law.
        self._cum: list[float] = []
        self._total = 0.0
        for k in range(sites):
            self._total += (k + 1) ** -skew
            self._cum.append(self._total)

    def pick(self, seq: Sequence[_T]) -> _T:
        return seq[int(self.random() * len(seq))]

    def site(self) -> int:
        """A site, drawn by its size weight."""
        return min(self.sites - 1, bisect.bisect(self._cum, self.random() * self._total))

    def other_site(self, s: int) -> int:
        """A site other than ``s`` (``s`` itself when there is only one)."""
        if self.sites == 1:
            return s
        t = self.site()
        return t if t != s else (s + 1 + int(self.random() * (self.sites - 1))) % self.sites


@dataclass
class WebSpec:
    """The shape of a synthetic web. Shares are probabilities in [0, 1]; ``site_skew`` is
    the exponent of the site sizes (site ``k`` gets pages in proportion to
    ``(k+1) ** -site_skew``). The defaults are the classic web every older test and
    benchmark was measured on; :data:`SHAPES` names it and the real-web one."""

    pages: int = 2000
    sites: int = 20
    seed: int = 0
    mean_out_degree: float = 8.0
    max_out_degree: int = 250
    dup_share: float = 0.7
    cross_site_share: float = 0.3
    share_404: float = 0.03
    share_redirect: float = 0.03
    share_flaky: float = 0.03
    flaky_failures: int = 2
    private_share: float = 0.05
    huge_size: int = 3_500_000
    request_log_size: int = 1_000_000
    site_skew: float = 0.5

    @classmethod
    def shaped(cls, shape: str, **fields: Any) -> "WebSpec":
        """The spec of a named shape (:data:`SHAPES`), with ``fields`` on top."""
        if shape not in SHAPES:
            raise ValueError(f"web shape must be one of {', '.join(SHAPES)}, not {shape!r}")
        return cls(**{**SHAPES[shape], **fields})

    def __post_init__(self) -> None:
        if self.sites < 1 or self.sites > 250 * 256:
            raise ValueError("sites must be in 1..64000")
        if self.pages < self.sites + 20:
            raise ValueError("pages must be at least sites + 20")
        for name in ("dup_share", "cross_site_share", "share_404", "share_redirect",
                     "share_flaky", "private_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.share_redirect + self.share_flaky > 1.0:
            raise ValueError("share_redirect + share_flaky must be <= 1")
        if self.mean_out_degree < 1 or self.max_out_degree < 1:
            raise ValueError("mean_out_degree and max_out_degree must be >= 1")
        if self.flaky_failures < 0:
            raise ValueError("flaky_failures must be >= 0")
        if not 0.0 <= self.site_skew <= 4.0:
            raise ValueError("site_skew must be in [0, 4]")


#: Named shapes of the synthetic web. ``classic``: 30 % of the links leave their site and
#: site sizes differ mildly (weight 1/sqrt(k+1)); every test and table measured before
#: the real shape existed used it. ``real``: as on real sites, most links stay on their
#: site (85 %), and site sizes follow Zipf's law (weight 1/(k+1)): a few large sites and
#: many small ones, so that one host's work is mostly one big site's pages while small
#: sites wait beside it -- what per-site politeness makes slow.
SHAPES: dict[str, dict[str, float]] = {
    "classic": {},
    "real": {"cross_site_share": 0.15, "site_skew": 1.0},
}


@dataclass
class Reach:
    """Ground truth of a crawl; every URL normalised. See the module docstring."""

    pages: set[str] = field(default_factory=set)  # answered 200 (HTML or not)
    missing: set[str] = field(default_factory=set)  # answered 404
    redirects: set[str] = field(default_factory=set)  # answered 301/302
    disallowed: set[str] = field(default_factory=set)  # discovered, robots.txt forbids
    depth: dict[str, int] = field(default_factory=dict)  # every discovered URL

    @property
    def fetched(self) -> set[str]:
        """What a correct crawler requests (each once; flaky pages until they answer)."""
        return self.pages | self.missing | self.redirects


class WebGraph:
    """A deterministic web graph drawn from ``spec``, its URLs (which follow :attr:`port`)
    and the ground truth of a crawl. :class:`~dedupnet.harness.web.SyntheticWeb` serves it."""

    def __init__(self, spec: WebSpec | None = None, *, port: int = DEFAULT_PORT, bind: str = DEFAULT_BIND):
        self.spec = spec if spec is not None else WebSpec()
        self.bind = bind
        self.hosts = [site_host(k, bind) for k in range(self.spec.sites)]
        self._site_index = {h: k for k, h in enumerate(self.hosts)}
        self._build()
        self.port = port

    # ------------------------------------------------------------------ graph

    def _build(self) -> None:
        """Draw the whole graph, one step after the other (the order is part of the seed's meaning)."""
        sp = self.spec
        dice = _Dice(sp.seed, sp.sites, sp.site_skew)
        # Sites: homes first, then sizes skewed.
        self.site = list(range(sp.sites)) + [dice.site() for _ in range(sp.pages - sp.sites)]
        private = self._draw_kinds(dice)
        self._lay_out_paths(dice, private)
        site_pages = self._ordinary_pages()
        self._draw_redirects(dice, site_pages)
        missing_by_site = self._draw_missing(dice)
        self._draw_links(dice, site_pages, missing_by_site)
        # Pages of the odd page's base site under /d1/: its relative links point at them.
        self._odd_base_site = (self.site[self.odd_id] + 1) % sp.sites
        self._odd_targets = [i for i in site_pages[self._odd_base_site] if self.paths[i].startswith("/d1/p")][:3]
        self._filler = [" ".join(dice.pick(WORDS) for _ in range(n)) for n in (20, 60, 150, 300)]

    def _draw_kinds(self, dice: _Dice) -> bytearray:
        """Each page's kind and whether it is flaky; the special pages at fixed ids after
        the home pages. Returns which pages are private."""
        P, S = self.spec.pages, self.spec.sites
        kind = bytearray(P)  # HTML
        self.flaky = flaky = bytearray(P)
        private = bytearray(P)
        self.huge_id, self.pdf_id, self.broken_id, self.odd_id = S, S + 1, S + 2, S + 3
        self.loop_ids = (S + 4, S + 5)
        self.chain_ids = (S + 6, S + 7, S + 8)
        kind[S], kind[S + 1], kind[S + 2], kind[S + 3] = HUGE, PDF, BROKEN, ODD
        for i in range(S + 10, P):
            r = dice.random()
            if r < self.spec.share_redirect:
                kind[i] = REDIRECT
            elif r < self.spec.share_redirect + self.spec.share_flaky:
                flaky[i] = 1
            if dice.random() < self.spec.private_share:
                private[i] = 1
        for i in (*self.loop_ids, *self.chain_ids):
            kind[i] = REDIRECT
        self.kind = kind
        return private

    def _lay_out_paths(self, dice: _Dice, private: bytearray) -> None:
        paths = []
        for i in range(self.spec.pages):
            k = self.kind[i]
            if i < self.spec.sites:
                paths.append("/")
            elif k == HUGE:
                paths.append(f"/d0/huge{i}.html")
            elif k == PDF:
                paths.append(f"/files/doc{i}.pdf")
            elif k == BROKEN:
                paths.append(f"/d1/broken{i}.html")
            elif k == ODD:
                paths.append(f"/d0/odd{i}.html")
            else:
                d = dice.pick(_PRIVATE_DIRS) if private[i] else dice.pick(_PUBLIC_DIRS)
                paths.append(f"{d}p{i}.html")
        self.paths = paths
        self._by_path: list[dict[str, int]] = [{} for _ in range(self.spec.sites)]
        for i, p in enumerate(paths):
            self._by_path[self.site[i]][p] = i

    def _ordinary_pages(self) -> list[list[int]]:
        """Per site, the pages a random link or redirect may point at: not the special ones."""
        special = {self.huge_id, self.pdf_id, self.broken_id, self.odd_id}
        site_pages: list[list[int]] = [[] for _ in range(self.spec.sites)]
        for i in range(self.spec.pages):
            if i not in special:
                site_pages[self.site[i]].append(i)
        return site_pages

    def _draw_redirects(self, dice: _Dice, site_pages: list[list[int]]) -> None:
        S = self.spec.sites
        chain_target = S + 9  # a plain page: no draw above makes it anything else
        plain_html = [[i for i in sp_ if self.kind[i] == HTML] for sp_ in site_pages]
        self.redirect_to: dict[int, tuple[int, int]] = {}  # page -> (target page, status)
        for i in range(S + 10, self.spec.pages):
            if self.kind[i] == REDIRECT:
                ts = dice.other_site(self.site[i]) if dice.random() < self.spec.cross_site_share else self.site[i]
                cands = plain_html[ts] or plain_html[self.site[i]]
                self.redirect_to[i] = (dice.pick(cands), 301 if dice.random() < 0.5 else 302)
        a, b = self.loop_ids
        self.redirect_to[a], self.redirect_to[b] = (b, 301), (a, 302)
        r1, r2, r3 = self.chain_ids
        self.redirect_to[r1], self.redirect_to[r2], self.redirect_to[r3] = (r2, 301), (r3, 302), (chain_target, 301)

    def _draw_missing(self, dice: _Dice) -> list[list[int]]:
        """URLs that do not exist (404 targets), spread over the sites; returns each site's."""
        n_missing = max(1, round(self.spec.share_404 * self.spec.pages))
        self.missing_site = [int(dice.random() * self.spec.sites) for _ in range(n_missing)]
        self.missing_path = [f"{dice.pick(_PUBLIC_DIRS)}gone{m}.html" for m in range(n_missing)]
        missing_by_site: list[list[int]] = [[] for _ in range(self.spec.sites)]
        for m, s in enumerate(self.missing_site):
            missing_by_site[s].append(m)
        return missing_by_site

    def _draw_links(self, dice: _Dice, site_pages: list[list[int]], missing_by_site: list[list[int]]) -> None:
        """Every HTML page's links (a target >= 0 is a page id, < 0 is missing URL
        -(m + 1)), how each is spelled, and the page's ``<base href>`` option."""
        P = self.spec.pages
        popular: list[list[int]] = [[] for _ in range(self.spec.sites)]  # every link target so far, per site
        self.links: list[list[int]] = [[] for _ in range(P)]
        self.forms: list[bytes] = [b""] * P
        self.base_opt = bytearray(P)
        for i in range(P):
            if self.kind[i] not in (HTML, BROKEN):
                continue
            out = self._draw_out_links(dice, i, site_pages, missing_by_site, popular)
            self.links[i] = out
            self.forms[i] = bytes(int(dice.random() * 5) | (FRAGMENT if dice.random() < 0.15 else 0) for _ in out)
            r = dice.random()
            self.base_opt[i] = 0 if r < 0.8 else 1 if r < 0.9 else 2 if r < 0.95 else 3
        self.base_opt[self.broken_id] = 0

    def _draw_out_links(self, dice: _Dice, i: int, site_pages: list[list[int]], missing_by_site: list[list[int]],
                        popular: list[list[int]]) -> list[int]:
        """The targets of page ``i``'s links: power-law many, by preferential attachment
        (``popular``) or uniformly, some across sites, some to missing URLs."""
        sp = self.spec
        s = self.site[i]
        u = dice.random()
        degree = min(sp.max_out_degree, 1 + int((sp.mean_out_degree - 1) * ((1.0 - u) ** -0.5 - 1.0)))
        out: list[int] = []
        if i == 0:  # site 0's home page introduces the special pages
            out += [self.huge_id, self.pdf_id, self.broken_id, self.odd_id, self.loop_ids[0], self.chain_ids[0]]
        if i < sp.sites:  # every home page is a small site index
            out += [dice.pick(site_pages[s]) for _ in range(min(10, len(site_pages[s])))]
        for _ in range(degree):
            ts = dice.other_site(s) if dice.random() < sp.cross_site_share else s
            if dice.random() < sp.share_404:
                out.append(-(dice.pick(missing_by_site[ts] or range(len(self.missing_site))) + 1))
                continue
            if dice.random() < sp.dup_share and popular[ts]:
                t = dice.pick(popular[ts])
            else:
                t = dice.pick(site_pages[ts])
            popular[ts].append(t)
            out.append(t)
        return out

    # ------------------------------------------------------------------- URLs

    @property
    def port(self) -> int:
        return self._port

    @port.setter
    def port(self, value: int) -> None:
        self._port = value
        self.origins = [f"http://{h}" if value == 80 else f"http://{h}:{value}" for h in self.hosts]
        self._forget_bodies()

    def _forget_bodies(self) -> None:
        """The URLs changed: pages rendered with the old ones are stale (none are kept here)."""

    def url(self, page_id: int) -> str:
        """The normalised URL of page ``page_id``."""
        return self.origins[self.site[page_id]] + self.paths[page_id]

    def _target_url(self, t: int) -> str:
        if t >= 0:
            return self.origins[self.site[t]] + self.paths[t]
        m = -t - 1
        return self.origins[self.missing_site[m]] + self.missing_path[m]

    def seeds(self, n: int = 1) -> list[str]:
        """``n`` seed URLs: the home pages of sites 0, 1, ..., then ordinary public pages."""
        ids = list(range(min(n, self.spec.sites)))
        i = self.spec.sites + 10
        while len(ids) < n and i < self.spec.pages:
            if self.kind[i] == HTML and not self.paths[i].startswith("/private/"):
                ids.append(i)
            i += 1
        return [self.url(i) for i in ids]

    def examples(self) -> dict[str, str]:
        """One URL of each kind, for tests and demos: html, missing (404), redirect, loop
        (one of the redirect loop pair), chain (start of the 3-redirect chain), flaky,
        private, huge, pdf, broken, odd."""
        P = self.spec.pages
        first = {}
        for i in range(self.spec.sites + 10, P):
            private = self.paths[i].startswith("/private/")
            key = ("private" if private else "redirect" if self.kind[i] == REDIRECT
                   else "flaky" if self.flaky[i] else "html")
            first.setdefault(key, self.url(i))
        out = {"home": self.url(0), **first, "missing": self._target_url(-1),
               "loop": self.url(self.loop_ids[0]), "chain": self.url(self.chain_ids[0]),
               "huge": self.url(self.huge_id), "pdf": self.url(self.pdf_id),
               "broken": self.url(self.broken_id), "odd": self.url(self.odd_id)}
        return out

    def lookup(self, url: str) -> int | None:
        """Page id of a normalised URL, or None if the web does not serve it (404)."""
        try:
            k = self._site_index.get(site_of(url))
        except ValueError:
            return None
        if k is None or not url.startswith(self.origins[k]):
            return None
        return self._by_path[k].get(url[len(self.origins[k]):])

    def links_of(self, url: str) -> list[str]:
        """The normalised link targets a crawler extracts from ``url`` (in order, with
        repeats); empty for non-HTML pages, redirects and missing URLs."""
        i = self.lookup(url)
        if i is None:
            return []
        if self.kind[i] == ODD:
            return self._odd_links()
        return [self._target_url(t) for t in self.links[i]]

    def redirect_of(self, url: str) -> tuple[int, str] | None:
        """``(status, normalised target URL)`` if ``url`` redirects, else None."""
        i = self.lookup(url)
        if i is None or i not in self.redirect_to:
            return None
        t, status = self.redirect_to[i]
        return status, self.url(t)

    @staticmethod
    def disallowed(url: str) -> bool:
        """Whether robots.txt forbids a normalised URL of this web (its path under /private/)."""
        rest = url.partition("://")[2]
        return rest[rest.find("/"):].startswith("/private/") if "/" in rest else False

    def stats(self) -> dict[str, Any]:
        """Shape of the graph: link counts, out-degree spread, kinds."""
        degrees = sorted(len(self.links[i]) for i in range(self.spec.pages) if self.kind[i] in (HTML, BROKEN))
        targets = [t for out in self.links for t in out]
        return {
            "pages": self.spec.pages,
            "sites": self.spec.sites,
            "links": len(targets),
            "distinct_link_targets": len(set(targets)),
            "median_out_degree": degrees[len(degrees) // 2],
            "max_out_degree": degrees[-1],
            "redirects": len(self.redirect_to),
            "flaky": sum(self.flaky),
            "private": sum(1 for p in self.paths if p.startswith("/private/")),
            "missing_urls": len(self.missing_path),
        }

    # ------------------------------------------------------------ ground truth

    def reachable_detail(self, seeds: Iterable[str], *, max_depth: int | None = None,
                         obey_robots: bool = True) -> Reach:
        """Breadth-first ground truth from ``seeds`` (rules: module docstring)."""
        reach = Reach()
        depth = reach.depth
        queue: collections.deque[str] = collections.deque()
        for s in seeds:
            u = normalize(s)
            if u not in depth:
                depth[u] = 0
                queue.append(u)
        while queue:
            u = queue.popleft()
            d = depth[u]
            if obey_robots and self.disallowed(u):
                reach.disallowed.add(u)
                continue
            i = self.lookup(u)
            if i is None:
                reach.missing.add(u)
                continue
            if i in self.redirect_to:
                reach.redirects.add(u)
                nxt = [self.url(self.redirect_to[i][0])]
            else:
                reach.pages.add(u)
                nxt = self.links_of(u) if self.kind[i] in (HTML, BROKEN, ODD) else []
            if max_depth is not None and d >= max_depth:
                continue
            for v in nxt:
                if v not in depth:
                    depth[v] = d + 1
                    queue.append(v)
        return reach

    def reachable(self, seeds: Iterable[str], *, max_depth: int | None = None,
                  obey_robots: bool = True) -> set[str]:
        """The URLs that answer 200 to a crawl from ``seeds`` (``reachable_detail(...).pages``)."""
        return self.reachable_detail(seeds, max_depth=max_depth, obey_robots=obey_robots).pages

    def _odd_hrefs(self) -> tuple[str, list[str]]:
        other = self.origins[self._odd_base_site]
        hrefs = ["javascript:void(0)", "mailto:webmaster@example.invalid", "/d0/" + "a" * 3000 + ".html",
                 "http://[bad", "../../..", "#x", "", "ftp://127.77.0.1/file", "data:text/html,hi",
                 f"{self.origins[0]}/%7Euser/", "//" + other[7:] + "/d0/../d1/./index.html?"]
        hrefs += [self.paths[j][len("/d1/"):] for j in self._odd_targets]
        return other + "/d1/", hrefs

    def _odd_links(self) -> list[str]:
        """What a crawler extracts from the odd page: its hrefs resolved against its base."""
        base, hrefs = self._odd_hrefs()
        out = []
        for h in hrefs:
            try:
                out.append(normalize(urllib.parse.urljoin(base, h)))
            except (ValueError, BadURL):
                pass
        return out
