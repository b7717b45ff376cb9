"""A center's core configuration: what its sans-I/O core (center_host/protocol.py) is
told at start, checked once here."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.codec.homes import HomeMap
from dedupnet.codec.numbers import check_network, host_id_from_ip
from dedupnet.codec.settings import default_of

# -- configuration -------------------------------------------------------------------
PARTITION_POLICIES = ("wait", "admit")
ROUTINGS = ("home", "broadcast")
FOREIGN_LOOKUPS = ("center", "lan")
LOCAL_LOOKUPS = FOREIGN_LOOKUPS


@dataclass(frozen=True)
class CenterConfig:
    network: int
    lan: str  # CIDR of this center's LAN
    peers: dict[int, str] = field(default_factory=dict)  # network id -> CIDR
    mode: str = default_of("mode")
    answer_timeout: float = default_of("answer_timeout")
    max_resends: int = default_of("max_resends")
    #: After a restart, how long members get to reconnect before a stored set is asked again.
    resume_grace: float = 5.0
    #: Own sets in flight before new flag=1 frames wait (unacknowledged, so the hosts
    #: slow down): back-pressure, so waiting stays bounded (the hosts' URL_pool is the buffer).
    max_in_flight: int = 16
    #: What a set does about a member that does not answer (docs/PROTOCOL.md §10):
    #: ``"wait"`` (exact mode's default): slow is not dead — re-send with back-off for as
    #: long as the member is alive; a LAN host that leaves is not waited for, a peer
    #: network that is down is (the set stays in ``dist_reduce_pool``) until it is back or
    #: removed from the configuration. ``"admit"`` (paper mode's default, the paper's
    #: "within the time limit"): after ``max_resends`` the set concludes with the answers
    #: it has, counted as ``concluded_incomplete``.
    partition_policy: str | None = None
    #: Longest pause between re-sends to a member that is alive but slow (``wait``).
    max_resend_interval: float = 30.0
    #: Who answers another network's set here (§2.4): ``"lan"``, every LAN host (the
    #: paper; paper mode always); ``"center"`` (exact mode's default), this center's
    #: admitted record and claims alone — every URL its hosts crawl or queue was admitted
    #: by it — so a URL costs one look-up per network instead of one per host in the
    #: system. What a host knows from outside the protocol (``dedupnet finish``) is then
    #: used for its own LAN's sets only (docs/PROTOCOL.md §10).
    foreign_lookup: str | None = None
    #: Who answers this LAN's own sets (§2.3): ``"lan"``, every other LAN host (the paper;
    #: paper mode always); ``"center"`` (exact mode's default), the look-up of R1 alone —
    #: the same argument as ``foreign_lookup``: what a LAN host has crawled or queued, its
    #: center admitted — so a URL costs one look-up per network, not one per host of its
    #: LAN as well, and a set skips a stage. What a host knows from outside the protocol
    #: then protects that host's own sets only (docs/PROTOCOL.md §10).
    local_lookup: str | None = None
    #: URLs remembered as held by another network's set, or (home routing) as taken by
    #: their home (exact mode; memory only, an early drop, not a correctness record):
    #: 158 bytes of Python memory each (measured, 53-character URLs), so 3.2 MB when
    #: full. A center notes about one URL per four pages its LAN crawls, so the cache
    #: is full early in a long crawl and its memory then stays flat (at 200,000 it kept
    #: growing for hours: a soak's centers grew 39-82 bytes per page); a hit keeps its
    #: entry (least recently used out first). Its worth, measured: 2.8 bytes per
    #: distinct URL of the WAN's (a 3 x 3 sim: center frames 6.3 B/URL with it, 9.1
    #: without).
    held_elsewhere_max: int = 20_000
    #: Re-crawl by age (dedupnet/adapters/storage/recrawl.py): the admitted record (the pools) answers
    #: "seen" for a URL's age only, and ``held_elsewhere`` is not kept. None: for ever.
    recrawl: RecrawlPolicy | None = None
    #: Exact mode, R4 (docs/PROTOCOL.md §10), and the frames to a home network (§11):
    #: a gathered set goes as soon as it holds this many URLs, even while one of this
    #: center's own is out (it waits for nothing else: Nagle's rule).
    gather_max: int = 1000
    #: Routed frames (§11) out with one home network at once, each up to ``gather_max``
    #: URLs. A frame's round trip is the home's whole turn (its inbox, its look-up, its
    #: durable write) and then the ack's, so one frame at a time let at most
    #: ``gather_max`` URLs cross per round trip however many waited; a few bound what a
    #: reconnection sends again.
    routed_frames_out: int = 4
    #: Exact mode, where a URL is decided (docs/PROTOCOL.md §11): ``"home"`` (the
    #: default), by the center of its site's home network alone — one message to one
    #: center for a URL of another network's site, none for the rest; ``"broadcast"``,
    #: by asking every peer network (§10), the baseline. Paper mode always broadcasts.
    routing: str | None = None
    #: ``routing = "home"``: each network's share of the sites (capacity); 1 if absent,
    #: 0 for a network being retired (home to no site, still asked about its past).
    weights: dict[int, float] = field(default_factory=dict)
    #: The maps in force before (``{network: weight}`` each): a URL of a site that moved
    #: here is admitted only once each earlier home has said it did not admit it (§11,
    #: "Changing the map").
    previous_weights: tuple[dict[int, float], ...] = ()
    #: ``routing = "home"``: URLs this center may hold for home networks that have not
    #: taken them yet (one that is down); above it new sets wait unacknowledged.
    max_routed_waiting: int = 1_000_000
    #: Seconds a LAN host may be silent (not connected) before its ledger — every URL
    #: given to it that it has not reported finished — goes to the live hosts, whole
    #: sites at a time, and it stops being one of the LAN's hosts (docs/PROTOCOL.md
    #: section 12). 0: never (``dedupnet reassign`` does it at once).
    reissue_after: float = default_of("reissue_after")

    def __post_init__(self) -> None:
        check_network(self.network)
        for peer in self.peers:
            check_network(peer, "a peer's network")
        if self.mode not in ("exact", "paper"):
            raise ValueError(f"mode must be 'exact' or 'paper', not {self.mode!r}")
        if self.partition_policy is None:
            object.__setattr__(self, "partition_policy", "wait" if self.mode == "exact" else "admit")
        if self.partition_policy not in PARTITION_POLICIES:
            raise ValueError(f"partition_policy must be one of {PARTITION_POLICIES}, not {self.partition_policy!r}")
        if self.foreign_lookup is None:
            object.__setattr__(self, "foreign_lookup", "center" if self.mode == "exact" else "lan")
        if self.foreign_lookup not in FOREIGN_LOOKUPS or (self.mode == "paper" and self.foreign_lookup != "lan"):
            raise ValueError(f"foreign_lookup must be one of {FOREIGN_LOOKUPS} ('lan' in paper mode), "
                             f"not {self.foreign_lookup!r}")
        if self.gather_max < 1:
            raise ValueError("gather_max must be positive")
        if self.routed_frames_out < 1:
            raise ValueError("routed_frames_out must be positive")
        if self.local_lookup is None:
            object.__setattr__(self, "local_lookup", "center" if self.mode == "exact" else "lan")
        if self.local_lookup not in LOCAL_LOOKUPS or (self.mode == "paper" and self.local_lookup != "lan"):
            raise ValueError(f"local_lookup must be one of {LOCAL_LOOKUPS} ('lan' in paper mode), "
                             f"not {self.local_lookup!r}")
        if self.routing is None:
            object.__setattr__(self, "routing", "home" if self.mode == "exact" else "broadcast")
        if self.routing not in ROUTINGS or (self.mode == "paper" and self.routing != "broadcast"):
            raise ValueError(f"routing must be one of {ROUTINGS} ('broadcast' in paper mode), not {self.routing!r}")
        unknown = set(self.weights) - {self.network, *self.peers}
        if unknown:
            raise ValueError(f"weights for networks {sorted(unknown)}, which are neither this one nor a peer")

    def home_map(self) -> HomeMap:
        """Every configured network with its weight: the same map at every center."""
        return HomeMap({n: self.weights.get(n, 1.0) for n in (self.network, *self.peers)})

    def previous_maps(self) -> tuple[HomeMap, ...]:
        return tuple(HomeMap(w) for w in self.previous_weights)

    def host_id_of(self, ip: str) -> int | None:
        """The host part a LAN host's numbers must carry (None: a LAN too wide to tell)."""
        try:
            return host_id_from_ip(ip, self.lan)
        except ValueError:
            return None

    def network_of(self, ip: str) -> int | None:
        addr = ipaddress.ip_address(ip)
        if addr in ipaddress.ip_network(self.lan):
            return self.network
        for net, cidr in self.peers.items():
            if addr in ipaddress.ip_network(cidr):
                return net
        return None

