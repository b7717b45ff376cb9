"""The stages of the paper at a center (§2.3, §2.4): a LAN host's set asked of the LAN
and of the peer networks, another network's set asked of the LAN and answered, and the
end of a stage, where the table of center_host/sets.py takes a set on. Part of the
center's sans-I/O core (:class:`~center_host.protocol.CenterProtocol`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dedupnet.codec import wire
from dedupnet.codec.messages import FLAG_ANSWER, FLAG_LOOKUP, FLAG_NEW_SET, Ack, Frame
from dedupnet.codec.numbers import split_number
from dedupnet.codec.pools import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL
from dedupnet.codec.urls import set_digest

from .events import (Action, CancelTimer, Conclude, Admit, Drop, Host, LookupDone, Lookup, Member, NoteSequence,
                     Peer, Save, Send, SetTimer, member_from_str)
from .sets import (MAX_HELD_PER_HOST, POOL_OF, RECENTLY_CONCLUDED, ROUTED,
                   ForeignSetLookup, OwnSetLookup, Rejected, SetRecord, Stage, Step, remember)

log = logging.getLogger("dedupnet.center")


class Stages:
    """The stages' methods of :class:`~center_host.protocol.CenterProtocol` (its state
    is declared there)."""

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
        self._lookups[frame.number] = OwnSetLookup(sender, frame)
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
            if self.exact and (admitted or self._claimed(url) or self._held_elsewhere_hit(url)):
                self.counters.inc("urls_dropped", stage="center-record")
                continue
            urls[url] = 0
            if self.exact:
                self.claims[url] = frame.number
        self.counters.inc("urls_in", stage="lan" if isinstance(sender, Host) else "routed", amount=len(frame.URL_set))
        ask = {h for h in self.hosts if str(sender) != h} if self.config.local_lookup == "lan" else set()
        rec = SetRecord(Frame(urls, frame.IP, frame.number, FLAG_LOOKUP), Stage.LAN, str(sender), ask, digest=digest)
        self.sets[frame.number] = rec
        log.debug("set %d from %s: %d URLs, %d after the center's record; asking %d hosts",
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
            log.debug("set %d from %s: %d URLs; answered from this center's records", frame.number, sender,
                     len(frame.URL_set))
            return self._stage_done(rec)
        log.debug("set %d from %s: %d URLs; asking %d hosts", frame.number, sender, len(frame.URL_set), len(rec.awaiting))
        return [Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._ask(rec)]

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
            return self._advance(rec, Step.GATHER if self.exact else Step.TO_PEERS)
        if rec.stage is Stage.FOREIGN:
            return self._advance(rec, Step.LOOK_UP if self.exact else Step.REPLY)
        return self._advance(rec, Step.ADMIT)

    def _look_up_foreign(self, rec: SetRecord, before: Stage) -> list[Action]:
        """Exact mode: the foreign set is answered from the admitted record (and the claims)."""
        self._lookups[rec.number] = ForeignSetLookup(rec)
        return [Lookup(rec.number, tuple(rec.frame.URL_set))]

    def _to_peers(self, rec: SetRecord, before: Stage) -> list[Action]:
        rec.awaiting, rec.answered, rec.attempts = self.peers_to_ask(), set(), 1
        log.debug("set %d: LAN de-dup done, %d URLs left; asking %d networks",
                 rec.number, len(rec.frame.URL_set), len(rec.awaiting))
        return [Drop(LOCAL_REDUCE_POOL, rec.number), Save(DIST_REDUCE_POOL, rec.number, rec.dump()), *self._ask(rec)]

    def _out_with_peers(self) -> bool:
        return any(r.stage is Stage.DIST for r in self.sets.values())

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
                del self.sets[m.number]
            head.gathered = tuple(sorted({*head.gathered, *(n for m in rest for n in (m.number, *m.gathered))}))
            for url in head.frame.URL_set:
                self.claims[url] = head.number
            self.counters.inc("sets_gathered", amount=len(rest))
            log.debug("set %d: gathered with %d more of this LAN's sets", head.number, len(rest))
        # Fewer sets in flight now: held-back frames may go on.
        return [*(Drop(LOCAL_REDUCE_POOL, m.number) for m in rest), *self._advance(head, Step.TO_PEERS), *self._start_waiting()]

    def peers_to_ask(self) -> set[str]:
        """Paper gap 4: under ``wait`` every configured peer network (those not connected
        are asked when they come back); under ``admit`` those connected at this moment."""
        return {str(Peer(n)) for n in (self.config.peers if self.wait else self.peers)}

    def _admit(self, rec: SetRecord, before: Stage) -> list[Action]:
        urls = list(rec.frame.URL_set)
        for url in urls:
            self.claims.pop(url, None)
        del self.sets[rec.number]
        for n in (rec.number, *rec.gathered):
            remember(self.recently_concluded, n, None, RECENTLY_CONCLUDED)
        self.counters.inc("urls_admitted", amount=len(urls))
        self.counters.inc("sets_concluded", complete=str(not rec.incomplete).lower())
        log.debug("set %d: admitted %d URLs%s", rec.number, len(urls), " (concluded incomplete)" if rec.incomplete else "")
        actions: list[Action] = [Admit(rec.number, tuple(urls)), Drop(POOL_OF[rec.stage], rec.number),
                                 Conclude(rec.number, not rec.incomplete, rec.digest),
                                 *(Conclude(n, not rec.incomplete) for n in rec.gathered)]
        actions += self._assign(rec.number, urls)
        if self.gathering and not self._out_with_peers():
            actions += self._send_gathered()  # R4: nothing of ours is out now
        return actions + self._start_waiting()

    def _reply_foreign(self, rec: SetRecord, before: Stage, found: LookupDone | None = None) -> list[Action]:
        """Answer another network (§2.4) and, in exact mode, apply the claim rule."""
        actions: list[Action] = []
        losers: set[int] = set()
        answer = rec.frame.URL_set
        if found is not None:
            for url, admitted in zip(list(answer), found.admitted):
                if answer[url]:
                    continue
                if self.homes is not None:
                    # A previous home says what it admitted or will admit (_checked_here): a
                    # set a peer routed here is decided here, never routed on, so its claims
                    # count; what an own set claims, it is routing to the asker, which
                    # decides it there.
                    answer[url] = int(admitted or self._decided_here(url))
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
        log.debug("set %d of %s: answered, %d of %d URLs seen here", rec.number, rec.origin,
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
        remember(self.held_elsewhere, url, number, self.config.held_elsewhere_max)

    def _held_elsewhere_hit(self, url: str) -> bool:
        """``url`` is in ``held_elsewhere``; a hit makes it the newest entry, so the URLs
        found again and again (a site's front page, linked from everywhere) stay while
        the cache turns over (least recently used out first)."""
        number = self.held_elsewhere.pop(url, None)
        if number is None:
            return False
        self.held_elsewhere[url] = number
        return True

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

