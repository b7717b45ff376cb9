"""The center's side of the protocol as a pure state machine (paper §2.3, §2.4).

Events in, actions out; no sockets, no trio, no Redis. A set's life at a center:

own set   flag=1 from a LAN host ──> ``local_reduce_pool`` (stage LAN)
          ──flag=2 to the LAN's other live hosts, answers merged──>
          ``dist_reduce_pool`` (stage DIST) ──flag=2 to the peer networks,
          answers merged──> admitted: ``task_URL`` ──Task──> one host's ``task_pool``

foreign   flag=2 from a peer network ──> ``dist_reduce_pool`` (stage FOREIGN)
set       ──flag=2 to the LAN's live hosts, answers merged──> flag=3 to the origin

Under home routing (docs/PROTOCOL.md §11) an own set goes from LAN to HOME (its URLs
of other networks' sites with their home centers) or first to CHECK (sites that moved
here, asked of their previous home). The steps between stages are one table,
:data:`center_host.sets.TRANSITIONS`, and :meth:`CenterProtocol._advance` is the one
place a set's stage changes.

What arrives, and the method that takes it::

    flag=1 (a new set)   from a LAN host        _frame_from_host -> _own_set_arrived
                         from a peer (§11)      _routed_in -> _own_set_arrived
    flag=2 (a look-up)   from a peer            _frame_from_peer; under home routing
                                                _checked_here (a new home asks)
                         from a LAN host        refused
    flag=3 (an answer)   from a host or a peer  _answer
    Ack                  from a LAN host        _task_acked
                         from a peer (§11)      _home_acked
    Task                 from a LAN host        _handed_back (it leaves for good)

The core is one class in four modules: this one (its state, the entry point, the checks
every message passes), center_host/stages.py (§2.3, §2.4 and the end of a stage),
center_host/homes.py (§11) and center_host/membership.py (timers, members, tasks,
restart); the records, the table and the pending look-ups are center_host/sets.py, the
events and actions center_host/events.py, the configuration center_host/config.py.

The adapter (center_host/daemon.py, or a conformance runner) executes the actions
of one event in order and in one Redis transaction, and answers a
:class:`Lookup` with :class:`LookupDone` before it feeds any other event, so the
machine never sees a half-applied state. Exact mode's claims (docs/PROTOCOL.md,
"Exact mode") are decided here too; only their storage is outside.
"""

from __future__ import annotations

import logging

from dedupnet.codec import wire
from dedupnet.codec.counters import Counters
from dedupnet.codec.messages import Ack, Done, Frame, Task
from dedupnet.codec.numbers import MAX_SEQUENCE, split_number
from dedupnet.codec.urls import canonical_set

from .config import FOREIGN_LOOKUPS, LOCAL_LOOKUPS, PARTITION_POLICIES, ROUTINGS, CenterConfig
from .events import (Action, Admit, CancelTimer, Conclude, Drop, DropTask, Event, ForgetHost, ForgetMoved, Host,
                     Joined, Ledger, Left, Lookup, LookupDone, Member, NoteHost, NoteMoved, NoteSequence, Operator,
                     Peer, Reassign, Received, Reoffer, Resume, Save, SaveTask, Send, SetTimer, TimerFired, Unledger,
                     member_from_str)
from .homes import Homes
from .membership import MAX_MESSAGE_URLS, MOVED_NUMBER, SPARE_NUMBERS, Membership, reissue_timer
from .sets import (MAX_HELD_PER_HOST, POOL_OF, RECENTLY_CONCLUDED, ROUTED, TRANSITIONS,
                   ForeignSetLookup, OwnSetLookup, PendingLookup, Rejected, SetRecord, Stage, Step, owner_of, task_key,
                   task_parts)
from .stages import Stages

__all__ = [
    "CenterProtocol", "CenterConfig", "PARTITION_POLICIES", "ROUTINGS", "FOREIGN_LOOKUPS", "LOCAL_LOOKUPS",
    "Host", "Peer", "Member", "Operator", "member_from_str",
    "Event", "Received", "Joined", "Left", "TimerFired", "Reassign", "Reoffer", "LookupDone", "Resume",
    "Action", "Send", "Save", "Drop", "SetTimer", "CancelTimer", "Lookup", "Admit", "Conclude", "NoteSequence",
    "NoteHost", "ForgetHost", "SaveTask", "DropTask", "Ledger", "Unledger", "NoteMoved", "ForgetMoved",
    "MOVED_NUMBER", "SPARE_NUMBERS", "MAX_MESSAGE_URLS", "reissue_timer",
    "Stage", "Step", "TRANSITIONS", "POOL_OF", "ROUTED", "MAX_HELD_PER_HOST", "RECENTLY_CONCLUDED",
    "SetRecord", "Rejected", "OwnSetLookup", "ForeignSetLookup", "PendingLookup", "owner_of", "task_key",
    "task_parts",
]

log = logging.getLogger("dedupnet.center")

class CenterProtocol(Stages, Homes, Membership):
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
        #: Host IP -> the URLs given to it that it has not reported finished (durable:
        #: Ledger/Unledger; docs/PROTOCOL.md section 12).
        self.ledger: dict[str, set[str]] = {}
        #: Hosts re-issued while away -> the URLs that moved from them (durable: NoteMoved),
        #: sent to each when it is back, to drop; and the re-issue timers of hosts away.
        self.moved: dict[str, set[str]] = {}
        self.reissue_timers: dict[int, str] = {}
        #: What moved, as sent to a host that is back: number -> the URLs of that message.
        self.moved_out: dict[str, dict[int, tuple[str, ...]]] = {}
        self.claims: dict[str, int] = {}  # exact mode: URL -> own in-flight set holding it
        #: Exact mode, a bounded cache: URL -> the lowest number of another network's set
        #: told here that the URL was unseen (so that set held it). Not needed for
        #: exactness, only to drop such URLs early; lost on restart (PROTOCOL.md §10).
        self.held_elsewhere: dict[str, int] = {}
        self._lookups: dict[int, PendingLookup] = {}  # number -> what its look-up is for
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
    def handle(self, event: Event) -> list[Action]:
        try:
            return self._dispatch(event)
        except Rejected as e:
            self.counters.inc("rejected", reason=e.reason)
            log.log(e.level, "rejected %s: %s", e.reason, e)
            return []

    def _dispatch(self, event: Event) -> list[Action]:
        match event:
            case Received(sender, message):
                return self._received(sender, message)
            case LookupDone():
                return self._lookup_done(event)
            case TimerFired(number):
                return self._timer(number)
            case Joined(member, address):
                return self._joined(member, address)
            case Left(member):
                return self._left(member)
            case Resume():
                return self._resume(event)
            case Reassign():
                return self._operator_reassign(event)
            case Reoffer():
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
        if isinstance(message, Done) and isinstance(sender, Host):
            return self._tasks_done(sender, message)
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
        if sequence > MAX_SEQUENCE:  # no number is left to name: the host keeps the set
            self.counters.inc("rejected", reason="numbers-exhausted")
            log.error("set %d from %s: number used before, and the host's sequences are used up", number, sender)
            return [Send((sender,), wire.encode(Ack(number, "rejected", "numbers-exhausted")))]
        self.counters.inc("rejected", reason="number-reused")
        log.warning("set %d from %s: number used before for another set; asking it to number its sets from %d",
                    number, sender, sequence)
        return [Send((sender,), wire.encode(Ack(number, "rejected", "number-reused", sequence)))]

    # -- look-up results ---------------------------------------------------------------
    def _lookup_done(self, found: LookupDone) -> list[Action]:
        pending = self._lookups.pop(found.number, None)
        match pending:
            case OwnSetLookup(sender, frame):
                return self._own_set_arrived(sender, frame, found)
            case ForeignSetLookup(rec):
                return self._advance(rec, Step.REPLY, found)
        raise Rejected("unknown-lookup", f"look-up result for {found.number}, which asked none")

    # -- the one place a set changes stage ---------------------------------------------
    def _advance(self, rec: SetRecord, step: Step, *context: object) -> list[Action]:
        """Take ``rec`` on by ``step``, as :data:`~center_host.sets.TRANSITIONS` says: the
        set's next stage is set here (a concluded set keeps its last one, which names the
        pool it leaves), then the step's method runs with the stage it left."""
        after, method = TRANSITIONS[rec.stage].get(step, (0, ""))
        if not method:
            raise AssertionError(f"set {rec.number}: no step {step.name} from stage {rec.stage.name}")
        before = rec.stage
        if after is not None:
            rec.stage = after
        return getattr(self, method)(rec, before, *context)

