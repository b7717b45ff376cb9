"""The center's side of the protocol as a pure state machine (paper §2.3, §2.4).

Events in, actions out; no sockets, no trio, no Redis. This module is the one
place that holds a set's life at a center:

own set   flag=1 from a LAN host ──> ``local_reduce_pool`` (stage LAN)
          ──flag=2 to the LAN's other live hosts, answers merged──>
          ``dist_reduce_pool`` (stage DIST) ──flag=2 to the peer networks,
          answers merged──> admitted: ``task_URL`` ──Task──> one host's ``task_pool``

foreign   flag=2 from a peer network ──> ``dist_reduce_pool`` (stage FOREIGN)
set       ──flag=2 to the LAN's live hosts, answers merged──> flag=3 to the origin

The adapter (center_host/daemon.py, or a conformance runner) executes the actions
of one event in order and in one Redis transaction, and answers a
:class:`Lookup` with :class:`LookupDone` before it feeds any other event, so the
machine never sees a half-applied state. Exact mode's claims (docs/PROTOCOL.md,
"Exact mode") are decided here too; only their storage is outside.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Union

import orjson
import xxhash

from dedupnet.codec import wire
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.codec.counters import Counters
from dedupnet.codec.homes import HomeMap
from dedupnet.codec.messages import FLAG_ANSWER, FLAG_LOOKUP, FLAG_NEW_SET, Ack, Frame, Task
from dedupnet.codec.numbers import check_network, host_id_from_ip, split_number
from dedupnet.codec.pools import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL
from dedupnet.codec.urls import canonical_set, set_digest, site_of

log = logging.getLogger("dedupnet.center")

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
#: The timer of R4's gathering (no set has number 0: a host's sequence starts at 1, §7).
GATHER_TIMER = 0


# -- who sent / receives a message ---------------------------------------------------
@dataclass(frozen=True)
class Host:
    ip: str

    def __str__(self) -> str:
        return self.ip


@dataclass(frozen=True)
class Peer:
    network: int

    def __str__(self) -> str:
        return f"net:{self.network}"


Member = Union[Host, Peer]


@dataclass(frozen=True)
class Operator:
    """A control connection (``dedupnet reassign``): not a member, only answered."""

    address: str

    def __str__(self) -> str:
        return f"control:{self.address}"


def member_from_str(text: str) -> Member:
    return Peer(int(text[4:])) if text.startswith("net:") else Host(text)


# -- events -----------------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    sender: Member
    message: object


@dataclass(frozen=True)
class Joined:
    member: Member
    #: A host's status address (its Register's ``listen``): where ``dedupnet status
    #: --cluster`` asks it; "" when not known.
    address: str = ""


@dataclass(frozen=True)
class Left:
    member: Member


@dataclass(frozen=True)
class TimerFired:
    number: int


@dataclass(frozen=True)
class Reassign:
    """An operator says LAN host ``host`` is gone: its unacknowledged tasks (task_URL)
    and ``urls`` (what its own task_pool held, taken from it by the operator's tool)
    go to the live hosts, and it is no longer counted as one of the LAN's hosts.
    Answered to ``reply_to`` with an Ack of ``number``."""

    host: str
    number: int
    urls: tuple[str, ...]
    reply_to: Operator


@dataclass(frozen=True)
class Reoffer:
    """LAN host ``host`` came back with a store behind what it had acknowledged: the
    tasks last assigned to it (number -> URLs, from the adapter's log) are its again,
    stored and sent; what it still holds it drops on arrival (docs/PROTOCOL.md section 7)."""

    host: str
    tasks: dict[int, tuple[str, ...]]


@dataclass(frozen=True)
class LookupDone:
    """Answers to a :class:`Lookup`, index-aligned with its ``urls``."""

    number: int
    concluded: bool  # the number was concluded before (a repeated frame)
    admitted: list[bool]  # URL is in this center's admitted record
    #: The concluded set's :func:`~dedupnet.codec.urls.set_digest` (0: not recorded).
    digest: int = 0


@dataclass(frozen=True)
class Resume:
    """After a restart: the stored records of every pool (see :meth:`SetRecord.dump`)."""

    sets: list[bytes]
    tasks: dict[str, list[str]]  # task key "number:host" -> URLs
    sequences: dict[str, int] = field(default_factory=dict)  # host IP -> highest sequence stored
    hosts: dict[str, str] = field(default_factory=dict)  # host IP -> status address (known hosts)


# -- actions ----------------------------------------------------------------------
@dataclass(frozen=True)
class Send:
    to: tuple[Member, ...]
    data: bytes  # encoded once, the same bytes for every receiver


@dataclass(frozen=True)
class Save:
    pool: str
    number: int
    record: bytes


@dataclass(frozen=True)
class Drop:
    pool: str
    number: int


@dataclass(frozen=True)
class SetTimer:
    number: int
    delay: float


@dataclass(frozen=True)
class CancelTimer:
    number: int


@dataclass(frozen=True)
class Lookup:
    """Look up ``urls`` in the admitted record, and whether ``number`` was concluded;
    answer with :class:`LookupDone` before any other event."""

    number: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Admit:
    """These URLs are admitted: record them (never admit again) and mark ``number`` concluded."""

    number: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Conclude:
    """``number`` is finished here; remember it (and its set's digest, 0 if none) so a
    repeated frame is recognised and a reused number told from it."""

    number: int
    complete: bool
    digest: int = 0


@dataclass(frozen=True)
class NoteSequence:
    """The highest sequence stored from ``host``: what a host that lost its store is
    told to number from."""

    host: str
    sequence: int


@dataclass(frozen=True)
class NoteHost:
    """``host`` is one of the LAN's hosts (its status address): until it leaves or is
    reassigned, a crawl is not complete while it is down."""

    host: str
    address: str


@dataclass(frozen=True)
class ForgetHost:
    host: str


@dataclass(frozen=True)
class SaveTask:
    key: str  # "number:host"
    urls: tuple[str, ...]


@dataclass(frozen=True)
class DropTask:
    key: str


Action = Union[Send, Save, Drop, SetTimer, CancelTimer, Lookup, Admit, Conclude, NoteSequence, NoteHost, ForgetHost,
               SaveTask, DropTask]


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
    mode: str = "exact"
    answer_timeout: float = 2.0
    max_resends: int = 2
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
    #: ~150 bytes of Python memory each.
    held_elsewhere_max: int = 200_000
    #: Re-crawl by age (dedupnet/adapters/recrawl.py): the admitted record (the pools) answers
    #: "seen" for a URL's age only, and ``held_elsewhere`` is not kept. None: for ever.
    recrawl: RecrawlPolicy | None = None
    #: Exact mode (R4, docs/PROTOCOL.md §10): seconds this center gathers its LAN's sets
    #: that are done with their LAN stage into one set for the distributed stage while
    #: one of its own is out with the peers (Nagle's rule, like a host's ``set_linger``;
    #: with nothing out a set goes at once). A peer's cost is mostly per set and every
    #: peer answers every set, so gathering a LAN's sets divides the distributed stage's
    #: frames and look-ups by up to the hosts per LAN. 0: each host's set goes alone.
    gather_linger: float = 0.0
    #: A gathered set goes as soon as it holds this many URLs.
    gather_max: int = 1000
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
        if self.gather_linger < 0 or self.gather_max < 1:
            raise ValueError("gather_linger must not be negative and gather_max must be positive")
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


def _remember(d: dict, key, value, limit: int) -> None:
    """``d[key] = value`` as its newest entry; the oldest go beyond ``limit`` entries."""
    d.pop(key, None)
    d[key] = value
    while len(d) > limit:
        del d[next(iter(d))]


def task_key(number: int, host: str) -> str:
    """The ``task_URL`` key of set ``number``'s URLs for ``host`` ("" = no host yet)."""
    return f"{number}:{host}"


def task_parts(key: str) -> tuple[int, str]:
    number, host = key.split(":", 1)
    return int(number), host


def owner_of(url: str, hosts: Iterable[str]) -> str:
    """The host whose ``task_pool`` gets ``url``: rendezvous hashing on the URL's site,
    so one site stays with one host (politeness) and a host that leaves moves only
    its own sites (paper gap 8, related-systems A)."""
    site = site_of(url).encode()
    return max(hosts, key=lambda h: xxhash.xxh3_64_intdigest(site + b"@" + h.encode()))


class CenterProtocol:
    """One center's protocol state. Call :meth:`handle` with each event; it returns the
    actions to carry out. Protocol violations are counted, logged and dropped."""

    def __init__(self, config: CenterConfig, counters: Counters | None = None):
        self.config = config
        self.exact = config.mode == "exact"
        self.wait = config.partition_policy == "wait"
        self.homes = config.home_map() if config.routing == "home" else None
        self.previous = config.previous_maps() if self.homes is not None else ()
        self.counters = counters or Counters()
        self.sets: dict[int, SetRecord] = {}
        self.hosts: set[str] = set()  # live LAN members
        #: Every LAN host that has joined and neither left gracefully nor been reassigned
        #: (durable: NoteHost), with its status address: the ones not live are down.
        self.known: dict[str, str] = {}
        self.peers: set[int] = set()  # connected peer networks
        self.tasks: dict[str, list[str]] = {}  # unacknowledged task assignments
        self.claims: dict[str, int] = {}  # exact mode: URL -> own in-flight set holding it
        #: Exact mode, a bounded cache: URL -> the lowest number of another network's set
        #: told here that the URL was unseen (so that set held it). Not needed for
        #: exactness, only to drop such URLs early; lost on restart (PROTOCOL.md §10).
        self.held_elsewhere: dict[str, int] = {}
        self._lookups: dict[int, tuple[str, object]] = {}  # number -> why we asked
        self.waiting: dict[int, tuple[Host, Frame]] = {}  # flag=1 frames held back (not acked)
        #: R4: own sets done with their LAN stage, waiting to go on as one (ordered).
        self.gathering: dict[int, None] = {}
        #: Own sets admitted lately (newest last, ``RECENTLY_CONCLUDED`` of them): an answer
        #: for one is late (a re-sent question answered twice, an ``admit`` time limit),
        #: logged at debug; an answer for a number never held here stays a warning.
        self.recently_concluded: dict[int, None] = {}
        #: Host IP -> the highest sequence of its sets stored here (durable: NoteSequence).
        self.sequences: dict[str, int] = {}
        #: §11: per home network, the own sets whose URLs for it have not gone yet (oldest
        #: first), and the frame out with it now (its sets' numbers, lowest first). One
        #: frame per home at a time, carrying every waiting set's URLs for it (as R4
        #: gathers for the peers): what a URL costs on the WAN does not grow with the
        #: number of sets, and a link that resets often still gets whole frames through.
        #: Not stored: a restarted center queues its stored routes again.
        self.route_queue: dict[int, dict[int, None]] = {}
        self.route_out: dict[int, tuple[int, ...]] = {}

    def homes_described(self) -> str | None:
        """The map (and the earlier ones still asked about, after ``;``) as every peer
        must have it; None when this center broadcasts."""
        if self.homes is None:
            return None
        return ";".join(m.describe() for m in (self.homes, *self.previous))

    # -- entry point -------------------------------------------------------------------
    def handle(self, event: object) -> list[Action]:
        try:
            return self._dispatch(event)
        except Rejected as e:
            self.counters.inc("rejected", reason=e.reason)
            log.log(e.level, "rejected %s: %s", e.reason, e)
            return []

    def _dispatch(self, event: object) -> list[Action]:
        if isinstance(event, Received):
            return self._received(event.sender, event.message)
        if isinstance(event, LookupDone):
            return self._lookup_done(event)
        if isinstance(event, TimerFired):
            return self._timer(event.number)
        if isinstance(event, Joined):
            return self._joined(event.member, event.address)
        if isinstance(event, Left):
            return self._left(event.member)
        if isinstance(event, Resume):
            return self._resume(event)
        if isinstance(event, Reassign):
            return self._operator_reassign(event)
        if isinstance(event, Reoffer):
            return self._reoffer(event)
        raise TypeError(f"not a center event: {event!r}")

    def _received(self, sender: Member, message: object) -> list[Action]:
        if isinstance(message, Frame):
            message = self._canonical(sender, message)
            if isinstance(sender, Host):
                return self._frame_from_host(sender, message)
            return self._frame_from_peer(sender, message)
        if isinstance(message, Ack) and isinstance(sender, Host):
            return self._task_acked(sender, message.number)
        if isinstance(message, Ack) and self.homes is not None:
            return self._home_acked(sender, message)
        if isinstance(message, Task) and isinstance(sender, Host):
            return self._handed_back(sender, message)
        raise Rejected("unexpected-message", f"{type(message).__name__} from {sender} is not expected at a center")

    def _canonical(self, sender: Member, frame: Frame) -> Frame:
        """The frame with every URL in the form a host would have stored it (docs/PROTOCOL.md
        §8): nothing a peer spells enters a pool unchecked. What cannot be a pool's URL is
        dropped from the set and counted."""
        return Frame(self._canonical_urls(sender, frame.number, frame.URL_set), frame.IP, frame.number, frame.flag)

    def _canonical_urls(self, sender: Member, number: int, url_set: dict[str, int]) -> dict[str, int]:
        url_set, bad = canonical_set(url_set)
        if bad:
            self.counters.inc("bad_input", reason="bad-url", amount=bad)
            log.warning("set %d from %s: %d URLs dropped (not http(s) URLs a pool may hold)", number, sender, bad)
        return url_set

    def _check_number(self, sender: Member, number: int) -> None:
        """A new set's number carries its sender's network (and, for a LAN host, its host
        part): a number made in someone else's name is refused, so it cannot take the
        number its owner will use (docs/PROTOCOL.md §7)."""
        network, host, _ = split_number(number)
        if isinstance(sender, Peer):
            ok = network == sender.network
        else:
            expected = self.config.host_id_of(sender.ip)
            ok = network == self.config.network and (expected is None or host == expected)
        if not ok:
            raise Rejected("number-not-sender", f"set number {number} (network {network}, host {host}) "
                                                f"is not {sender}'s")

    def _reused(self, sender: Host, number: int) -> list[Action]:
        """A number that arrives again with other URLs: the sender lost the store its
        sequence lived in. Its set is refused, never acknowledged as a duplicate (that
        would lose its URLs); it numbers the set again above what is stored here."""
        sequence = self.sequences.get(sender.ip, 0) + 1
        self.counters.inc("rejected", reason="number-reused")
        log.warning("set %d from %s: number used before for another set; asking it to number its sets from %d",
                    number, sender, sequence)
        return [Send((sender,), wire.encode(Ack(number, "rejected", "number-reused", sequence)))]

    # -- §2.3: frames from LAN hosts ----------------------------------------------------
    def _frame_from_host(self, sender: Host, frame: Frame) -> list[Action]:
        self.counters.inc("frames_in", stage="lan", flag=str(frame.flag))
        if frame.flag == FLAG_NEW_SET:
            if frame.IP != sender.ip:
                raise Rejected("ip-mismatch", f"flag=1 number {frame.number} from {sender} carries IP {frame.IP}")
            self._check_number(sender, frame.number)
            held = self.sets.get(frame.number)
            if held is not None:  # stored already: the ack was lost, repeat it
                if held.digest and held.digest != set_digest(frame.URL_set):
                    return self._reused(sender, frame.number)
                self.counters.inc("repeated_frames")
                return [Send((sender,), wire.encode(Ack(frame.number, "duplicate")))]
            if frame.number in self.waiting:
                if set_digest(self.waiting[frame.number][1].URL_set) != set_digest(frame.URL_set):
                    return self._reused(sender, frame.number)
                return []
            if self._room() <= 0:
                if sum(1 for s, _ in self.waiting.values() if s == sender) >= MAX_HELD_PER_HOST:
                    raise Rejected("too-many-held", f"set {frame.number} from {sender}: {MAX_HELD_PER_HOST} of its "
                                                    f"sets are held already (not acknowledged: it keeps them)")
                self.waiting[frame.number] = (sender, frame)
                self.counters.inc("frames_held")
                return []
            return self._start_own(sender, frame)
        if frame.flag == FLAG_ANSWER:
            return self._answer(sender, frame)
        raise Rejected("flag2-from-lan", f"flag=2 number {frame.number} from LAN host {sender} (§2.4: not handled)")

    def own_in_flight(self) -> int:
        """Own sets in a stage that asks others (a set with its home networks does not
        count: back-pressure for those is ``max_routed_waiting``)."""
        return sum(1 for r in self.sets.values() if r.stage in (Stage.LAN, Stage.DIST))

    def routed_waiting(self) -> dict[int, int]:
        """§11: per home network, the URLs this center holds for it that it has not taken."""
        out: dict[int, int] = {}
        for rec in self.sets.values():
            for network, urls in rec.routes.items():
                out[network] = out.get(network, 0) + len(urls)
        return out

    def _room(self) -> int:
        """How many more own sets may start now."""
        if self.homes is not None and sum(self.routed_waiting().values()) >= self.config.max_routed_waiting:
            return 0
        return self.config.max_in_flight - self.own_in_flight()

    def _start_own(self, sender: Member, frame: Frame) -> list[Action]:
        self._lookups[frame.number] = ("own", (sender, frame))
        return [Lookup(frame.number, tuple(frame.URL_set))]

    def _start_waiting(self) -> list[Action]:
        """Sets left, or were gathered into one (R4): the oldest held-back frames whose
        hosts are still here go on, as many as now fit under ``max_in_flight`` (each
        look-up is made, and its result handled, in turn)."""
        actions: list[Action] = []
        room = self._room()
        while self.waiting and room > 0:
            number = next(iter(self.waiting))
            sender, frame = self.waiting.pop(number)
            if sender.ip in self.hosts:
                actions += self._start_own(sender, frame)
                room -= 1
        return actions

    def _own_set_arrived(self, sender: Member, frame: Frame, found: LookupDone) -> list[Action]:
        """A new set to decide here: from a LAN host, or (§11) the URLs a peer found of
        sites homed here. Its number seen before with the same URLs is a repeat; with
        other URLs, a host's lost store (refused) or a peer's set routed again after
        the map changed (decided like a new one: the record keeps it exact)."""
        digest = set_digest(frame.URL_set)
        repeat = found.concluded and (not found.digest or found.digest == digest)
        if found.concluded and not repeat and isinstance(sender, Host):
            return self._reused(sender, frame.number)
        ack = Send((sender,), wire.encode(Ack(frame.number, "duplicate" if repeat else "stored")))
        if repeat:
            self.counters.inc("repeated_frames")
            return [ack]
        urls = {}
        for url, admitted in zip(frame.URL_set, found.admitted):
            if self.exact and (admitted or self._claimed(url) or url in self.held_elsewhere):
                self.counters.inc("urls_dropped", stage="center-record")
                continue
            urls[url] = 0
            if self.exact:
                self.claims[url] = frame.number
        self.counters.inc("urls_in", stage="lan" if isinstance(sender, Host) else "routed", amount=len(frame.URL_set))
        ask = {h for h in self.hosts if str(sender) != h} if self.config.local_lookup == "lan" else set()
        rec = SetRecord(Frame(urls, frame.IP, frame.number, FLAG_LOOKUP), Stage.LAN, str(sender), ask, digest=digest)
        self.sets[frame.number] = rec
        log.info("set %d from %s: %d URLs, %d after the center's record; asking %d hosts",
                 frame.number, sender, len(frame.URL_set), len(urls), len(rec.awaiting))
        # Durable first (§ gap 7: the host lets the URLs go on this ack), then ask.
        return [Save(LOCAL_REDUCE_POOL, frame.number, rec.dump()), *self._note_sequence(sender, frame.number),
                ack, *self._ask(rec)]

    def _claimed(self, url: str) -> bool:
        """A set of ours holds ``url`` and will see it decided. Not a set that routes it
        to another home when it is homed here now (routed under an earlier map, it comes
        back here through that home): dropping it against such a claim could drop it
        twice over, once here and once at the home that passes it back."""
        number = self.claims.get(url)
        if number is None:
            return False
        holder = self.sets.get(number)
        return not (self.homes is not None and holder is not None and holder.stage is Stage.HOME
                    and self.homes.home_of(url) == self.config.network)

    def _note_sequence(self, sender: Member, number: int) -> list[Action]:
        if not isinstance(sender, Host):
            return []
        sequence = split_number(number)[2]
        if sequence <= self.sequences.get(sender.ip, 0):
            return []
        self.sequences[sender.ip] = sequence
        return [NoteSequence(sender.ip, sequence)]

    def _ask(self, rec: SetRecord) -> list[Action]:
        """Broadcast the stored frame to the members still awaited, or move on if none."""
        if not rec.frame.URL_set and rec.stage is not Stage.FOREIGN:
            return self._stage_done(rec)
        if not rec.awaiting:
            return self._stage_done(rec)
        return [*self._send_to(rec, rec.awaiting), SetTimer(rec.number, self._resend_delay(rec))]

    def _send_to(self, rec: SetRecord, members: Iterable[str]) -> list[Action]:
        """The stored frame to those of ``members`` that are connected now (one encoding);
        the others are sent it when they come back (:meth:`_joined`)."""
        to = tuple(member_from_str(m) for m in sorted(members) if self._live(m))
        if rec.stage is Stage.HOME:  # §11: the frame this set heads, if any, carries its URLs
            return [a for m in to if isinstance(m, Peer) and self.route_out.get(m.network, (0,))[0] == rec.number
                    for a in self._send_routes(m.network)]
        if rec.stage is Stage.CHECK:  # each previous home is asked about its own sites' URLs
            return [Send((m,), wire.encode(Frame(dict.fromkeys(rec.routes[m.network], 0), rec.frame.IP, rec.number,
                                                 FLAG_LOOKUP)))
                    for m in to if isinstance(m, Peer) and m.network in rec.routes]
        return [Send(to, wire.encode(rec.frame))] if to else []

    def _resend_delay(self, rec: SetRecord) -> float:
        """``answer_timeout``; under ``wait`` (and always for a home's or previous home's
        answer, which is never given up) doubling after each re-send, up to
        ``max_resend_interval``: a member that is alive has the question (TCP delivers, a
        reconnection asks again at once), so re-sending to a slow one only adds load."""
        extra = rec.attempts - 1 if self.wait or rec.stage in ROUTED else 0
        return min(self.config.answer_timeout * 2**extra, max(self.config.max_resend_interval, self.config.answer_timeout))

    def _answer(self, sender: Member, frame: Frame) -> list[Action]:
        rec = self.sets.get(frame.number)
        if rec is None:
            if frame.number in self.recently_concluded:
                raise Rejected("unknown-number", f"late answer for set {frame.number}, concluded already, from {sender}",
                               level=logging.DEBUG)
            raise Rejected("unknown-number", f"answer for unknown number {frame.number} from {sender}")
        who = str(sender)
        if who in rec.answered:
            self.counters.inc("repeated_answers")
            return []
        if who not in rec.awaiting:
            raise Rejected("not-asked", f"answer for {frame.number} from {sender}, which was not asked")
        seen = [u for u, v in frame.URL_set.items() if v and u in rec.frame.URL_set]
        if rec.stage is Stage.FOREIGN:
            # §2.4, with gap 1 resolved: a non-zero answer marks the URL as seen.
            for url in seen:
                rec.frame.URL_set[url] = 1
        else:
            for url in seen:  # §2.3 / §2.4: seen elsewhere, so not ours to admit
                del rec.frame.URL_set[url]
                if self.claims.get(url) == rec.number:
                    del self.claims[url]
            self.counters.inc("urls_dropped", stage=rec.stage.value, amount=len(seen))
        rec.awaiting.discard(who)
        rec.answered.add(who)
        if rec.stage is Stage.CHECK:
            rec.routes.pop(sender.network, None)
        if rec.awaiting:
            # Not saved: answers are idempotent, and a restarted center asks again
            # everyone its stored record awaits. Only stage changes are written.
            return []
        return [CancelTimer(rec.number), *self._stage_done(rec)]

    # -- §2.4: frames from other networks ---------------------------------------------
    def _frame_from_peer(self, sender: Peer, frame: Frame) -> list[Action]:
        self.counters.inc("frames_in", stage="dist", flag=str(frame.flag))
        origin = self.config.network_of(frame.IP)
        if frame.flag == FLAG_NEW_SET and self.homes is not None:
            return self._routed_in(sender, frame, origin)
        if frame.flag == FLAG_ANSWER:
            if origin != self.config.network and self.homes is None:
                raise Rejected("not-our-set", f"flag=3 number {frame.number} from {sender} for IP {frame.IP} of another network")
            return self._answer(sender, frame)
        if frame.flag != FLAG_LOOKUP:
            raise Rejected("flag1-from-peer", f"flag={frame.flag} number {frame.number} from {sender}")
        if self.homes is not None:
            return self._checked_here(sender, frame, origin)
        if origin == self.config.network:
            raise Rejected("flag2-own-network", f"flag=2 number {frame.number} for our own IP {frame.IP} from {sender}")
        if origin is None or origin != sender.network:
            raise Rejected("not-a-peer", f"flag=2 number {frame.number}: IP {frame.IP} is not of peer {sender}")
        self._check_number(sender, frame.number)
        if frame.number in self.sets:
            self.counters.inc("repeated_frames")
            return []
        ask = set(self.hosts) if self.config.foreign_lookup == "lan" else set()
        rec = SetRecord(Frame(dict.fromkeys(frame.URL_set, 0), frame.IP, frame.number, FLAG_LOOKUP),
                        Stage.FOREIGN, str(sender), ask)
        self.sets[frame.number] = rec
        self.counters.inc("urls_in", stage="foreign", amount=len(frame.URL_set))
        if not ask:
            # foreign_lookup = "center": this center's records speak for its LAN and the
            # answer needs one look-up, so nothing is stored (the origin asks again after a crash).
            log.info("set %d from %s: %d URLs; answered from this center's records", frame.number, sender,
                     len(frame.URL_set))
            return self._stage_done(rec)
        log.info("set %d from %s: %d URLs; asking %d hosts", frame.number, sender, len(frame.URL_set), len(rec.awaiting))
        return [Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._ask(rec)]

    # -- §11: one home per site ----------------------------------------------------------
    def _routed_in(self, sender: Peer, frame: Frame, origin: int | None) -> list[Action]:
        """A peer's URLs of sites homed here (flag=1, as from a host): decided here, as
        an own set; acknowledged once stored, which lets the peer drop them. The peer's
        own hosts' set, or one it passes on because it was routed to it under an earlier
        map: its IP and number need only agree with each other."""
        self._check_origin(sender, frame, origin)
        held = self.sets.get(frame.number)
        if held is not None:
            if held.digest != set_digest(frame.URL_set):
                return []  # routed again with other URLs: asked again once this one is done
            self.counters.inc("repeated_frames")
            return [Send((sender,), wire.encode(Ack(frame.number, "duplicate")))]
        return self._start_own(sender, frame)

    def _checked_here(self, sender: Peer, frame: Frame, origin: int | None) -> list[Action]:
        """A peer that is the new home of sites once homed here asks whether this center
        admitted their URLs (§11, "Changing the map"). The set may come from any network
        (it was routed to the asker), so its IP and number need only agree with each
        other. Answered at once from the record and the claims (§10's foreign answer),
        and nothing is kept: the number may be, or become, one of this center's sets."""
        self._check_origin(sender, frame, origin)
        rec = SetRecord(Frame(dict.fromkeys(frame.URL_set, 0), frame.IP, frame.number, FLAG_LOOKUP),
                        Stage.FOREIGN, str(sender), set())
        self.counters.inc("urls_in", stage="check", amount=len(frame.URL_set))
        self._lookups[frame.number] = ("foreign", rec)
        return [Lookup(frame.number, tuple(rec.frame.URL_set))]

    @staticmethod
    def _check_origin(sender: Peer, frame: Frame, origin: int | None) -> None:
        if origin is None or split_number(frame.number)[0] != origin:
            raise Rejected("not-a-peer", f"flag={frame.flag} number {frame.number} from {sender}: IP {frame.IP} "
                                         f"is not of a configured network, or not of the number's")

    def _route(self, rec: SetRecord) -> list[Action]:
        """What is left of an own set after its LAN stage: URLs of sites homed here are
        admitted now; the others go, one frame per home network, to their home center,
        which decides them. The set stays in ``dist_reduce_pool`` (stage HOME) until each
        home has acknowledged its URLs, so a home that is down delays only its own
        sites. URLs routed to a network no longer configured are routed again by the
        current map. A set a peer routed here is routed by the same map: all of it is
        homed here, unless it was routed under an earlier map (then it goes on)."""
        if rec.stage is Stage.LAN and self.previous:
            moved = self._moved_in(rec)
            if moved:
                return self._check_previous(rec, moved)
        if rec.stage is Stage.CHECK:  # every previous home has answered: what is left is new
            rec.routes = {}
        for network in [n for n in rec.routes if str(Peer(n)) not in rec.awaiting]:
            del rec.routes[network]
        routed = {url for urls in rec.routes.values() for url in urls}
        here: list[str] = []
        away: dict[int, list[str]] = {}
        for url in rec.frame.URL_set:
            if url in routed:
                continue
            home = self.homes.home_of(url)
            if home == self.config.network:
                here.append(url)
            else:
                away.setdefault(home, []).append(url)
        if not rec.routes and not away:
            return self._admit(rec)
        actions: list[Action] = []
        if here:
            for url in here:
                del rec.frame.URL_set[url]
                if self.claims.get(url) == rec.number:
                    del self.claims[url]
            self.counters.inc("urls_admitted", amount=len(here))
            actions += [Admit(rec.number, tuple(here)), *self._assign(rec.number, here)]
        if rec.stage is Stage.LAN:
            actions.append(Drop(LOCAL_REDUCE_POOL, rec.number))
        if rec.stage is not Stage.HOME:
            rec.attempts = 1
        rec.stage = Stage.HOME
        rec.routes.update(away)
        rec.awaiting = {str(Peer(n)) for n in rec.routes}
        self.counters.inc("urls_routed", amount=sum(map(len, away.values())))
        log.info("set %d: %d URLs admitted here, %d for their home networks %s", rec.number, len(here),
                 sum(map(len, away.values())), sorted(away))
        return [*actions, Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._queue_routes(rec, away),
                SetTimer(rec.number, self._resend_delay(rec)), *self._start_waiting()]

    def _queue_routes(self, rec: SetRecord, networks: Iterable[int]) -> list[Action]:
        for network in sorted(networks):
            self.route_queue.setdefault(network, {})[rec.number] = None
        return [a for network in sorted(networks) for a in self._next_routes(network)]

    def _next_routes(self, network: int) -> list[Action]:
        """When nothing is out with a connected home: the waiting sets' URLs for it, oldest sets
        first and up to ``gather_max`` (one set at least), become the frame out, under
        the lowest of their numbers. The home decides it as one set; a set whose number
        it has concluded with other URLs is decided anew, so its record keeps it exact
        whichever sets a frame holds (a restarted center may group them otherwise)."""
        if network in self.route_out or network not in self.peers:
            return []  # a home that is down is sent all it waits for, in one frame, when back
        queue = self.route_queue.get(network, {})
        members: list[int] = []
        size = 0
        for number in list(queue):
            rec = self.sets.get(number)
            urls = rec.routes.get(network) if rec is not None and rec.stage is Stage.HOME else None
            if urls and members and size + len(urls) > self.config.gather_max:
                break
            del queue[number]
            if urls:
                members.append(number)
                size += len(urls)
        if not members:
            return []
        self.route_out[network] = tuple(sorted(members))
        return self._send_routes(network)

    def _send_routes(self, network: int) -> list[Action]:
        """The frame out with a home, to it if it is connected (else when it is back)."""
        members = [self.sets[n] for n in self.route_out.get(network, ()) if n in self.sets]
        if not members or network not in self.peers:
            return []
        urls = {url: 0 for rec in members for url in rec.routes.get(network, ())}
        head = members[0]
        return [Send((Peer(network),), wire.encode(Frame(urls, head.frame.IP, head.number, FLAG_NEW_SET)))]

    def _moved_in(self, rec: SetRecord) -> dict[int, list[str]]:
        """URLs homed here whose site had another home under an earlier map, by that
        earlier home (a configured peer; a network no longer configured cannot be asked)."""
        moved: dict[int, list[str]] = {}
        here = self.config.network
        for url in rec.frame.URL_set:
            if self.homes.home_of(url) != here:
                continue
            for network in {m.home_of(url) for m in self.previous} - {here}:
                if network in self.config.peers:
                    moved.setdefault(network, []).append(url)
        return moved

    def _check_previous(self, rec: SetRecord, moved: dict[int, list[str]]) -> list[Action]:
        """Sites that moved here: each earlier home is asked (flag=2, answered from its
        record as §10's foreign sets are) whether it admitted their URLs before the map
        changed. It admits none of them now — its map homes them here, and a peer on
        another map is refused — so its answer is final. The set waits in
        ``dist_reduce_pool`` for the answers, as for a home."""
        rec.stage, rec.routes, rec.attempts = Stage.CHECK, moved, 1
        rec.awaiting, rec.answered = {str(Peer(n)) for n in moved}, set()
        self.counters.inc("urls_checked", amount=sum(map(len, moved.values())))
        log.info("set %d: %d URLs of sites that moved here; asking their previous homes %s", rec.number,
                 sum(map(len, moved.values())), sorted(moved))
        return [Drop(LOCAL_REDUCE_POOL, rec.number), Save(DIST_REDUCE_POOL, rec.number, rec.dump()),
                *self._send_to(rec, rec.awaiting), SetTimer(rec.number, self._resend_delay(rec)),
                *self._start_waiting()]

    def _home_acked(self, sender: Member, ack: Ack) -> list[Action]:
        """A home network holds (or had decided) the URLs of the frame out with it: they
        leave each of its sets, and the next frame goes."""
        out = self.route_out.get(sender.network) if isinstance(sender, Peer) else None
        if not out or out[0] != ack.number:
            self.counters.inc("repeated_acks")
            return []
        if ack.status == "rejected":
            self.counters.inc("routed_refused", reason=ack.reason or "unknown")
            log.error("set %d: network %d refused its URLs (%s); kept, asked again", ack.number, sender.network,
                      ack.reason or "no reason given")
            return []
        del self.route_out[sender.network]
        actions: list[Action] = []
        for rec in [self.sets[n] for n in out if n in self.sets]:
            if rec.stage is not Stage.HOME or sender.network not in rec.routes:
                continue
            for url in rec.routes.pop(sender.network):
                rec.frame.URL_set.pop(url, None)
                if self.claims.get(url) == rec.number:
                    del self.claims[url]
                # Its home holds it now, for good: found here again, it is dropped at once. Not
                # when the peer only passes it on (routed to it under an earlier map).
                if self.homes.home_of(url) == sender.network:
                    self._note_held_elsewhere(url, rec.number)
            rec.awaiting.discard(str(sender))
            rec.answered.add(str(sender))
            if not rec.awaiting:
                actions += [CancelTimer(rec.number), *self._stage_done(rec)]
        return [*actions, *self._next_routes(sender.network), *self._start_waiting()]

    # -- the end of a stage --------------------------------------------------------------
    def _stage_done(self, rec: SetRecord) -> list[Action]:
        if self.homes is not None and rec.stage is not Stage.FOREIGN:
            return self._route(rec)
        if rec.stage is Stage.LAN and rec.frame.URL_set and self.config.peers:
            missing = set(self.config.peers) - self.peers
            if missing and self.wait:
                log.warning("set %d: networks %s not connected; it waits for them in dist_reduce_pool",
                            rec.number, sorted(missing))
            elif missing:  # gap 4 under "admit": not waited for, and not complete without them
                rec.incomplete = True
                self.counters.inc("peers_missing", amount=len(missing))
                log.warning("set %d: networks %s not connected; not asked", rec.number, sorted(missing))
        if rec.stage is Stage.LAN and rec.frame.URL_set and self.peers_to_ask():
            if self.exact and self.config.gather_linger > 0:
                return self._gather(rec)
            return self._to_peers(rec)
        if rec.stage is Stage.FOREIGN:
            if self.exact:
                self._lookups[rec.number] = ("foreign", rec)
                return [Lookup(rec.number, tuple(rec.frame.URL_set))]
            return self._reply_foreign(rec, None)
        return self._admit(rec)

    def _to_peers(self, rec: SetRecord) -> list[Action]:
        rec.stage, rec.awaiting, rec.answered, rec.attempts = Stage.DIST, self.peers_to_ask(), set(), 1
        log.info("set %d: LAN de-dup done, %d URLs left; asking %d networks",
                 rec.number, len(rec.frame.URL_set), len(rec.awaiting))
        return [Drop(LOCAL_REDUCE_POOL, rec.number), Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._ask(rec)]

    def _out_with_peers(self) -> bool:
        return any(r.stage is Stage.DIST for r in self.sets.values())

    def _gather(self, rec: SetRecord) -> list[Action]:
        """R4: hold a set done with its LAN stage (it stays in ``local_reduce_pool``,
        claims and all) until nothing of ours is out with the peers, ``gather_max``
        URLs are held, or ``gather_linger`` has passed; then they go on as one. What is
        held goes first if this set would take it past ``gather_max`` (a gathered set
        must fit the peers' ``max_urls``)."""
        if rec.number in self.gathering:
            return []
        actions: list[Action] = []
        held = sum(len(self.sets[n].frame.URL_set) for n in self.gathering)
        if self.gathering and held + len(rec.frame.URL_set) > self.config.gather_max:
            actions += self._send_gathered()
            held = 0
        self.gathering[rec.number] = None
        held += len(rec.frame.URL_set)
        if not self._out_with_peers() or held >= self.config.gather_max:
            return actions + self._send_gathered()
        return actions + ([SetTimer(GATHER_TIMER, self.config.gather_linger)] if len(self.gathering) == 1 else [])

    def _send_gathered(self) -> list[Action]:
        """R4: the gathered sets become one, under the lowest of their numbers, which now
        claims all their URLs (a claim's number only ever goes down: docs/PROTOCOL.md
        §10); the others leave ``local_reduce_pool`` in the same write."""
        members = sorted((self.sets[n] for n in self.gathering if n in self.sets), key=lambda r: r.number)
        self.gathering.clear()
        done = CancelTimer(GATHER_TIMER)  # whoever sends them on (after it fired: harmless)
        if not members:
            return [done]
        head, rest = members[0], members[1:]
        if rest:
            for m in rest:
                head.frame.URL_set.update(m.frame.URL_set)
                head.incomplete |= m.incomplete
                del self.sets[m.number]
            head.gathered = tuple(sorted({*head.gathered, *(n for m in rest for n in (m.number, *m.gathered))}))
            for url in head.frame.URL_set:
                self.claims[url] = head.number
            self.counters.inc("sets_gathered", amount=len(rest))
            log.info("set %d: gathered with %d more of this LAN's sets", head.number, len(rest))
        # Fewer sets in flight now: held-back frames may go on.
        return [done, *(Drop(LOCAL_REDUCE_POOL, m.number) for m in rest), *self._to_peers(head), *self._start_waiting()]

    def peers_to_ask(self) -> set[str]:
        """Paper gap 4: under ``wait`` every configured peer network (those not connected
        are asked when they come back); under ``admit`` those connected at this moment."""
        return {str(Peer(n)) for n in (self.config.peers if self.wait else self.peers)}

    def _admit(self, rec: SetRecord) -> list[Action]:
        urls = list(rec.frame.URL_set)
        for url in urls:
            self.claims.pop(url, None)
        del self.sets[rec.number]
        for n in (rec.number, *rec.gathered):
            _remember(self.recently_concluded, n, None, RECENTLY_CONCLUDED)
        self.counters.inc("urls_admitted", amount=len(urls))
        self.counters.inc("sets_concluded", complete=str(not rec.incomplete).lower())
        log.info("set %d: admitted %d URLs%s", rec.number, len(urls), " (concluded incomplete)" if rec.incomplete else "")
        actions: list[Action] = [Admit(rec.number, tuple(urls)), Drop(POOL_OF[rec.stage], rec.number),
                                 Conclude(rec.number, not rec.incomplete, rec.digest),
                                 *(Conclude(n, not rec.incomplete) for n in rec.gathered)]
        actions += self._assign(rec.number, urls)
        if self.gathering and not self._out_with_peers():
            actions += self._send_gathered()  # R4: nothing of ours is out now
        return actions + self._start_waiting()

    def _reply_foreign(self, rec: SetRecord, found: LookupDone | None) -> list[Action]:
        """Answer another network (§2.4) and, in exact mode, apply the claim rule."""
        actions: list[Action] = []
        losers: set[int] = set()
        answer = rec.frame.URL_set
        if found is not None:
            for url, admitted in zip(list(answer), found.admitted):
                if answer[url]:
                    continue
                if self.homes is not None:
                    # A previous home says only what it admitted (_checked_here): what it
                    # claims, it is routing to the asker, which decides it there.
                    answer[url] = int(admitted)
                    continue
                own = self.claims.get(url)
                holder = own if own is not None else self.held_elsewhere.get(url)
                if admitted or (holder is not None and holder < rec.number):
                    answer[url] = 1
                    continue
                if own is not None:  # R2: the requesting set has the lower number and wins the URL
                    losers.add(self._lose(url, own))
                self._note_held_elsewhere(url, rec.number)
            actions += [Save(POOL_OF[self.sets[n].stage], n, self.sets[n].dump()) for n in sorted(losers)]
        log.info("set %d of %s: answered, %d of %d URLs seen here", rec.number, rec.origin,
                 sum(answer.values()), len(answer))
        reply = Send((member_from_str(rec.origin),), wire.encode(rec.frame.with_flag(FLAG_ANSWER)))
        if self.homes is not None:  # a previous home's answer (_checked_here): nothing was kept
            return [*actions, reply]
        del self.sets[rec.number]
        self.counters.inc("sets_concluded", complete=str(not rec.incomplete).lower())
        return [*actions, reply, Drop(DIST_REDUCE_POOL, rec.number), Conclude(rec.number, not rec.incomplete)]

    def _note_held_elsewhere(self, url: str, number: int) -> None:
        """Remember (newest last) that another network's set ``number`` holds ``url``;
        the oldest entries go beyond ``held_elsewhere_max``. Not under a re-crawl policy:
        that set may still give the URL up because a third network admitted it not long
        ago (within its age, but long before the offers this entry would drop), so an
        entry would hold a URL that is due away from its re-crawl (PROTOCOL.md,
        "Re-crawl by age")."""
        if self.config.recrawl is not None:
            return
        _remember(self.held_elsewhere, url, number, self.config.held_elsewhere_max)

    def _lose(self, url: str, number: int) -> int:
        """Our in-flight set ``number`` gives ``url`` up to another network's lower-numbered
        set; returns ``number`` (its record is saved once for all it gave up)."""
        del self.claims[url]
        rec = self.sets[number]
        del rec.frame.URL_set[url]
        for urls in rec.routes.values():  # a set of ours with its homes gives it up there too
            if url in urls:
                urls.remove(url)
        self.counters.inc("urls_dropped", stage="tie-break")
        return number

    # -- look-up results ---------------------------------------------------------------
    def _lookup_done(self, found: LookupDone) -> list[Action]:
        why = self._lookups.pop(found.number, None)
        if why is None:
            raise Rejected("unknown-lookup", f"look-up result for {found.number}, which asked none")
        kind, ctx = why
        if kind == "own":
            sender, frame = ctx
            return self._own_set_arrived(sender, frame, found)
        return self._reply_foreign(ctx, found)

    # -- timers and membership ---------------------------------------------------------
    def _timer(self, number: int) -> list[Action]:
        if number == GATHER_TIMER:
            return self._send_gathered()
        rec = self.sets.get(number)
        if rec is None:
            return []
        if self.wait or rec.stage in ROUTED:  # a home's (or previous home's) answer is never given up
            return self._timer_wait(rec)
        live = {m for m in rec.awaiting if self._live(m)}  # gap 3: the dead are not waited for
        rec.incomplete |= live != rec.awaiting
        rec.awaiting = live
        if rec.awaiting and rec.attempts <= self.config.max_resends:
            rec.attempts += 1
            self.counters.inc("resends", stage=rec.stage.value)
            log.info("set %d: no answer from %s; re-sending (attempt %d)", number, ", ".join(sorted(rec.awaiting)), rec.attempts)
            return self._ask(rec)
        if rec.awaiting:
            rec.incomplete = True
            self.counters.inc("concluded_incomplete", stage=rec.stage.value)
            log.warning("set %d: concluded without %s after %d attempts", number, ", ".join(sorted(rec.awaiting)), rec.attempts)
            rec.awaiting = set()
        return self._stage_done(rec)

    def _timer_wait(self, rec: SetRecord) -> list[Action]:
        """Slow is not dead (``wait``): no answer yet from a member that is alive means
        ask again later, never conclude without it. Not waited for: a LAN host that has
        left (the admitted record speaks for what the LAN crawled), a peer network no
        longer configured. A peer network that is down is waited for."""
        gone = {m for m in rec.awaiting if not self._waited_for(m)}
        if gone:
            rec.awaiting -= gone
            rec.incomplete = True
            log.warning("set %d: not waiting for %s (left)", rec.number, ", ".join(sorted(gone)))
        if not rec.awaiting:
            return self._stage_done(rec)
        rec.attempts += 1
        live = [m for m in rec.awaiting if self._live(m)]
        if live:
            self.counters.inc("resends", stage=rec.stage.value)
            log.info("set %d: no answer yet from %s; asking again (attempt %d)", rec.number, ", ".join(sorted(live)), rec.attempts)
        return [*self._send_to(rec, live), SetTimer(rec.number, self._resend_delay(rec))]

    def _waited_for(self, member: str) -> bool:
        m = member_from_str(member)
        return m.ip in self.hosts if isinstance(m, Host) else m.network in self.config.peers

    def waiting_for(self) -> dict[str, int]:
        """Sets in flight per member whose answer they still wait for (status, metrics)."""
        counts: dict[str, int] = {}
        for rec in self.sets.values():
            for m in rec.awaiting:
                counts[m] = counts.get(m, 0) + 1
        return counts

    def _live(self, member: str) -> bool:
        m = member_from_str(member)
        return m.ip in self.hosts if isinstance(m, Host) else m.network in self.peers

    def _joined(self, member: Member, address: str = "") -> list[Action]:
        # Sets that wait for this member (it reconnected, or a peer network is back) ask it now.
        who = str(member)
        again = [rec for rec in self.sets.values() if who in rec.awaiting]
        if isinstance(member, Peer):
            self.peers.add(member.network)
        else:
            self.hosts.add(member.ip)
        asks = [a for rec in again for a in self._send_to(rec, (who,))]
        if isinstance(member, Peer):
            asks += self._next_routes(member.network)
        if again:
            log.info("%s is here: asking it for %d sets that wait for it", who, len(again))
        if not isinstance(member, Host):
            return asks
        if self.known.get(member.ip) != address:
            self.known[member.ip] = address
            asks.append(NoteHost(member.ip, address))
        # A host that comes back is sent again the tasks it has not acknowledged; then
        # what was admitted while no host was there is handed out (and sent) as usual.
        resend = [Send((member,), wire.encode(Task(task_parts(k)[0], tuple(urls))))
                  for k, urls in self.tasks.items() if task_parts(k)[1] == member.ip]
        return asks + resend + self._reassign("")

    def _left(self, member: Member) -> list[Action]:
        who = str(member)
        if isinstance(member, Host):
            self.hosts.discard(member.ip)
        else:
            self.peers.discard(member.network)
        actions: list[Action] = []
        if isinstance(member, Peer) and self.wait:
            waiting = sum(1 for rec in self.sets.values() if who in rec.awaiting)
            log.warning("%s is down: %d sets wait for it in dist_reduce_pool", who, waiting)
            return actions
        for rec in list(self.sets.values()):
            if who in rec.awaiting and rec.stage not in ROUTED:
                rec.awaiting.discard(who)
                rec.incomplete = True
                if not rec.awaiting:
                    actions += [CancelTimer(rec.number), *self._stage_done(rec)]
        if isinstance(member, Host) and not self.wait:
            # "admit": a host that left is not waited for, its unacknowledged tasks move.
            # Under "wait" they stay its own and go to it again when it is back
            # (_joined): a lost connection is not a lost host, and a task whose ack was
            # lost with the connection may already be in its task_pool, being crawled;
            # handing it to another host would fetch it twice. Only a graceful leave
            # (_handed_back) moves a host's tasks.
            actions += self._reassign(member.ip)
        return actions

    # -- task_URL -> task_pool (gap 8) -------------------------------------------------
    def _assign(self, number: int, urls: list[str]) -> list[Action]:
        if not urls:
            return []
        if not self.hosts:
            # Nobody to crawl them yet: keep them in task_URL for the first host that joins.
            key = task_key(number, "")
            self.tasks[key] = self.tasks.get(key, []) + list(urls)
            return [SaveTask(key, tuple(self.tasks[key]))]
        per_host: dict[str, list[str]] = {}
        for url in urls:
            per_host.setdefault(owner_of(url, self.hosts), []).append(url)
        actions: list[Action] = []
        for host, batch in sorted(per_host.items()):
            key = task_key(number, host)
            self.tasks[key] = self.tasks.get(key, []) + batch
            actions += [SaveTask(key, tuple(self.tasks[key])),
                        Send((Host(host),), wire.encode(Task(number, tuple(self.tasks[key]))))]
        return actions

    def _reassign(self, gone: str) -> list[Action]:
        actions: list[Action] = []
        for key in [k for k in self.tasks if task_parts(k)[1] == gone]:
            urls = self.tasks.pop(key)
            actions.append(DropTask(key))
            actions += self._assign(task_parts(key)[0], urls)
            if gone:
                self.counters.inc("tasks_reassigned", amount=len(urls))
        return actions

    def _handed_back(self, sender: Host, task: Task) -> list[Action]:
        """A host that leaves for good hands its uncrawled tasks back: it is no longer
        a member, its tasks go to the others (stored before the ack lets it drop them)."""
        self.hosts.discard(sender.ip)
        urls = list(self._canonical_urls(sender, task.number, dict.fromkeys(task.URLs, 0)))
        actions = self._reassign(sender.ip) + self._assign(task.number, urls) + self._forget(sender.ip)
        self.counters.inc("tasks_handed_back", amount=len(task.URLs))
        log.info("%s leaves and hands back %d tasks", sender, len(task.URLs))
        return actions + [Send((sender,), wire.encode(Ack(task.number, "stored")))]

    def _forget(self, host: str) -> list[Action]:
        return [ForgetHost(host)] if self.known.pop(host, None) is not None else []

    def _operator_reassign(self, event: Reassign) -> list[Action]:
        """``dedupnet reassign``: the operator's word that a host is gone, so its work
        moves as a graceful leave's would (:meth:`_handed_back`). Refused while the host
        is connected: it may be crawling those tasks. What it had fetched and not yet
        acknowledged is not known here; its own task_pool, taken out of its Redis by the
        operator's tool in the same step, arrives as ``urls``."""
        ip, reply = event.host, (event.reply_to,)

        def refused(reason: str, why: str) -> list[Action]:
            self.counters.inc("rejected", reason=reason)
            log.warning("reassign of %s refused: %s", ip, why)
            return [Send(reply, wire.encode(Ack(event.number, "rejected", reason)))]

        if ip in self.hosts:
            return refused("host-live", "it is connected")
        if self.config.network_of(ip) != self.config.network:
            return refused("host-not-in-lan", f"not in LAN {self.config.lan}")
        held = sum(len(u) for k, u in self.tasks.items() if task_parts(k)[1] == ip)
        if ip not in self.known and not held and not event.urls:
            return refused("unknown-host", "this center has no such host and holds nothing for it")
        urls = list(self._canonical_urls(Host(ip), event.number, dict.fromkeys(event.urls, 0)))
        actions = self._reassign(ip) + self._assign(event.number, urls) + self._forget(ip)
        self.counters.inc("tasks_reassigned", amount=len(urls))
        where = ", ".join(sorted(self.hosts)) or "no live host yet (kept for the first that joins)"
        log.warning("operator: host %s is gone; %d tasks of task_URL and %d of its task_pool go to %s",
                    ip, held, len(urls), where)
        return actions + [Send(reply, wire.encode(Ack(event.number, "stored")))]

    def _task_acked(self, sender: Host, number: int) -> list[Action]:
        key = task_key(number, sender.ip)
        if self.tasks.pop(key, None) is None:
            self.counters.inc("repeated_answers")
            return []
        return [DropTask(key)]

    def _reoffer(self, event: Reoffer) -> list[Action]:
        actions: list[Action] = []
        for number, urls in sorted(event.tasks.items()):
            key = task_key(number, event.host)
            self.tasks[key] = list(dict.fromkeys([*self.tasks.get(key, []), *urls]))
            actions.append(SaveTask(key, tuple(self.tasks[key])))
            if event.host in self.hosts:
                actions.append(Send((Host(event.host),), wire.encode(Task(number, tuple(self.tasks[key])))))
        self.counters.inc("tasks_reoffered", amount=sum(len(u) for u in event.tasks.values()))
        return actions

    # -- restart (durability) ----------------------------------------------------------
    def _resume(self, event: Resume) -> list[Action]:
        """Pick up every stored set: it is asked again once its timer fires, and members
        that have not come back by then are no longer waited for."""
        actions: list[Action] = []
        for rec in sorted(map(SetRecord.load, event.sets), key=lambda r: r.number):
            self.sets[rec.number] = rec
            if self.exact and rec.stage is not Stage.FOREIGN:
                for url in rec.frame.URL_set:
                    self.claims[url] = rec.number
            if rec.stage is Stage.HOME:
                actions += self._queue_routes(rec, rec.routes)
            actions.append(SetTimer(rec.number, self.config.resume_grace))
        self.tasks.update({k: list(v) for k, v in event.tasks.items()})
        self.sequences.update(event.sequences)
        self.known.update(event.hosts)
        log.info("resumed %d sets and %d task assignments", len(event.sets), len(event.tasks))
        return actions
