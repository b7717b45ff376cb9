"""Exact mode's claims at a center (docs/PROTOCOL.md, "Exact mode"): which own set in
flight holds a URL, the rule that decides a URL two networks' sets both hold (R2: the
lower number wins), and a bounded cache of URLs another network's set holds. A part of
the center's sans-I/O core (:class:`~center_host.protocol.CenterProtocol`) that owns
this state; the sets it reads are the stages' (center_host/stages.py), passed in."""

from __future__ import annotations

from collections import OrderedDict

from .config import CenterConfig
from .homes import Homes
from .sets import SetRecord, Stage, remember


class Claims:
    """URL -> the own set in flight that holds it, and URL -> another network's set
    told here that the URL was unseen."""

    def __init__(self, config: CenterConfig) -> None:
        self.config = config
        self.by_url: dict[str, int] = {}
        #: A bounded cache: URL -> the lowest number of another network's set told here
        #: that the URL was unseen (so that set held it). Not needed for exactness, only
        #: to drop such URLs early; lost on restart (PROTOCOL.md §10).
        self.held_elsewhere: OrderedDict[str, int] = OrderedDict()

    def claim(self, url: str, number: int) -> None:
        self.by_url[url] = number

    def release(self, url: str, number: int) -> None:
        """Set ``number`` no longer holds ``url`` (if it was the one that did)."""
        if self.by_url.get(url) == number:
            del self.by_url[url]

    def drop(self, url: str) -> None:
        self.by_url.pop(url, None)

    def claimed(self, url: str, sets: dict[int, SetRecord], homes: Homes | None) -> bool:
        """A set of ours holds ``url`` and will see it decided. Not a set that routes it
        to another home when it is homed here now (routed under an earlier map, it comes
        back here through that home): dropping it against such a claim could drop it
        twice over, once here and once at the home that passes it back."""
        number = self.by_url.get(url)
        if number is None:
            return False
        holder = sets.get(number)
        return not (homes is not None and holder is not None and holder.stage is Stage.HOME
                    and homes.home_of(url) == self.config.network)

    def decided_here(self, url: str, sets: dict[int, SetRecord]) -> bool:
        """A set a peer routed here holds ``url``: it will be admitted here whatever the
        map says now (a routed set is never routed on)."""
        holder = sets.get(self.by_url.get(url, 0))
        return holder is not None and holder.origin.startswith("net:")

    def settle(self, rec: SetRecord, admitted: list[bool], sets: dict[int, SetRecord],
               homes: Homes | None) -> tuple[list[str], list[tuple[str, int]]]:
        """Another network's set ``rec``, looked up in the admitted record (``admitted``,
        index-aligned with its URLs): the URLs not marked seen in its answer yet that are
        seen here; and those an own set of a higher number held, given up to ``rec`` (as
        URL, that set's number), for that set to drop."""
        seen: list[str] = []
        losses: list[tuple[str, int]] = []
        for url, found in zip(list(rec.frame.URL_set), admitted):
            if rec.frame.URL_set[url]:
                continue
            if homes is not None:
                # A previous home says what it admitted or will admit (_checked_here): a
                # set a peer routed here is decided here, never routed on, so its claims
                # count; what an own set claims, it is routing to the asker, which
                # decides it there.
                if found or self.decided_here(url, sets):
                    seen.append(url)
                continue
            own = self.by_url.get(url)
            holder = own if own is not None else self.held_elsewhere.get(url)
            if found or (holder is not None and holder < rec.number):
                seen.append(url)
                continue
            if own is not None:  # R2: the requesting set has the lower number and wins the URL
                del self.by_url[url]
                losses.append((url, own))
            self.note_held_elsewhere(url, rec.number)
        return seen, losses

    def note_held_elsewhere(self, url: str, number: int) -> None:
        """Remember (newest last) that another network's set ``number`` holds ``url``;
        the oldest entries go beyond ``held_elsewhere_max``. Not under a re-crawl policy:
        that set may still give the URL up because a third network admitted it not long
        ago (within its age, but long before the offers this entry would drop), so an
        entry would hold a URL that is due away from its re-crawl (PROTOCOL.md,
        "Re-crawl by age")."""
        if self.config.recrawl is not None:
            return
        remember(self.held_elsewhere, url, number, self.config.held_elsewhere_max)

    def held_elsewhere_hit(self, url: str) -> bool:
        """``url`` is in ``held_elsewhere``; a hit makes it the newest entry, so the URLs
        found again and again (a site's front page, linked from everywhere) stay while
        the cache turns over (least recently used out first)."""
        if url not in self.held_elsewhere:
            return False
        self.held_elsewhere.move_to_end(url)
        return True
