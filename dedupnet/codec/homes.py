"""One home network per site (docs/PROTOCOL.md §11).

Every large crawler partitions the web by site across its workers; dedupnet gives each
site one *home network*, whose center alone admits the site's URLs, so a URL costs one
message to one center (none when it is found at home), politeness and robots.txt hold
for the whole system, and a network that is down delays only its own sites.

The map is weighted rendezvous (highest-random-weight) hashing of the site over the
configured networks: each network scores ``weight / -ln(u)`` with ``u`` uniform in
(0, 1) from ``xxh3(site # network)``, and the highest score is home. A network of weight
0 is home to no site (a network being retired: it still answers for its past). Every center
computes the same map from the same ``{network: weight}``; a network's expected share
is its weight over the sum; adding one network of weight ``w`` moves only the share
it takes, about ``w / (W + w)`` of the sites, all of them to the new network.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import xxhash

from dedupnet.codec.urls import site_of

__all__ = ["HomeMap", "parse_weights"]

_SCALE = 1.0 / 2.0**64
#: Sites whose home a map remembers. A center asks the home of every URL it decides
#: and of every URL a home takes, so a crawl spread over more sites than it remembers
#: pays the hashes of every network for most URLs; beyond the bound the memory is
#: cleared and filled again (the sites a crawl is on now come back first). Room for the
#: sites of a large crawl, at a bounded cost per site remembered (docs/BENCHMARKS.md).
CACHED_SITES = 1 << 18


class HomeMap:
    """``{network id: weight}`` -> the home network of a site or URL."""

    def __init__(self, weights: Mapping[int, float]):
        if not weights:
            raise ValueError("a home map needs at least one network")
        for network, weight in weights.items():
            if not 1 <= network <= 65535:
                raise ValueError(f"network id {network} outside 1..65535")
            if not (weight >= 0 and math.isfinite(weight)):
                raise ValueError(f"network {network}: weight must be a number >= 0, not {weight!r}")
        if not any(weights.values()):
            raise ValueError("a home map needs a network of positive weight")
        self.weights = dict(sorted(weights.items()))
        self._salted = [(n, w, b"#%d" % n) for n, w in self.weights.items() if w > 0]
        self._known: dict[str, int] = {}  # site -> its home, up to CACHED_SITES of them

    def home_of_site(self, site: str) -> int:
        home = self._known.get(site)
        if home is None:
            if len(self._known) >= CACHED_SITES:
                self._known.clear()
            home = self._known[site] = self._score(site)
        return home

    def _score(self, site: str) -> int:
        """The network of the highest ``weight / -ln(u)`` (the first of equal scores)."""
        key = site.encode()
        h, log = xxhash.xxh3_64_intdigest, math.log
        best, home = -1.0, 0
        for network, weight, salt in self._salted:
            score = weight / -log((h(key + salt) + 0.5) * _SCALE)
            if score > best:
                best, home = score, network
        return home

    def home_of(self, url: str) -> int:
        """The home network of a normalised URL's site."""
        return self.home_of_site(site_of(url))

    def describe(self) -> str:
        """The map as text every center must agree on, e.g. ``"1:1,2:1,3:2.5"``."""
        return ",".join(f"{n}:{w:g}" for n, w in self.weights.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HomeMap) and self.weights == other.weights

    def __repr__(self) -> str:
        return f"HomeMap({self.describe()})"


def parse_weights(items: list[str] | str) -> dict[int, float]:
    """``["3=2", "4=0.5"]`` (or ``"3=2,4=0.5"``) -> ``{3: 2.0, 4: 0.5}`` (the ``weights`` setting)."""
    out: dict[int, float] = {}
    for item in items.split(",") if isinstance(items, str) else items:
        network, sep, weight = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(network)] = float(weight)
        except ValueError:
            raise ValueError(f"a network weight is NETWORK=WEIGHT (e.g. 3=2), not {item!r}") from None
    return out
