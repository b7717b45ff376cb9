"""The stages of a set at a center (§2.3, §2.4, and §11's homes): a LAN host's set
asked of the LAN and of the peer networks or its homes, another network's set asked of
the LAN and answered, the end of a stage, and the table that takes a set from one stage
to the next. A part of the center's sans-I/O core
(:class:`~center_host.protocol.CenterProtocol`) that owns the sets in flight and their
pending look-ups; it asks :class:`Membership` who is connected and hands it what is
admitted, and :class:`Claims` and :class:`Homes` keep the claims and the frames to the
homes."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable

from dedupnet.codec import wire
from dedupnet.codec.counters import Counters
from dedupnet.codec.messages import FLAG_ANSWER, FLAG_LOOKUP, FLAG_NEW_SET, Ack, Frame
from dedupnet.codec.numbers import split_number
from dedupnet.codec.pools import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL
from dedupnet.codec.urls import set_digest

from .backlog import Backlog
from .claims import Claims
from .config import CenterConfig
from .events import (Action, Admit, CancelTimer, Conclude, Drop, Host, Lookup, LookupDone, Member, Peer,
                     Resume, Save, Send, SetTimer, member_from_str)
from .homes import Homes
from .membership import Membership
from .sets import (MAX_HELD_PER_HOST, POOL_OF, RECENTLY_CONCLUDED, ROUTED, ForeignSetLookup, OwnSetLookup,
                   PendingLookup, Rejected, SetRecord, Stage, Step, check_number, remember)

log = logging.getLogger("dedupnet.center")


class Stages:
    """The sets in flight, from the frame that starts one to its conclusion."""

    def __init__(self, config: CenterConfig, counters: Counters, members: Membership, homes: Homes | None,
                 claims: Claims) -> None:
        self.config = config
        self.counters = counters
        self.members = members
        self.homes = homes
        self.claims = claims
        self.exact = config.mode == "exact"
        self.wait = config.partition_policy == "wait"
        self.sets: dict[int, SetRecord] = {}
        self.lookups: dict[int, PendingLookup] = {}  # number -> what its look-up is for
        #: flag=1 frames held back (not acked), oldest first (an OrderedDict: see sets.remember).
        self.waiting: OrderedDict[int, tuple[Host, Frame]] = OrderedDict()
        #: R4: own sets done with their LAN stage, waiting to go on as one (ordered).
        self.gathering: dict[int, None] = {}
        #: Own sets admitted lately (newest last, ``RECENTLY_CONCLUDED`` of them): an answer
        #: for one is late (a re-sent question answered twice, an ``admit`` time limit),
        #: logged at debug; an answer for a number never held here stays a warning.
        self.recently_concluded: OrderedDict[int, None] = OrderedDict()
        #: Running counts of ``sets`` and ``waiting`` (what ``_room`` reads on every frame).
        self.backlog = Backlog()

    # -- what the status reads ---------------------------------------------------------
    def own_in_flight(self) -> int:
        """Own sets in a stage that asks others (a set with its home networks does not
        count: back-pressure for those is ``max_routed_waiting``)."""
        return self.backlog.own_in_flight()

    def routed_waiting(self) -> dict[int, int]:
        """§11: per home network, the URLs this center holds for it that it has not taken
        (by scan, for the status; ``_room`` reads the running total)."""
        out: dict[int, int] = {}
        for rec in self.sets.values():
            for network, urls in rec.routes.items():
                out[network] = out.get(network, 0) + len(urls)
        return out

    def waiting_for(self) -> dict[str, int]:
        """Sets in flight per member whose answer they still wait for (status, metrics)."""
        counts: dict[str, int] = {}
        for rec in self.sets.values():
            for m in rec.awaiting:
                counts[m] = counts.get(m, 0) + 1
        return counts

    def check_backlog(self) -> None:
        """The running counts agree with a scan (AssertionError if not): tests call it."""
        self.backlog.check(self.sets, self.waiting.values())

    def _homes(self) -> Homes:
        """The homes part, for what runs only under home routing."""
        if self.homes is None:
            raise AssertionError("not routing by homes")
        return self.homes

    def peers_to_ask(self) -> set[str]:
        """Paper gap 4: under ``wait`` every configured peer network (those not connected
        are asked when they come back); under ``admit`` those connected at this moment."""
        return {str(Peer(n)) for n in (self.config.peers if self.wait else self.members.peers)}

    # -- §2.3: an own set --------------------------------------------------------------
    def frame_from_host(self, sender: Host, frame: Frame) -> list[Action]:
        self.counters.inc("frames_in", stage="lan", flag=str(frame.flag))
        if frame.flag == FLAG_NEW_SET:
            if frame.IP != sender.ip:
                raise Rejected("ip-mismatch", f"flag=1 number {frame.number} from {sender} carries IP {frame.IP}")
            check_number(self.config, sender, frame.number)
            held = self.sets.get(frame.number)
            if held is not None:  # stored already: the ack was lost, repeat it
                if held.digest and held.digest != set_digest(frame.URL_set):
                    return self.members.reused(sender, frame.number)
                self.counters.inc("repeated_frames")
                return [Send((sender,), wire.encode(Ack(frame.number, "duplicate")))]
            if frame.number in self.waiting:
                if set_digest(self.waiting[frame.number][1].URL_set) != set_digest(frame.URL_set):
                    return self.members.reused(sender, frame.number)
                return []
            if self._room() <= 0:
                if self.backlog.held.get(sender, 0) >= MAX_HELD_PER_HOST:
                    raise Rejected("too-many-held", f"set {frame.number} from {sender}: {MAX_HELD_PER_HOST} of its "
                                                    f"sets are held already (not acknowledged: it keeps them)")
                self.waiting[frame.number] = (sender, frame)
                self.backlog.hold(sender)
                self.counters.inc("frames_held")
                return []
            return self._start_own(sender, frame)
        if frame.flag == FLAG_ANSWER:
            return self._answer(sender, frame)
        raise Rejected("flag2-from-lan", f"flag=2 number {frame.number} from LAN host {sender} (§2.4: not handled)")

    def _room(self) -> int:
        """How many more own sets may start now."""
        if self.homes is not None and self.backlog.routed >= self.config.max_routed_waiting:
            return 0
        return self.config.max_in_flight - self.backlog.own_in_flight()

    def _start_own(self, sender: Member, frame: Frame) -> list[Action]:
        self.lookups[frame.number] = OwnSetLookup(sender, frame)
        return [Lookup(frame.number, tuple(frame.URL_set))]

    def _start_waiting(self) -> list[Action]:
        """Sets left, or were gathered into one (R4): the oldest held-back frames whose
        hosts are still here go on, as many as now fit under ``max_in_flight`` (each
        look-up is made, and its result handled, in turn)."""
        actions: list[Action] = []
        room = self._room()
        while self.waiting and room > 0:
            _, (sender, frame) = self.waiting.popitem(last=False)
            self.backlog.release(sender)
            if sender.ip in self.members.hosts:
                actions += self._start_own(sender, frame)
                room -= 1
        return actions

    def lookup_done(self, found: LookupDone) -> list[Action]:
        pending = self.lookups.pop(found.number, None)
        match pending:
            case OwnSetLookup(sender, frame):
                return self._own_set_arrived(sender, frame, found)
            case ForeignSetLookup(rec):
                return self._advance(rec, Step.REPLY, found)
        raise Rejected("unknown-lookup", f"look-up result for {found.number}, which asked none")

    def _own_set_arrived(self, sender: Member, frame: Frame, found: LookupDone) -> list[Action]:
        """A new set to decide here: from a LAN host, or (§11) the URLs a peer found of
        sites homed here. Its number seen before with the same URLs is a repeat; with
        other URLs, a host's lost store (refused) or a peer's set routed again after
        the map changed (decided like a new one: the record keeps it exact)."""
        digest = set_digest(frame.URL_set)
        repeat = found.concluded and (not found.digest or found.digest == digest)
        if found.concluded and not repeat and isinstance(sender, Host):
            return self.members.reused(sender, frame.number)
        ack = Send((sender,), wire.encode(Ack(frame.number, "duplicate" if repeat else "stored")))
        if repeat:
            self.counters.inc("repeated_frames")
            return [ack]
        urls = {}
        for url, admitted in zip(frame.URL_set, found.admitted):
            if self.exact and (admitted or self.claims.claimed(url, self.sets, self.homes) or self.claims.held_elsewhere_hit(url)):
                self.counters.inc("urls_dropped", stage="center-record")
                continue
            urls[url] = 0
            if self.exact:
                self.claims.claim(url, frame.number)
        self.counters.inc("urls_in", stage="lan" if isinstance(sender, Host) else "routed", amount=len(frame.URL_set))
        ask = {h for h in self.members.hosts if str(sender) != h} if self.config.local_lookup == "lan" else set()
        rec = SetRecord(Frame(urls, frame.IP, frame.number, FLAG_LOOKUP), Stage.LAN, str(sender), ask, digest=digest)
        self.backlog.enter(self.sets, rec)
        log.debug("set %d from %s: %d URLs, %d after the center's record; asking %d hosts",
                 frame.number, sender, len(frame.URL_set), len(urls), len(rec.awaiting))
        # Durable first (§ gap 7: the host lets the URLs go on this ack), then ask.
        return [Save(LOCAL_REDUCE_POOL, frame.number, rec.dump()), *self.members.note_sequence(sender, frame.number),
                ack, *self._ask(rec)]

    def _ask(self, rec: SetRecord) -> list[Action]:
        """Broadcast the stored frame to the members still awaited, or move on if none."""
        if not rec.frame.URL_set and rec.stage is not Stage.FOREIGN:
            return self._stage_done(rec)
        if not rec.awaiting:
            return self._stage_done(rec)
        return [*self._send_to(rec, rec.awaiting), SetTimer(rec.number, self._resend_delay(rec))]

    def _send_to(self, rec: SetRecord, members: Iterable[str]) -> list[Action]:
        """The stored frame to those of ``members`` that are connected now (one encoding);
        the others are sent it when they come back (:meth:`joined`)."""
        to = tuple(member_from_str(m) for m in sorted(members) if self.members.live(m))
        if rec.stage is Stage.HOME:  # §11: the frame this set heads, if any, carries its URLs
            homes = self._homes()
            return [a for m in to if isinstance(m, Peer) and homes.heads(m.network, rec.number)
                    for a in homes.send_frame(m.network, rec.number, self.sets, self.members.peers)]
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
        factor: int = 2**extra
        return min(self.config.answer_timeout * factor, max(self.config.max_resend_interval, self.config.answer_timeout))

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
                self.claims.release(url, rec.number)
            self.counters.inc("urls_dropped", stage=rec.stage.value, amount=len(seen))
        rec.awaiting.discard(who)
        rec.answered.add(who)
        if rec.stage is Stage.CHECK and isinstance(sender, Peer):  # only peers are asked in CHECK
            self.backlog.pop_route(rec, sender.network)
        if rec.awaiting:
            # Not saved: answers are idempotent, and a restarted center asks again
            # everyone its stored record awaits. Only stage changes are written.
            return []
        return [CancelTimer(rec.number), *self._stage_done(rec)]

    # -- §2.4: frames from other networks ----------------------------------------------
    def frame_from_peer(self, sender: Peer, frame: Frame) -> list[Action]:
        self.counters.inc("frames_in", stage="dist", flag=str(frame.flag))
        origin = self.config.network_of(frame.IP)
        if frame.flag == FLAG_NEW_SET and self.homes is not None:
            return self._routed_in(sender, frame, origin)
        if frame.flag == FLAG_ANSWER:
            # Under home routing a set of ours may carry a peer's IP (its URLs routed here):
            # a flag=3 with another network's IP is ours only while we hold its number.
            held = frame.number in self.sets or frame.number in self.recently_concluded
            if origin != self.config.network and (self.homes is None or not held):
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
        check_number(self.config, sender, frame.number)
        if frame.number in self.sets:
            self.counters.inc("repeated_frames")
            return []
        ask = set(self.members.hosts) if self.config.foreign_lookup == "lan" else set()
        rec = SetRecord(Frame(dict.fromkeys(frame.URL_set, 0), frame.IP, frame.number, FLAG_LOOKUP),
                        Stage.FOREIGN, str(sender), ask)
        self.backlog.enter(self.sets, rec)
        self.counters.inc("urls_in", stage="foreign", amount=len(frame.URL_set))
        if not ask:
            # foreign_lookup = "center": this center's records speak for its LAN and the
            # answer needs one look-up, so nothing is stored (the origin asks again after a crash).
            log.debug("set %d from %s: %d URLs; answered from this center's records", frame.number, sender,
                     len(frame.URL_set))
            return self._stage_done(rec)
        log.debug("set %d from %s: %d URLs; asking %d hosts", frame.number, sender, len(frame.URL_set), len(rec.awaiting))
        return [Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._ask(rec)]

    # -- §11: homes --------------------------------------------------------------------
    def _routed_in(self, sender: Peer, frame: Frame, origin: int | None) -> list[Action]:
        """A peer's URLs of sites homed here (flag=1, as from a host): decided here, as
        an own set; acknowledged once stored, which lets the peer drop them. A set routed
        here is never routed on, so every routed set is one of the sender's own: its IP
        in the sender's LAN (``not-a-peer``) and its number the sender's
        (``number-not-sender``)."""
        if origin != sender.network:
            raise Rejected("not-a-peer", f"flag=1 number {frame.number} from {sender}: IP {frame.IP} is not of "
                                         f"that network")
        check_number(self.config, sender, frame.number)
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
        self.lookups[frame.number] = ForeignSetLookup(rec)
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
        sites. URLs routed to a network no longer their home are routed again by the
        current map (:meth:`_reroute_stale`). A set a peer routed here is decided here
        whole and never routed on: routed under an earlier map, its URLs not homed here
        now are admitted here, and their new home asks here first (a previous home's
        answer counts them, :meth:`Claims.decided_here`). Routing it on under its number,
        which its origin still holds, lost it: the origin took it back as a duplicate."""
        homes = self._homes()
        if rec.stage in (Stage.LAN, Stage.HOME) and homes.previous and not rec.routes:
            moved = homes.moved_in(rec)
            if moved:
                return self._advance(rec, Step.TO_PREVIOUS_HOMES, moved)
        if rec.stage is Stage.CHECK:  # every previous home has answered: what is left is new
            self.backlog.set_routes(rec, {})
        for network in [n for n in rec.routes if str(Peer(n)) not in rec.awaiting]:
            self.backlog.pop_route(rec, network)
        here, away = homes.split(rec)
        if not rec.routes and not away:
            return self._advance(rec, Step.ADMIT)
        return self._advance(rec, Step.TO_HOMES, here, away)

    def _to_homes(self, rec: SetRecord, before: Stage, here: list[str], away: dict[int, list[str]]) -> list[Action]:
        """``here`` admitted now, ``away`` (home network -> URLs) queued for their homes;
        the set waits in ``dist_reduce_pool`` for the homes' acks."""
        actions: list[Action] = []
        if here:
            for url in here:
                del rec.frame.URL_set[url]
                self.claims.release(url, rec.number)
            self.counters.inc("urls_admitted", amount=len(here))
            actions += [Admit(rec.number, tuple(here)), *self.members.assign(rec.number, here)]
        if before is Stage.LAN:
            actions.append(Drop(LOCAL_REDUCE_POOL, rec.number))
        if before is not Stage.HOME:
            rec.attempts = 1
        self.backlog.add_routes(rec, away)
        rec.awaiting = {str(Peer(n)) for n in rec.routes}
        self.counters.inc("urls_routed", amount=sum(map(len, away.values())))
        log.debug("set %d: %d URLs admitted here, %d for their home networks %s", rec.number, len(here),
                 sum(map(len, away.values())), sorted(away))
        return [*actions, Save(DIST_REDUCE_POOL, rec.number, rec.dump()),
                *self._homes().queue(rec, away, self.sets, self.members.peers),
                SetTimer(rec.number, self._resend_delay(rec)), *self._start_waiting()]

    def _check_previous(self, rec: SetRecord, before: Stage, moved: dict[int, list[str]]) -> list[Action]:
        """Sites that moved here: each earlier home is asked (flag=2, answered from its
        record as §10's foreign sets are) whether it admitted their URLs before the map
        changed. It admits none of them now — its map homes them here, and a peer on
        another map is refused — so its answer is final. The set waits in
        ``dist_reduce_pool`` for the answers, as for a home."""
        self.backlog.set_routes(rec, moved)
        rec.attempts = 1
        rec.awaiting, rec.answered = {str(Peer(n)) for n in moved}, set()
        self.counters.inc("urls_checked", amount=sum(map(len, moved.values())))
        log.info("set %d: %d URLs of sites that moved here; asking their previous homes %s", rec.number,
                 sum(map(len, moved.values())), sorted(moved))
        drop = [Drop(LOCAL_REDUCE_POOL, rec.number)] if before is Stage.LAN else []
        return [*drop, Save(DIST_REDUCE_POOL, rec.number, rec.dump()),
                *self._send_to(rec, rec.awaiting), SetTimer(rec.number, self._resend_delay(rec)),
                *self._start_waiting()]

    def _reroute_stale(self, rec: SetRecord) -> list[Action]:
        """A set stored with its homes under an earlier map (the map changes only across
        a restart): if a URL's route is not to its home now, the set is routed again
        whole by the current map — the URLs that moved here checked with their previous
        homes first, as a new set's are. A previous home may have stored them before
        the change with its ack lost: it decides them then, and its answer says so."""
        homes = self._homes()
        if not homes.stale(rec):
            return homes.queue(rec, rec.routes, self.sets, self.members.peers)
        log.warning("set %d: routed under an earlier map; routed again by the current one", rec.number)
        self.counters.inc("sets_rerouted")
        self.backlog.set_routes(rec, {})
        rec.awaiting, rec.answered = set(), set()
        return self._route(rec)

    def home_acked(self, sender: Member, ack: Ack) -> list[Action]:
        """A home network holds (or had decided) the URLs of a frame out with it: they
        leave each of its sets, and the next frame goes."""
        homes = self._homes()
        out = homes.frame_out(sender.network, ack.number) if isinstance(sender, Peer) else ()
        if not isinstance(sender, Peer) or not out:
            self.counters.inc("repeated_acks")
            return []
        if ack.status == "rejected":
            self.counters.inc("routed_refused", reason=ack.reason or "unknown")
            log.error("set %d: network %d refused its URLs (%s); kept, asked again", ack.number, sender.network,
                      ack.reason or "no reason given")
            return []
        homes.frame_taken(sender.network, ack.number)
        actions: list[Action] = []
        for rec in [self.sets[n] for n in out if n in self.sets]:
            if rec.stage is not Stage.HOME or sender.network not in rec.routes:
                continue
            for url in self.backlog.pop_route(rec, sender.network):
                rec.frame.URL_set.pop(url, None)
                self.claims.release(url, rec.number)
                # Its home holds it now, for good: found here again, it is dropped at once. Not
                # when the peer only passes it on (routed to it under an earlier map).
                if homes.home_of(url) == sender.network:
                    self.claims.note_held_elsewhere(url, rec.number)
            rec.awaiting.discard(str(sender))
            rec.answered.add(str(sender))
            if not rec.awaiting:
                actions += [CancelTimer(rec.number), *self._stage_done(rec)]
        return [*actions, *homes.next_frame(sender.network, self.sets, self.members.peers), *self._start_waiting()]

    # -- the one place a set changes stage ---------------------------------------------
    def _advance(self, rec: SetRecord, step: Step, *context: object) -> list[Action]:
        """Take ``rec`` on by ``step``, as :data:`TRANSITIONS` says: the set's next stage is
        set here (a concluded set keeps its last one, which names the pool it leaves),
        then the step's function runs with the stage it left."""
        entry = TRANSITIONS[rec.stage].get(step)
        if entry is None:
            raise AssertionError(f"set {rec.number}: no step {step.name} from stage {rec.stage.name}")
        after, carry_out = entry
        before = rec.stage
        if after is not None and after is not before:
            if self.sets.get(rec.number) is rec:
                self.backlog.staged(before, after)
            rec.stage = after
        return carry_out(self, rec, before, *context)

    # -- the end of a stage ------------------------------------------------------------
    def _stage_done(self, rec: SetRecord) -> list[Action]:
        if self.homes is not None and rec.stage is not Stage.FOREIGN:
            return self._route(rec)
        if rec.stage is Stage.LAN and rec.frame.URL_set and self.config.peers:
            missing = set(self.config.peers) - self.members.peers
            if missing and self.wait:
                log.warning("set %d: networks %s not connected; it waits for them in dist_reduce_pool",
                            rec.number, sorted(missing))
            elif missing:  # gap 4 under "admit": not waited for, and not complete without them
                rec.incomplete = True
                self.counters.inc("peers_missing", amount=len(missing))
                log.warning("set %d: networks %s not connected; not asked", rec.number, sorted(missing))
        if rec.stage is Stage.LAN and rec.frame.URL_set and self.peers_to_ask():
            return self._advance(rec, Step.GATHER if self.exact else Step.TO_PEERS)
        if rec.stage is Stage.FOREIGN:
            return self._advance(rec, Step.LOOK_UP if self.exact else Step.REPLY)
        return self._advance(rec, Step.ADMIT)

    def _look_up_foreign(self, rec: SetRecord, before: Stage) -> list[Action]:
        """Exact mode: the foreign set is answered from the admitted record (and the claims)."""
        self.lookups[rec.number] = ForeignSetLookup(rec)
        return [Lookup(rec.number, tuple(rec.frame.URL_set))]

    def _to_peers(self, rec: SetRecord, before: Stage) -> list[Action]:
        rec.awaiting, rec.answered, rec.attempts = self.peers_to_ask(), set(), 1
        log.debug("set %d: LAN de-dup done, %d URLs left; asking %d networks",
                 rec.number, len(rec.frame.URL_set), len(rec.awaiting))
        return [Drop(LOCAL_REDUCE_POOL, rec.number), Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._ask(rec)]

    def _out_with_peers(self) -> bool:
        return self.backlog.by_stage[Stage.DIST] > 0

    def _gather(self, rec: SetRecord, before: Stage) -> list[Action]:
        """R4, Nagle's rule: a set done with its LAN stage goes on at once while nothing
        of ours is out with the peers; otherwise it is held (it stays in
        ``local_reduce_pool``, claims and all) until that is so or ``gather_max`` URLs
        are held, and then they go on as one. A peer's cost is mostly per set and every
        peer answers every set: the longer its sets are out, the more a center gathers,
        and an idle one waits for nothing. What is held goes first if this set would take it past
        ``gather_max`` (a gathered set must fit the peers' ``max_urls``)."""
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
        return actions

    def _send_gathered(self) -> list[Action]:
        """R4: the gathered sets become one, under the lowest of their numbers, which now
        claims all their URLs (a claim's number only ever goes down: docs/PROTOCOL.md
        §10); the others leave ``local_reduce_pool`` in the same write."""
        members = sorted((self.sets[n] for n in self.gathering if n in self.sets), key=lambda r: r.number)
        self.gathering.clear()
        if not members:
            return []
        head, rest = members[0], members[1:]
        if rest:
            for m in rest:
                head.frame.URL_set.update(m.frame.URL_set)
                head.incomplete |= m.incomplete
                self.backlog.leave(self.sets, m)
            head.gathered = tuple(sorted({*head.gathered, *(n for m in rest for n in (m.number, *m.gathered))}))
            for url in head.frame.URL_set:
                self.claims.claim(url, head.number)
            self.counters.inc("sets_gathered", amount=len(rest))
            log.debug("set %d: gathered with %d more of this LAN's sets", head.number, len(rest))
        # Fewer sets in flight now: held-back frames may go on.
        return [*(Drop(LOCAL_REDUCE_POOL, m.number) for m in rest), *self._advance(head, Step.TO_PEERS), *self._start_waiting()]

    def _admit(self, rec: SetRecord, before: Stage) -> list[Action]:
        urls = list(rec.frame.URL_set)
        for url in urls:
            self.claims.drop(url)
        self.backlog.leave(self.sets, rec)
        for n in (rec.number, *rec.gathered):
            remember(self.recently_concluded, n, None, RECENTLY_CONCLUDED)
        self.counters.inc("urls_admitted", amount=len(urls))
        self.counters.inc("sets_concluded", complete=str(not rec.incomplete).lower())
        log.debug("set %d: admitted %d URLs%s", rec.number, len(urls), " (concluded incomplete)" if rec.incomplete else "")
        actions: list[Action] = [Admit(rec.number, tuple(urls)), Drop(POOL_OF[rec.stage], rec.number),
                                 Conclude(rec.number, not rec.incomplete, rec.digest),
                                 *(Conclude(n, not rec.incomplete) for n in rec.gathered)]
        actions += self.members.assign(rec.number, urls)
        if self.gathering and not self._out_with_peers():
            actions += self._send_gathered()  # R4: nothing of ours is out now
        return actions + self._start_waiting()

    def _reply_foreign(self, rec: SetRecord, before: Stage, found: LookupDone | None = None) -> list[Action]:
        """Answer another network (§2.4) and, in exact mode, apply the claim rule."""
        actions: list[Action] = []
        answer = rec.frame.URL_set
        if found is not None:
            seen, losses = self.claims.settle(rec, found.admitted, self.sets, self.homes)
            for url in seen:
                answer[url] = 1
            losers = {self._lose(url, own) for url, own in losses}
            actions += [Save(POOL_OF[self.sets[n].stage], n, self.sets[n].dump()) for n in sorted(losers)]
        log.debug("set %d of %s: answered, %d of %d URLs seen here", rec.number, rec.origin,
                 sum(answer.values()), len(answer))
        reply = Send((member_from_str(rec.origin),), wire.encode(rec.frame.with_flag(FLAG_ANSWER)))
        if self.homes is not None:  # a previous home's answer (_checked_here): nothing was kept
            return [*actions, reply]
        self.backlog.leave(self.sets, rec)
        self.counters.inc("sets_concluded", complete=str(not rec.incomplete).lower())
        return [*actions, reply, Drop(DIST_REDUCE_POOL, rec.number), Conclude(rec.number, not rec.incomplete)]

    def _lose(self, url: str, number: int) -> int:
        """Our in-flight set ``number`` gives ``url`` up to another network's lower-numbered
        set (its claim is gone already); returns ``number`` (its record is saved once for
        all it gave up)."""
        rec = self.sets[number]
        del rec.frame.URL_set[url]
        self.backlog.unroute(rec, url)  # a set of ours with its homes gives it up there too
        self.counters.inc("urls_dropped", stage="tie-break")
        return number

    # -- members and timers ------------------------------------------------------------
    def joined(self, member: Member) -> list[Action]:
        """Sets that wait for ``member`` (it reconnected, or a peer network is back) ask it
        now; a home that is back is sent the frame it waits for."""
        who = str(member)
        again = [rec for rec in self.sets.values() if who in rec.awaiting]
        asks = [a for rec in again for a in self._send_to(rec, (who,))]
        if isinstance(member, Peer) and self.homes is not None:
            asks += self.homes.next_frame(member.network, self.sets, self.members.peers)
        if again:
            log.info("%s is here: asking it for %d sets that wait for it", who, len(again))
        return asks

    def left(self, member: Member) -> list[Action]:
        """``member`` is gone: sets conclude without it (a peer network under ``wait``,
        and a home, are waited for)."""
        who = str(member)
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
        return actions

    def timer(self, number: int) -> list[Action]:
        """Set ``number``'s answers are late: ask again, or conclude without them."""
        rec = self.sets.get(number)
        if rec is None:
            return []
        if self.wait or rec.stage in ROUTED:  # a home's (or previous home's) answer is never given up
            return self._timer_wait(rec)
        live = {m for m in rec.awaiting if self.members.live(m)}  # gap 3: the dead are not waited for
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
        gone = {m for m in rec.awaiting if not self.members.waited_for(m)}
        if gone:
            rec.awaiting -= gone
            rec.incomplete = True
            log.warning("set %d: not waiting for %s (left)", rec.number, ", ".join(sorted(gone)))
        if not rec.awaiting:
            return self._stage_done(rec)
        rec.attempts += 1
        live = [m for m in rec.awaiting if self.members.live(m)]
        sent = self._send_to(rec, live)  # a set whose URLs wait in another's frame to a home sends nothing
        if sent:
            self.counters.inc("resends", stage=rec.stage.value)
            log.info("set %d: no answer yet from %s; asking again (attempt %d)", rec.number, ", ".join(sorted(live)), rec.attempts)
        return [*sent, SetTimer(rec.number, self._resend_delay(rec))]

    def resume(self, event: Resume) -> list[Action]:
        """Pick up every stored set: it is asked again once its timer fires, and members
        that have not come back by then are no longer waited for."""
        actions: list[Action] = []
        for rec in sorted(map(SetRecord.load, event.sets), key=lambda r: r.number):
            self.backlog.enter(self.sets, rec)
            if self.exact and rec.stage is not Stage.FOREIGN:
                for url in rec.frame.URL_set:
                    self.claims.claim(url, rec.number)
            if rec.stage is Stage.HOME:
                actions += self._reroute_stale(rec)
            actions.append(SetTimer(rec.number, self.config.resume_grace))
        return actions


#: The steps of :meth:`Stages._advance`, each a function of ``(stages, set, the stage it
#: left, *what the step needs)``.
Transition = Callable[..., list[Action]]
#: stage -> step -> (the stage after it, None: concluded; the function that carries it out).
TRANSITIONS: dict[Stage, dict[Step, tuple[Stage | None, Transition]]] = {
    Stage.LAN: {
        Step.TO_PEERS: (Stage.DIST, Stages._to_peers),
        Step.GATHER: (Stage.LAN, Stages._gather),
        Step.TO_PREVIOUS_HOMES: (Stage.CHECK, Stages._check_previous),
        Step.TO_HOMES: (Stage.HOME, Stages._to_homes),
        Step.ADMIT: (None, Stages._admit),
    },
    Stage.DIST: {Step.ADMIT: (None, Stages._admit)},
    Stage.CHECK: {Step.TO_HOMES: (Stage.HOME, Stages._to_homes), Step.ADMIT: (None, Stages._admit)},
    Stage.HOME: {Step.TO_HOMES: (Stage.HOME, Stages._to_homes), Step.TO_PREVIOUS_HOMES: (Stage.CHECK, Stages._check_previous),
                 Step.ADMIT: (None, Stages._admit)},
    Stage.FOREIGN: {Step.LOOK_UP: (Stage.FOREIGN, Stages._look_up_foreign), Step.REPLY: (None, Stages._reply_foreign)},
}
