"""A set's life at a center: its stages and steps, its stored record, what the core
waits for while a look-up is out, and the checks every message's set passes.

A set enters stage LAN (an own set: from a LAN host, or a peer's URLs of sites homed
here) or FOREIGN (another network's set). When a stage is done (every answer in, or
given up), the core picks the set's next :class:`Step`; the table of center_host/stages.py
says where it leads and which function carries it out.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar, Union

import orjson
import xxhash

from dedupnet.codec.counters import Counters
from dedupnet.codec.messages import Frame
from dedupnet.codec.numbers import split_number
from dedupnet.codec.pools import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL
from dedupnet.codec.urls import canonical_set, site_of

from .config import CenterConfig
from .events import Member, Peer

log = logging.getLogger("dedupnet.center")
K = TypeVar("K")
V = TypeVar("V")

#: Sets held back (unacknowledged) per host while the center is full: far above what a
#: host sends before it waits for acks (its ``max_unacked``), so only a host that does
#: not wait is refused; it keeps the sets, unacknowledged.
MAX_HELD_PER_HOST = 1024
#: Own set numbers remembered after admission, to tell a late answer from an unknown one
#: (a few minutes of sets at the rates measured; 8 bytes and a dict slot each).
RECENTLY_CONCLUDED = 4096


class Stage(str, enum.Enum):
    LAN = "lan"  # own set, asking the LAN's hosts (§2.3), held in local_reduce_pool
    DIST = "dist"  # own set, asking the other networks (§2.4), held in dist_reduce_pool
    FOREIGN = "foreign"  # another network's set, asking our LAN (§2.4), in dist_reduce_pool
    HOME = "home"  # own set, its URLs of other networks' sites with their home centers (§11)
    CHECK = "check"  # own set, its URLs of sites that moved here asked of their previous home (§11)


POOL_OF = {Stage.LAN: LOCAL_REDUCE_POOL, Stage.DIST: DIST_REDUCE_POOL, Stage.FOREIGN: DIST_REDUCE_POOL,
           Stage.HOME: DIST_REDUCE_POOL, Stage.CHECK: DIST_REDUCE_POOL}
#: Stages that wait for peer networks and are never concluded without them.
ROUTED = (Stage.HOME, Stage.CHECK)



class Step(enum.Enum):
    """What a set does when its stage is done."""

    TO_PEERS = "ask the peer networks (§2.4)"
    GATHER = "wait to go to the peers with the LAN's other sets (R4)"
    TO_PREVIOUS_HOMES = "ask the previous homes of sites that moved here (§11)"
    TO_HOMES = "admit what is homed here, send the rest to its home networks (§11)"
    ADMIT = "admit what is left, assign it as tasks"
    LOOK_UP = "look the foreign set up in the admitted record (exact mode)"
    REPLY = "answer the foreign set's origin"


# -- a set in flight ------------------------------------------------------------------
@dataclass
class SetRecord:
    """What ``local_reduce_pool``/``dist_reduce_pool`` hold for one ``number``: the
    stored frame (flag=2, its current URL_set) plus who was asked and who answered."""

    frame: Frame
    stage: Stage
    origin: str  # originating host IP (own sets) or "net:N" (foreign sets)
    awaiting: set[str]
    answered: set[str] = field(default_factory=set)
    attempts: int = 1
    incomplete: bool = False
    #: R4: the numbers of the LAN's sets gathered into this one (besides its own).
    gathered: tuple[int, ...] = ()
    #: The set as it arrived (:func:`~dedupnet.codec.urls.set_digest`; 0: not known).
    digest: int = 0
    #: Stage HOME: home network -> its URLs of this set, not yet taken there; stage
    #: CHECK: previous home network -> the URLs it has not answered for yet.
    routes: dict[int, list[str]] = field(default_factory=dict)

    @property
    def number(self) -> int:
        return self.frame.number

    def dump(self) -> bytes:
        return orjson.dumps({
            "frame": self.frame.to_json(), "stage": self.stage.value, "origin": self.origin,
            "awaiting": sorted(self.awaiting), "answered": sorted(self.answered),
            "attempts": self.attempts, "incomplete": self.incomplete, "gathered": list(self.gathered),
            "digest": self.digest, "routes": {str(n): urls for n, urls in self.routes.items()},
        })

    @classmethod
    def load(cls, data: bytes) -> "SetRecord":
        d = orjson.loads(data)
        f = d["frame"]
        return cls(Frame(dict(f["URL_set"]), f["IP"], f["number"], f["flag"]), Stage(d["stage"]), d["origin"],
                   set(d["awaiting"]), set(d["answered"]), d["attempts"], d["incomplete"], tuple(d.get("gathered", ())),
                   d.get("digest", 0), {int(n): urls for n, urls in d.get("routes", {}).items()})


class Rejected(Exception):
    """Input the protocol does not allow; ``reason`` names it (and labels its counter).
    ``level``: how loudly it is logged (a late answer is counted all the same, but it is
    what re-sends and time limits produce, not news for the operator)."""

    def __init__(self, reason: str, message: str, level: int = logging.WARNING):
        super().__init__(message)
        self.reason = reason
        self.level = level


def remember(d: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    """``d[key] = value`` as its newest entry; the oldest go beyond ``limit`` entries.
    An OrderedDict, not a dict: a dict whose oldest entries are deleted one by one keeps
    their empty slots at the front of its table until it is resized, so finding the
    oldest (``next(iter(d))``) scans them all, and a full cache that turns over paid for
    every entry it had dropped since its last resize."""
    d[key] = value
    d.move_to_end(key)
    while len(d) > limit:
        d.popitem(last=False)


def check_number(config: CenterConfig, sender: Member, number: int) -> None:
    """A new set's number carries its sender's network (and, for a LAN host, its host
    part): a number made in someone else's name is refused, so it cannot take the
    number its owner will use (docs/PROTOCOL.md §7)."""
    network, host, _ = split_number(number)
    if isinstance(sender, Peer):
        ok = network == sender.network
    else:
        expected = config.host_id_of(sender.ip)
        ok = network == config.network and (expected is None or host == expected)
    if not ok:
        raise Rejected("number-not-sender", f"set number {number} (network {network}, host {host}) "
                                            f"is not {sender}'s")


def canonical_urls(counters: Counters, sender: Member, number: int, url_set: dict[str, int]) -> dict[str, int]:
    """``url_set`` with every URL in the form a host would have stored it (docs/PROTOCOL.md
    §8): nothing a peer spells enters a pool unchecked. What cannot be a pool's URL is
    dropped and counted."""
    url_set, bad = canonical_set(url_set)
    if bad:
        counters.inc("bad_input", reason="bad-url", amount=bad)
        log.warning("set %d from %s: %d URLs dropped (not http(s) URLs a pool may hold)", number, sender, bad)
    return url_set


def task_key(number: int, host: str) -> str:
    """The ``task_URL`` key of set ``number``'s URLs for ``host`` ("" = no host yet)."""
    return f"{number}:{host}"


def task_parts(key: str) -> tuple[int, str]:
    number, host = key.split(":", 1)
    return int(number), host


def owner_of(url: str, hosts: Iterable[str]) -> str:
    """The host whose ``task_pool`` gets ``url``: rendezvous hashing on the URL's site,
    so one site stays with one host (politeness) and a host that leaves moves only
    its own sites (paper gap 8; a site-hash task split, as crawler engines do)."""
    site = site_of(url).encode()
    return max(hosts, key=lambda h: xxhash.xxh3_64_intdigest(site + b"@" + h.encode()))



# -- what a look-up in the admitted record is for ------------------------------------------
@dataclass(frozen=True)
class OwnSetLookup:
    """A new own set (from a LAN host, or a peer's URLs of sites homed here): its URLs
    already admitted, claimed or held elsewhere are dropped before it is stored."""

    sender: Member
    frame: Frame


@dataclass(frozen=True)
class ForeignSetLookup:
    """Another network's set (or a new home's question about sites that moved): answered
    from the admitted record and the claims."""

    rec: SetRecord


PendingLookup = Union[OwnSetLookup, ForeignSetLookup]
