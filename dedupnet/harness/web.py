"""A synthetic web: a seeded, deterministic link graph served over real HTTP on loopback.

The simulation harness (and the tests) need a web whose answer is known in advance:
which URLs a correct crawler fetches, exactly once each. :class:`SyntheticWeb` builds
one from a :class:`WebSpec` and a seed (same spec -> same graph and the same response
bytes), serves it with ``h11`` over trio, counts every request per URL and computes
the ground truth (:meth:`SyntheticWeb.reachable_detail`).

Addresses
    Site ``k`` (0-based) is ``http://127.77.{k // 250}.{k % 250 + 1}:{port}/``; every
    site listens on its own loopback address and all share one port (default 8077,
    ``port=0`` picks a free one). So a URL's host *is* its site, and per-site
    politeness and site-hash task splitting behave as on the real web. All of
    127.0.0.0/8 is local on Linux; nothing is ever sent off the machine.

    ``bind`` (``dedupnet web --bind CIDR``) moves the sites into another network, same
    layout: site ``k`` at address ``(k // 250) * 256 + k % 250 + 1`` of the network
    (``10.77.0.0/16`` gives ``10.77.0.1``, ``10.77.0.2``, ...), for crawlers that cannot
    reach this machine's loopback, e.g. in other network namespaces. The addresses
    must be local where the web runs (``ip route add local 10.77.0.0/16 dev lo``).

What the graph holds
    ``pages`` pages over ``sites`` sites (site sizes are skewed). Page ``k < sites`` is
    site ``k``'s home page ``/``. Out-degree is power-law (Lomax, alpha 2, mean about
    ``mean_out_degree``, capped); ``dup_share`` of the links go to pages chosen by
    preferential attachment (so the same popular URLs are discovered again and again,
    as on the real web), the rest to uniformly chosen pages; ``cross_site_share`` of
    the links leave the site. ``share_404`` of the links point to URLs that do not
    exist; ``share_redirect`` of the pages answer 301/302 (plus one redirect loop pair
    and one chain of three redirects); ``share_flaky`` of the pages answer 503 for their
    first ``flaky_failures`` requests, then 200; ``private_share`` of the pages live
    under ``/private/``, which every site's ``robots.txt`` disallows (``Crawl-delay``
    is absent). Special pages, all linked from site 0's home page: a huge page
    (> 3 MB, no links), a PDF (``application/pdf``; it contains a trap link that only a
    crawler parsing non-HTML would follow), a page of broken HTML, and a page of absurd
    links under a ``<base href>`` pointing into another site.

    Links are written as absolute, root-relative and relative hrefs (some with
    fragments, some spelled un-normalised, some pages with ``<base href>``).

What counts as reachable (ground truth: :meth:`SyntheticWeb.reachable_detail`)
    A breadth-first crawl from the seeds, as a crawler sees the web:

    * every href is resolved against the page's base (``<base href>`` if present, else
      the page URL) and put through :func:`dedupnet.codec.urls.normalize` (default limits);
      hrefs that fail (``javascript:``, ``mailto:``, ``http://[bad``, over-long URLs)
      are dropped; the fragment is dropped, so ``#x`` is the base URL itself;
    * each normalised URL is considered once, at its smallest depth (seeds: depth 0);
    * with ``obey_robots`` a URL under ``/private/`` is *disallowed*: not fetched, its
      links not followed;
    * a URL the web does not serve is *missing* (answers 404);
    * a redirecting URL is fetched (it is in ``.redirects``, not in ``.pages``); its
      ``Location`` is a newly discovered URL one level deeper (depth + 1, like a link);
    * every other URL answers 200 (after the flaky 503s): it is in ``.pages``; links are
      followed from HTML pages only (not the PDF), and only if the page's depth is
      below ``max_depth``. The huge page has no links, so a crawler that caps bodies
      misses nothing.

    A correct de-duplicating crawler fetches each URL in ``.fetched`` (pages, missing,
    redirects) and nothing else; it fetches flaky pages ``flaky_failures + 1`` times.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import functools
import ipaddress
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import normalize, site_of

__all__ = ["Reach", "SyntheticWeb", "WebSpec", "main", "site_host"]

DEFAULT_PORT = 8077
DEFAULT_BIND = "127.77.0.0/16"
SERVER_NAME = b"dedupnet-synthweb"

# Page kinds.
HTML, REDIRECT, HUGE, PDF, BROKEN, ODD = range(6)

# Link forms: the low 3 bits pick the spelling, bit 3 adds a fragment.
ABS, ROOT, REL, ODD_SPELL, ABS_UPPER = range(5)
FRAGMENT = 8

_PUBLIC_DIRS = ("/", "/d0/", "/d1/", "/d1/x/", "/d2/y/z/")
_PRIVATE_DIRS = ("/private/", "/private/a/")
_WORDS = ("crawler", "url", "frontier", "site", "page", "link", "graph", "dedup", "redis", "fingerprint",
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


@dataclass
class WebSpec:
    """The shape of a synthetic web. Shares are probabilities in [0, 1]."""

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


def _relative(base_dir: str, path: str) -> str:
    """A relative href from directory ``base_dir`` (ends in "/") to absolute ``path``."""
    b = base_dir.split("/")[1:-1]
    d, _, name = path.rpartition("/")
    t = d.split("/")[1:]
    common = 0
    while common < len(b) and common < len(t) and b[common] == t[common]:
        common += 1
    href = "../" * (len(b) - common) + "".join(s + "/" for s in t[common:]) + name
    return href or "./"


class SyntheticWeb:
    """A deterministic web graph (built from ``spec``) and its HTTP server.

    Counters (reset with :meth:`reset_counts`):

    * ``fetch_counts[url]``: every request for a page URL (normalised ``http://host:port/path``),
      whatever the answer (503, 404, 301/302 and 200 alike);
    * ``answer_counts[url]``: the requests not answered 503 (what :meth:`duplicate_fetches` uses);
    * ``robots_fetches[url]``: requests for ``http://host:port/robots.txt``;
    * ``request_log``: ``(trio.current_time(), host, target, client)`` per request
      (robots.txt included; ``client`` is the client's address, ``"?"`` if unknown), when
      it arrived, for politeness checks; a deque keeping the last ``spec.request_log_size``.

    ``latency``: seconds every answer waits before it is sent, as a real site's would, so
    that crawlers are bound by how many requests they keep in flight, not by how fast this
    machine serves them. Each connection waits on its own: any number wait at once.
    """

    def __init__(self, spec: WebSpec | None = None, *, port: int = DEFAULT_PORT, idle_timeout: float = 30.0,
                 bind: str = DEFAULT_BIND, latency: float = 0.0):
        if not 0 <= latency < float("inf"):  # NaN too
            raise ValueError(f"latency must be a number of seconds >= 0, not {latency!r}")
        self.spec = spec if spec is not None else WebSpec()
        self.idle_timeout = idle_timeout
        self.latency = latency
        self.bind = bind
        self.hosts = [site_host(k, bind) for k in range(self.spec.sites)]
        self._site_index = {h: k for k, h in enumerate(self.hosts)}
        self._build()
        self.port = port
        self.fetch_counts: collections.Counter[str] = collections.Counter()
        self.answer_counts: collections.Counter[str] = collections.Counter()
        #: Per URL, the client address of every answered request (not 503), in order: which
        #: crawler fetched it (a crawler that binds its host's IP, as the daemons do).
        self.answered_by: dict[str, list[str]] = collections.defaultdict(list)
        self.robots_fetches: collections.Counter[str] = collections.Counter()
        self.request_log: collections.deque[tuple[float, str, str, str]] = collections.deque(
            maxlen=self.spec.request_log_size)

    # ------------------------------------------------------------------ graph

    def _build(self) -> None:
        """Draw the whole graph from one ``random.Random(seed)``; only ``random()`` is
        used, whose sequence Python keeps stable across versions."""
        sp = self.spec
        rng = random.Random(sp.seed)
        rnd = rng.random
        P, S = sp.pages, sp.sites

        def pick(seq):
            return seq[int(rnd() * len(seq))]

        # Sites: homes first, then sizes skewed by weight 1/sqrt(k+1).
        cum, total = [], 0.0
        for k in range(S):
            total += (k + 1) ** -0.5
            cum.append(total)
        self.site = site = list(range(S)) + [min(S - 1, bisect.bisect(cum, rnd() * total)) for _ in range(P - S)]

        kind = bytearray(P)  # HTML
        self.flaky = flaky = bytearray(P)
        private = bytearray(P)
        self.huge_id, self.pdf_id, self.broken_id, self.odd_id = S, S + 1, S + 2, S + 3
        self.loop_ids = (S + 4, S + 5)
        self.chain_ids = (S + 6, S + 7, S + 8)
        chain_target = S + 9
        kind[S], kind[S + 1], kind[S + 2], kind[S + 3] = HUGE, PDF, BROKEN, ODD
        self.redirect_to: dict[int, tuple[int, int]] = {}  # page -> (target page, status)
        for i in range(S + 10, P):
            r = rnd()
            if r < sp.share_redirect:
                kind[i] = REDIRECT
            elif r < sp.share_redirect + sp.share_flaky:
                flaky[i] = 1
            if rnd() < sp.private_share:
                private[i] = 1
        for i in (*self.loop_ids, *self.chain_ids):
            kind[i] = REDIRECT
        self.kind = kind

        paths = []
        for i in range(P):
            k = kind[i]
            if i < S:
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
                d = pick(_PRIVATE_DIRS) if private[i] else pick(_PUBLIC_DIRS)
                paths.append(f"{d}p{i}.html")
        self.paths = paths
        self._by_path: list[dict[str, int]] = [{} for _ in range(S)]
        for i, p in enumerate(paths):
            self._by_path[site[i]][p] = i

        # Pages a random link or redirect may point at: not the special ones.
        special = {self.huge_id, self.pdf_id, self.broken_id, self.odd_id}
        site_pages: list[list[int]] = [[] for _ in range(S)]
        for i in range(P):
            if i not in special:
                site_pages[site[i]].append(i)
        plain_html = [[i for i in sp_ if kind[i] == HTML] for sp_ in site_pages]

        def other_site(s: int) -> int:
            if S == 1:
                return s
            t = min(S - 1, bisect.bisect(cum, rnd() * total))
            return t if t != s else (s + 1 + int(rnd() * (S - 1))) % S

        for i in range(S + 10, P):
            if kind[i] == REDIRECT:
                ts = other_site(site[i]) if rnd() < sp.cross_site_share else site[i]
                cands = plain_html[ts] or plain_html[site[i]]
                self.redirect_to[i] = (pick(cands), 301 if rnd() < 0.5 else 302)
        a, b = self.loop_ids
        self.redirect_to[a], self.redirect_to[b] = (b, 301), (a, 302)
        r1, r2, r3 = self.chain_ids
        self.redirect_to[r1], self.redirect_to[r2], self.redirect_to[r3] = (r2, 301), (r3, 302), (chain_target, 301)

        # URLs that do not exist (404 targets), spread over the sites.
        n_missing = max(1, round(sp.share_404 * P))
        self.missing_site = [int(rnd() * S) for _ in range(n_missing)]
        self.missing_path = [f"{pick(_PUBLIC_DIRS)}gone{m}.html" for m in range(n_missing)]
        missing_by_site: list[list[int]] = [[] for _ in range(S)]
        for m, s in enumerate(self.missing_site):
            missing_by_site[s].append(m)

        # Links: target >= 0 is a page id, < 0 is missing URL -(m + 1).
        lomax_scale = sp.mean_out_degree - 1
        popular: list[list[int]] = [[] for _ in range(S)]  # every link target so far, per site
        self.links: list[list[int]] = [[] for _ in range(P)]
        self.forms: list[bytes] = [b""] * P
        self.base_opt = bytearray(P)
        for i in range(P):
            if kind[i] not in (HTML, BROKEN):
                continue
            s = site[i]
            u = rnd()
            degree = min(sp.max_out_degree, 1 + int(lomax_scale * ((1.0 - u) ** -0.5 - 1.0)))
            out: list[int] = []
            if i == 0:  # site 0's home page introduces the special pages
                out += [self.huge_id, self.pdf_id, self.broken_id, self.odd_id, a, r1]
            if i < S:  # every home page is a small site index
                out += [pick(site_pages[s]) for _ in range(min(10, len(site_pages[s])))]
            for _ in range(degree):
                ts = other_site(s) if rnd() < sp.cross_site_share else s
                if rnd() < sp.share_404:
                    out.append(-(pick(missing_by_site[ts] or range(n_missing)) + 1))
                    continue
                if rnd() < sp.dup_share and popular[ts]:
                    t = pick(popular[ts])
                else:
                    t = pick(site_pages[ts])
                popular[ts].append(t)
                out.append(t)
            self.links[i] = out
            self.forms[i] = bytes(int(rnd() * 5) | (FRAGMENT if rnd() < 0.15 else 0) for _ in out)
            r = rnd()
            self.base_opt[i] = 0 if r < 0.8 else 1 if r < 0.9 else 2 if r < 0.95 else 3
        self.base_opt[self.broken_id] = 0
        # Pages of the odd page's base site under /d1/: its relative links point at them.
        self._odd_base_site = (site[self.odd_id] + 1) % S
        self._odd_targets = [i for i in site_pages[self._odd_base_site] if paths[i].startswith("/d1/p")][:3]
        self._filler = [" ".join(pick(_WORDS) for _ in range(n)) for n in (20, 60, 150, 300)]

    @property
    def port(self) -> int:
        return self._port

    @port.setter
    def port(self, value: int) -> None:
        self._port = value
        self.origins = [f"http://{h}" if value == 80 else f"http://{h}:{value}" for h in self.hosts]
        self._cache: dict[int, bytes] = {}
        self._huge: bytes | None = None

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

    # --------------------------------------------------------------- content

    def robots_txt(self, site: int) -> bytes:
        return (f"# synthetic web, site {site}\n"
                "User-agent: BadBot\nDisallow: /\n\n"
                "User-agent: *\nDisallow: /private/\n").encode()

    def _href(self, t: int, form: int, base_site: int, base_dir: str, k: int) -> str:
        if t >= 0:
            ts, tp = self.site[t], self.paths[t]
        else:
            ts, tp = self.missing_site[-t - 1], self.missing_path[-t - 1]
        style = form & 7
        if ts != base_site or style == ABS:
            href = self.origins[ts] + tp
        elif style == ABS_UPPER:
            href = "HTTP://" + self.origins[ts][7:] + tp
        elif style == ROOT:
            href = tp
        elif style == REL:
            href = _relative(base_dir, tp)
        else:  # ODD_SPELL: a dot segment or an escaped unreserved character
            href = tp.replace("/p", "/%70", 1) if "/p" in tp else "/." + tp
        if form & FRAGMENT:
            href += f"#s{k}"
        return href

    def _html(self, i: int) -> bytes:
        s, path = self.site[i], self.paths[i]
        opt = self.base_opt[i]
        base_tag = ""
        base_site, base_dir = s, path[: path.rfind("/") + 1]
        if opt == 1:
            base_tag = f'<base href="{self.origins[s]}{base_dir}">'
        elif opt == 2:
            base_tag, base_dir = '<base href="/">', "/"
        elif opt == 3:
            base_site, base_dir = (s + 1) % self.spec.sites, "/d1/"
            base_tag = f'<base href="{self.origins[base_site]}/d1/">'
        forms = self.forms[i]
        items = "".join(
            f'<li><a href="{self._href(t, forms[k], base_site, base_dir, k)}">link {k}</a></li>\n'
            for k, t in enumerate(self.links[i]))
        return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Page {i}</title>{base_tag}'
                f"</head>\n<body><h1>Page {i} of site {s}</h1>\n<p>{self._filler[i % 4]}</p>\n"
                f"<ul>\n{items}</ul>\n</body></html>\n").encode()

    def _broken_html(self, i: int) -> bytes:
        """Broken markup whose links are still unambiguous (quoted, unquoted, uppercase,
        attributes spread over lines, unclosed tags), plus bytes that are not UTF-8."""
        # Broken, but not so broken that a browser would see no links: an unclosed
        # <title> would swallow the whole document as its text (HTML5 RCDATA).
        parts = ['<html><head><title>broken</title><body><p>a < b && c > d</div></span>\n']
        for k, t in enumerate(self.links[i]):
            tp = self._target_url(t) if k % 2 else self._href(t, ROOT, self.site[i], "/", k)
            parts.append((f"<a href={tp}>unquoted {k}</a>", f"<A HREF='{tp}'>UPPER {k}",
                          f'<a\nclass="c{k}"\n   href = "{tp}"\n>spread</a>',
                          f'<p><b><i><a href="{tp}">unclosed {k}</b></i>')[k % 4] + "\n")
        parts.append("<table><tr><td>cell<td>cell</table")
        return "".join(parts).encode() + b"\n\xff\xfe not utf-8 \xc3\n<p>end"

    def _odd_hrefs(self) -> tuple[str, list[str]]:
        other = self.origins[self._odd_base_site]
        hrefs = ["javascript:void(0)", "mailto:webmaster@example.invalid", "/d0/" + "a" * 3000 + ".html",
                 "http://[bad", "../../..", "#x", "", "ftp://127.77.0.1/file", "data:text/html,hi",
                 f"{self.origins[0]}/%7Euser/", "//" + other[7:] + "/d0/../d1/./index.html?"]
        hrefs += [self.paths[j][len("/d1/"):] for j in self._odd_targets]
        return other + "/d1/", hrefs

    def _odd_links(self) -> list[str]:
        """What a crawler extracts from the odd page: its hrefs resolved against its base."""
        import urllib.parse

        base, hrefs = self._odd_hrefs()
        out = []
        for h in hrefs:
            try:
                out.append(normalize(urllib.parse.urljoin(base, h)))
            except (ValueError, BadURL):
                pass
        return out

    def _odd_html(self) -> bytes:
        base, hrefs = self._odd_hrefs()
        links = "".join(f'<a href="{h}">odd {k}</a>\n' for k, h in enumerate(hrefs))
        return (f'<html><head><title>Odd links</title><base href="{base}"></head>\n'
                f"<body>\n{links}</body></html>\n").encode()

    def _huge_html(self) -> bytes:
        if self._huge is None:
            line = b"<p>" + " ".join(_WORDS).encode() + b"</p>\n"
            head = b"<!DOCTYPE html>\n<html><head><title>Huge</title></head><body>\n"
            n = self.spec.huge_size // len(line) + 1
            self._huge = head + line * n + b"</body></html>\n"
        return self._huge

    def _pdf(self) -> bytes:
        trap = self.origins[0] + "/trap/pdf-link.html"
        return (b"%PDF-1.4\n% synthetic\n1 0 obj << /Type /Catalog >> endobj\n"
                b"2 0 obj << /URI (" + trap.encode() + b") >> endobj\n"
                b'<a href="' + trap.encode() + b'">not a link: this is a PDF</a>\n%%EOF\n')

    def _body(self, i: int) -> bytes:
        k = self.kind[i]
        if k == HUGE:
            return self._huge_html()
        body = self._cache.get(i)
        if body is None:
            body = (self._pdf() if k == PDF else self._broken_html(i) if k == BROKEN
                    else self._odd_html() if k == ODD else self._html(i))
            if len(self._cache) < 50_000:
                self._cache[i] = body
        return body

    def expected_response(self, url: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``(status, headers, body)`` the server answers for ``url`` once any flaky 503s
        are over. Pure: counts nothing."""
        i = self.lookup(normalize(url))
        if i is None:
            return 404, [(b"content-type", b"text/html; charset=utf-8")], b"<html><body>Not Found</body></html>\n"
        if i in self.redirect_to:
            t, status = self.redirect_to[i]
            # Same-site redirects use a root-relative Location (RFC 9110 allows it).
            loc = self.paths[t] if self.site[t] == self.site[i] and t % 2 else self.url(t)
            return status, [(b"content-type", b"text/html; charset=utf-8"), (b"location", loc.encode())], \
                b"<html><body>Moved</body></html>\n"
        ctype = b"application/pdf" if self.kind[i] == PDF else b"text/html; charset=utf-8"
        return 200, [(b"content-type", ctype)], self._body(i)

    # ---------------------------------------------------------------- counters

    def reset_counts(self) -> None:
        """Forget all requests (flaky pages fail again)."""
        self.fetch_counts.clear()
        self.answer_counts.clear()
        self.answered_by.clear()
        self.robots_fetches.clear()
        self.request_log.clear()

    def duplicate_fetches(self) -> int:
        """Requests beyond the first for each URL, not counting 503 answers."""
        return sum(c - 1 for c in self.answer_counts.values() if c > 1)

    # ----------------------------------------------------------------- serving

    def _answer(self, site: int, method: bytes, target: bytes,
                peer: str | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        path = target.decode("latin-1")
        self.request_log.append((trio.current_time(), self.hosts[site], path, peer or "?"))
        if method not in (b"GET", b"HEAD"):
            return 405, [(b"allow", b"GET, HEAD")], b""
        origin = self.origins[site]
        if not path.startswith("/"):
            return 400, [], b""
        if path == "/robots.txt":
            self.robots_fetches[origin + path] += 1
            return 200, [(b"content-type", b"text/plain")], self.robots_txt(site)
        try:
            url = normalize(origin + path)
        except BadURL:
            url = origin + path
        self.fetch_counts[url] += 1
        i = self.lookup(url)
        if i is not None and self.flaky[i] and self.fetch_counts[url] <= self.spec.flaky_failures:
            return 503, [(b"content-type", b"text/plain")], b"Service Unavailable\n"
        self.answer_counts[url] += 1
        self.answered_by[url].append(peer or "?")
        return self.expected_response(url)

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One TCP connection: its site is the address it reached, its client the peer's."""
        site = self._site_index.get(stream.socket.getsockname()[0], 0)
        try:
            peer = stream.socket.getpeername()[0]
        except OSError:
            peer = None
        await self.serve_connection(stream, site, peer)

    async def serve_connection(self, stream: trio.abc.Stream, site: int, peer: str | None = None) -> None:
        """One connection to ``site``: HTTP/1.1 keep-alive loop; every read and write is
        under ``idle_timeout``; each answer waits ``latency`` first; protocol errors get
        a 400 and close the connection. Closes ``stream``."""
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = None
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        with trio.move_on_after(self.idle_timeout):
                            conn.receive_data(await stream.receive_some(65536))
                            continue
                        return
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                status, headers, body = self._answer(site, request.method, request.target, peer)
                if self.latency:
                    await trio.sleep(self.latency)
                headers = [*headers, (b"content-length", str(len(body)).encode()), (b"server", SERVER_NAME)]
                out = conn.send(h11.Response(status_code=status, headers=headers))
                if request.method != b"HEAD":
                    out += conn.send(h11.Data(data=body))
                out += conn.send(h11.EndOfMessage())
                with trio.move_on_after(self.idle_timeout) as cs:
                    await stream.send_all(out)
                if cs.cancelled_caught or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except h11.RemoteProtocolError:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                try:
                    out = conn.send(h11.Response(status_code=400, headers=[
                        (b"content-length", b"0"), (b"connection", b"close"), (b"server", SERVER_NAME)]))
                    out += conn.send(h11.EndOfMessage())
                    with trio.move_on_after(1):
                        await stream.send_all(out)
                except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _open_listeners(self, port: int) -> list[trio.SocketListener]:
        """One listener per site address, all on ``port``; ``port=0``: a port free on every address."""
        for _attempt in range(20):
            listeners: list[trio.SocketListener] = []
            try:
                first = await trio.open_tcp_listeners(port, host=self.hosts[0])
                listeners += first
                chosen = first[0].socket.getsockname()[1]
                for h in self.hosts[1:]:
                    listeners += await trio.open_tcp_listeners(chosen, host=h)
                if chosen != self.port:
                    self.port = chosen
                return listeners
            except OSError:
                for lst in listeners:
                    await lst.aclose()
                if port != 0:
                    raise
        raise OSError("no port free on every site address")

    async def serve(self, *, host_port: int | None = None,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve every site until cancelled. ``host_port``: None -> ``self.port``; 0 -> a
        free port (``self.port`` and all URLs follow it). ``nursery.start`` returns the port."""
        listeners = await self._open_listeners(self.port if host_port is None else host_port)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(self.port)
        finally:
            for lst in listeners:
                await trio.aclose_forcefully(lst)


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``dedupnet web``."""
    p = parser_class(prog="dedupnet web", description="Serve a seeded synthetic web on loopback "
                     "(site k at 127.77.{k//250}.{k%250+1}, one port for all sites), or in another network (--bind).")
    p.add_argument("--pages", type=int, default=WebSpec.pages, help="pages of the web (default %(default)s)")
    p.add_argument("--sites", type=int, default=WebSpec.sites, help="sites the pages are spread over (default %(default)s)")
    p.add_argument("--seed", type=int, default=WebSpec.seed,
                   help="seed of the link graph: the same seed gives the same web (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of every site (0: any free one; default %(default)s)")
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="seed URLs to print (default %(default)s)")
    p.add_argument("--latency", type=float, default=0.0, metavar="S",
                   help="seconds every answer waits before it is sent, as on the real web (default 0)")
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="CIDR",
                   help=f"network the sites listen in, site k at its ((k//250)*256 + k%%250 + 1)-th address "
                        f"(default {DEFAULT_BIND}); the addresses must be local, e.g. "
                        f"`ip route add local 10.77.0.0/16 dev lo`")
    return p


def main(argv: list[str] | None = None, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> int:
    """Serve a synthetic web until Ctrl-C (``dedupnet web``)."""
    p = build_parser(parser_class)
    args = p.parse_args(argv)
    try:
        web = SyntheticWeb(WebSpec(pages=args.pages, sites=args.sites, seed=args.seed), port=args.port,
                           bind=args.bind, latency=args.latency)
    except ValueError as e:
        p.error(str(e))

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(web.serve)
            st = web.stats()
            print(f"synthetic web: {st['pages']} pages, {st['sites']} sites at "
                  f"{web.hosts[0]} .. {web.hosts[-1]} port {port}; {st['links']} links, "
                  f"{st['distinct_link_targets']} distinct targets", flush=True)
            reach = web.reachable_detail(web.seeds(args.seeds))
            print(f"reachable from the seeds: {len(reach.pages)} pages, {len(reach.missing)} missing, "
                  f"{len(reach.redirects)} redirects, {len(reach.disallowed)} disallowed", flush=True)
            for s in web.seeds(args.seeds):
                print(s, flush=True)

    rc = 0
    try:
        trio.run(run)
    except* KeyboardInterrupt:  # Ctrl-C: the normal way to stop
        pass
    except* OSError as eg:  # e.g. the port is taken
        print(f"dedupnet web: {eg.exceptions[0]}", file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
