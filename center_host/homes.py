"""One home per site at a center (docs/PROTOCOL.md §11): a URL of another network's site
goes to its home center alone, one frame per home at a time; a site that moved here is
checked with its previous home first. Part of the center's sans-I/O core
(:class:`~center_host.protocol.CenterProtocol`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dedupnet.codec import wire
from dedupnet.codec.messages import FLAG_LOOKUP, FLAG_NEW_SET, Ack, Frame
from dedupnet.codec.numbers import split_number
from dedupnet.codec.pools import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL
from dedupnet.codec.urls import set_digest

from .events import Action, Admit, CancelTimer, Drop, Lookup, Member, Peer, Save, Send, SetTimer
from .sets import ForeignSetLookup, Rejected, SetRecord, Stage, Step

log = logging.getLogger("dedupnet.center")


class Homes:
    """The §11 methods of :class:`~center_host.protocol.CenterProtocol` (its state is
    declared there)."""

    def _routed_in(self, sender: Peer, frame: Frame, origin: int | None) -> list[Action]:
        """A peer's URLs of sites homed here (flag=1, as from a host): decided here, as
        an own set; acknowledged once stored, which lets the peer drop them. A set routed
        here is never routed on, so every routed set is one of the sender's own: its IP
        in the sender's LAN (``not-a-peer``) and its number the sender's
        (``number-not-sender``)."""
        if origin != sender.network:
            raise Rejected("not-a-peer", f"flag=1 number {frame.number} from {sender}: IP {frame.IP} is not of "
                                         f"that network")
        self._check_number(sender, frame.number)
        held = self.sets.get(frame.number)
        if held is not None:
            if held.digest != set_digest(frame.URL_set):
                return []  # routed again with other URLs: asked again once this one is done
            self.counters.inc("repeated_frames")
            return [Send((sender,), wire.encode(Ack(frame.number, "duplicate")))]
        return self._start_own(sender, frame)

    def _decided_here(self, url: str) -> bool:
        """A set a peer routed here holds ``url``: it will be admitted here whatever the
        map says now (a routed set is never routed on)."""
        holder = self.sets.get(self.claims.get(url, 0))
        return holder is not None and holder.origin.startswith("net:")

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
        self._lookups[frame.number] = ForeignSetLookup(rec)
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
        answer counts them, :meth:`_decided_here`). Routing it on under its number,
        which its origin still holds, lost it: the origin took it back as a duplicate."""
        if rec.stage in (Stage.LAN, Stage.HOME) and self.previous and not rec.routes:
            moved = self._moved_in(rec)
            if moved:
                return self._advance(rec, Step.TO_PREVIOUS_HOMES, moved)
        if rec.stage is Stage.CHECK:  # every previous home has answered: what is left is new
            rec.routes = {}
        for network in [n for n in rec.routes if str(Peer(n)) not in rec.awaiting]:
            del rec.routes[network]
        routed = {url for urls in rec.routes.values() for url in urls}
        routed_in = rec.origin.startswith("net:")
        here: list[str] = []
        away: dict[int, list[str]] = {}
        for url in rec.frame.URL_set:
            if url in routed:
                continue
            home = self.homes.home_of(url)
            if home == self.config.network or routed_in:
                here.append(url)
            else:
                away.setdefault(home, []).append(url)
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
                if self.claims.get(url) == rec.number:
                    del self.claims[url]
            self.counters.inc("urls_admitted", amount=len(here))
            actions += [Admit(rec.number, tuple(here)), *self._assign(rec.number, here)]
        if before is Stage.LAN:
            actions.append(Drop(LOCAL_REDUCE_POOL, rec.number))
        if before is not Stage.HOME:
            rec.attempts = 1
        rec.routes.update(away)
        rec.awaiting = {str(Peer(n)) for n in rec.routes}
        self.counters.inc("urls_routed", amount=sum(map(len, away.values())))
        log.debug("set %d: %d URLs admitted here, %d for their home networks %s", rec.number, len(here),
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

    def _check_previous(self, rec: SetRecord, before: Stage, moved: dict[int, list[str]]) -> list[Action]:
        """Sites that moved here: each earlier home is asked (flag=2, answered from its
        record as §10's foreign sets are) whether it admitted their URLs before the map
        changed. It admits none of them now — its map homes them here, and a peer on
        another map is refused — so its answer is final. The set waits in
        ``dist_reduce_pool`` for the answers, as for a home."""
        rec.routes, rec.attempts = moved, 1
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
        if not any(self.homes.home_of(url) != network for network, urls in rec.routes.items() for url in urls):
            return self._queue_routes(rec, rec.routes)
        log.warning("set %d: routed under an earlier map; routed again by the current one", rec.number)
        self.counters.inc("sets_rerouted")
        rec.routes, rec.awaiting, rec.answered = {}, set(), set()
        return self._route(rec)

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

