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
here, asked of their previous home). The steps between stages are one table of
functions, :data:`center_host.stages.TRANSITIONS`, and ``Stages._advance`` is the one
place a set's stage changes.

What arrives, and what takes it::

    flag=1 (a new set)   from a LAN host        Stages.frame_from_host -> _own_set_arrived
                         from a peer (§11)      Stages._routed_in -> _own_set_arrived
    flag=2 (a look-up)   from a peer            Stages.frame_from_peer; under home routing
                                                _checked_here (a new home asks)
                         from a LAN host        refused
    flag=3 (an answer)   from a host or a peer  Stages._answer
    Ack                  from a LAN host        Membership.task_acked
                         from a peer (§11)      Stages.home_acked
    Task                 from a LAN host        Membership.handed_back (it leaves for good)

This class is a facade over parts that each own their state and are called with what
they need: :class:`Stages` (center_host/stages.py: the sets in flight, the one state
machine), :class:`Membership` (who is connected, the hosts' tasks and ledgers),
:class:`Claims` (exact mode's claims) and :class:`Homes` (the maps and the frames to
the homes). A part changes only its own state (it may read another's), so what changes a
value is found in one file, and the type checker follows every call. Events and actions are
center_host/events.py, the records and steps center_host/sets.py, the configuration
center_host/config.py.

The adapter (center_host/daemon.py, or a conformance runner) executes the actions
of one event in order and in one Redis transaction, and answers a
:class:`Lookup` with :class:`LookupDone` before it feeds any other event, so the
machine never sees a half-applied state. Exact mode's claims (docs/PROTOCOL.md,
"Exact mode") are decided in the core too; only their storage is outside.
"""

from __future__ import annotations

import logging

from dedupnet.codec.counters import Counters
from dedupnet.codec.messages import Ack, Done, Frame, Task

from .claims import Claims
from .config import CenterConfig
from .events import (Action, Event, Host, Joined, Left, LookupDone, Member, Reassign, Received, Reoffer, Resume,
                     TimerFired)
from .homes import Homes
from .membership import Membership
from .sets import Rejected, canonical_urls
from .stages import Stages

log = logging.getLogger("dedupnet.center")


class CenterProtocol:
    """One center's protocol state. Call :meth:`handle` with each event; it returns the
    actions to carry out. Protocol violations are counted, logged and dropped."""

    def __init__(self, config: CenterConfig, counters: Counters | None = None) -> None:
        self.config = config
        self.counters = counters or Counters()
        self.members = Membership(config, self.counters)
        self.homes = Homes(config) if config.routing == "home" else None
        self.claims = Claims(config)
        self.stages = Stages(config, self.counters, self.members, self.homes, self.claims)

    def homes_described(self) -> str | None:
        """The map (and the earlier ones still asked about, after ``;``) as every peer
        must have it; None when this center broadcasts."""
        return self.homes.describe() if self.homes is not None else None

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
                return self.stages.lookup_done(event)
            case TimerFired(number):
                return self.members.reissue(number) if number < 0 else self.stages.timer(number)
            case Joined(member, address):
                return self._joined(member, address)
            case Left(member):
                return self._left(member)
            case Resume():
                return self._resume(event)
            case Reassign():
                return self.members.operator_reassign(event)
            case Reoffer():
                return self.members.reoffer(event)
        raise TypeError(f"not a center event: {event!r}")

    def _received(self, sender: Member, message: object) -> list[Action]:
        if isinstance(message, Frame):
            message = self._canonical(sender, message)
            if isinstance(sender, Host):
                return self.stages.frame_from_host(sender, message)
            return self.stages.frame_from_peer(sender, message)
        if isinstance(message, Ack) and isinstance(sender, Host):
            return self.members.task_acked(sender, message.number)
        if isinstance(message, Ack) and self.homes is not None:
            return self.stages.home_acked(sender, message)
        if isinstance(message, Task) and isinstance(sender, Host):
            return self.members.handed_back(sender, message)
        if isinstance(message, Done) and isinstance(sender, Host):
            return self.members.tasks_done(sender, message)
        raise Rejected("unexpected-message", f"{type(message).__name__} from {sender} is not expected at a center")

    def _canonical(self, sender: Member, frame: Frame) -> Frame:
        """The frame with every URL in the form a host would have stored it: nothing a
        peer spells enters a pool unchecked."""
        return Frame(canonical_urls(self.counters, sender, frame.number, frame.URL_set), frame.IP, frame.number,
                     frame.flag)

    # -- members -----------------------------------------------------------------------
    def _joined(self, member: Member, address: str) -> list[Action]:
        self.members.join(member)
        asks = self.stages.joined(member)
        if not isinstance(member, Host):
            return asks
        return asks + self.members.host_joined(member, address)

    def _left(self, member: Member) -> list[Action]:
        self.members.leave(member)
        actions = self.stages.left(member)
        if isinstance(member, Host):
            actions += self.members.host_left(member.ip)
        return actions

    def _resume(self, event: Resume) -> list[Action]:
        """After a restart: the stored sets first, then what is kept per host."""
        actions = self.stages.resume(event) + self.members.resume(event)
        log.debug("resumed %d sets and %d task assignments", len(event.sets), len(event.tasks))
        return actions
