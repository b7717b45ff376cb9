"""A center's members and its tasks: timers (re-sends, giving up), members joining and
leaving, admitted URLs handed to the LAN's hosts as tasks (``task_URL`` -> ``task_pool``)
and moved when a host leaves, and the pick-up after a restart. Part of the center's
sans-I/O core (:class:`~center_host.protocol.CenterProtocol`)."""

from __future__ import annotations

import ipaddress
import logging

from dedupnet.codec import wire
from dedupnet.codec.messages import Ack, Done, Task

from .events import (Action, CancelTimer, DropTask, ForgetHost, ForgetMoved, Host, Ledger, Member, NoteHost, NoteMoved,
                     Peer, Reassign, Reoffer, Resume, SaveTask, Send, SetTimer, Unledger, member_from_str)
from .sets import ROUTED, SetRecord, Stage, owner_of, task_key, task_parts

log = logging.getLogger("dedupnet.center")

#: Numbers below 2**32 are never a set's (a host's sequence starts at 1, section 7): a
#: center's ``done`` messages to a host back after its tasks moved (what to drop) are
#: numbered from ``MOVED_NUMBER`` up, the tasks a move makes beyond a host's own number
#: from ``SPARE_NUMBERS``, each a range of its own, so no ack is taken for another's.
MOVED_NUMBER = 1
SPARE_NUMBERS = range(1 << 31, 1 << 32)
#: URLs per task or ``done`` a move sends: half the receiver's default ``max_urls``.
MAX_MESSAGE_URLS = 5000


def reissue_timer(ip: str) -> int:
    """The timer of host ``ip``'s re-issue: negative, apart from every set's number."""
    return -1 - int(ipaddress.ip_address(ip))


class Membership:
    """The timer, membership and task methods of :class:`~center_host.protocol.CenterProtocol`
    (its state is declared there)."""

    def _timer(self, number: int) -> list[Action]:
        if number < 0:
            return self._reissue(number)
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
        sent = self._send_to(rec, live)  # a set whose URLs wait in another's frame to a home sends nothing
        if sent:
            self.counters.inc("resends", stage=rec.stage.value)
            log.info("set %d: no answer yet from %s; asking again (attempt %d)", rec.number, ", ".join(sorted(live)), rec.attempts)
        return [*sent, SetTimer(rec.number, self._resend_delay(rec))]

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
        if self.reissue_timers.pop(reissue_timer(member.ip), None) is not None:
            asks.append(CancelTimer(reissue_timer(member.ip)))
        if self.moved.get(member.ip):  # what moved while it was away: it drops those first
            moved = sorted(self.moved[member.ip])
            out = self.moved_out[member.ip] = {MOVED_NUMBER + i // MAX_MESSAGE_URLS: tuple(moved[i:i + MAX_MESSAGE_URLS])
                                               for i in range(0, len(moved), MAX_MESSAGE_URLS)}
            asks += [Send((member,), wire.encode(Done(n, urls))) for n, urls in out.items()]
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
        if isinstance(member, Host) and member.ip in self.known:
            actions += self._await_return(member.ip)
        return actions

    def _await_return(self, ip: str) -> list[Action]:
        """A LAN host is away: if it is not back within ``reissue_after``, its work moves."""
        if self.config.reissue_after <= 0:
            return []
        self.reissue_timers[reissue_timer(ip)] = ip
        return [SetTimer(reissue_timer(ip), self.config.reissue_after)]

    def _reissue(self, timer: int) -> list[Action]:
        """A host silent for ``reissue_after``: as ``dedupnet reassign`` would, its ledger
        and its ``task_URL`` go to the live hosts, whole sites at a time, and it is no
        longer one of the LAN's hosts; what moved is kept to tell it when it is back."""
        ip = self.reissue_timers.pop(timer, None)
        if ip is None or ip in self.hosts:
            return []
        moving = self._held_by(ip)
        actions = self._move_ledger(ip, None, []) + self._forget(ip) + self._note_moved(ip, moving)
        self.counters.inc("hosts_reissued")
        self.counters.inc("tasks_reissued", amount=len(moving))
        where = ", ".join(sorted(self.hosts)) or "no live host yet (kept for the first that joins)"
        log.warning("host %s silent for %g s (reissue_after): its %d unfinished tasks go to %s", ip,
                    self.config.reissue_after, len(moving), where)
        return actions

    def _held_by(self, ip: str) -> set[str]:
        """What moves when ``ip``'s work moves: its ledger and its ``task_URL``."""
        return set(self.ledger.get(ip, ())) | {u for k, urls in self.tasks.items() if task_parts(k)[1] == ip
                                               for u in urls}

    def _note_moved(self, ip: str, urls) -> list[Action]:
        if not urls:
            return []
        self.moved.setdefault(ip, set()).update(urls)
        return [NoteMoved(ip, tuple(sorted(urls)))]

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
            self.ledger.setdefault(host, set()).update(batch)
            actions += [SaveTask(key, tuple(self.tasks[key])), Ledger(host, tuple(batch)),
                        Send((Host(host),), wire.encode(Task(number, tuple(self.tasks[key]))))]
        return actions

    def _reassign(self, gone: str) -> list[Action]:
        actions: list[Action] = []
        for key in [k for k in self.tasks if task_parts(k)[1] == gone]:
            urls = self.tasks.pop(key)
            actions.append(DropTask(key))
            if gone:
                actions += self._unledger(gone, urls)
            actions += self._assign(task_parts(key)[0], urls)
            if gone:
                self.counters.inc("tasks_reassigned", amount=len(urls))
        return actions

    def _unledger(self, host: str, urls) -> list[Action]:
        """``urls`` leave ``host``'s ledger (those on it)."""
        held = self.ledger.get(host)
        if not held:
            return []
        gone = tuple(u for u in dict.fromkeys(urls) if u in held)
        held.difference_update(gone)
        if not held:
            del self.ledger[host]
        return [Unledger(host, gone)] if gone else []

    def _move_ledger(self, gone: str, number: int | None, urls: list[str]) -> list[Action]:
        """A host that is gone (it left, or the operator says so): its ``task_URL`` entries,
        ``urls`` (what it handed back, or the operator took from its store) and every other
        URL still on its ledger (fetched and not yet reported, or lost with its disk) go to
        the live hosts, by site: a site moves whole. What it had fetched and not reported
        is fetched again: at least once, never lost."""
        actions = self._reassign(gone)
        rest = sorted(self.ledger.get(gone, ()))
        actions += self._unledger(gone, rest)
        moved = list(dict.fromkeys([*urls, *rest]))
        self.counters.inc("ledger_moved", amount=len(rest))
        for i in range(0, len(moved), MAX_MESSAGE_URLS):  # each task within what a host takes
            actions += self._assign(number if i == 0 and number is not None else self._spare_number(),
                                    moved[i:i + MAX_MESSAGE_URLS])
        return actions

    def _spare_number(self) -> int:
        """A task number of :data:`SPARE_NUMBERS` that no assignment waiting for its ack has."""
        taken = {n for n in (task_parts(k)[0] for k in self.tasks) if n in SPARE_NUMBERS}
        n = max(taken, default=SPARE_NUMBERS.start - 1) + 1
        if n not in SPARE_NUMBERS:
            n = next(m for m in SPARE_NUMBERS if m not in taken)
        return n

    def _tasks_done(self, sender: Host, done: Done) -> list[Action]:
        """A host's report: these tasks of its own are finished, off its ledger (stored
        before the ack lets it drop the report). URLs not on its ledger (moved meanwhile)
        change nothing."""
        urls = list(self._canonical_urls(sender, done.number, dict.fromkeys(done.URLs, 0)))
        actions = self._unledger(sender.ip, urls)
        hit = len(actions[0].urls) if actions else 0
        self.counters.inc("tasks_reported", amount=hit)
        if hit < len(urls):
            self.counters.inc("reports_unknown", amount=len(urls) - hit)
        return actions + [Send((sender,), wire.encode(Ack(done.number, "stored")))]

    def _handed_back(self, sender: Host, task: Task) -> list[Action]:
        """A host that leaves for good hands its uncrawled tasks back: it is no longer
        a member, its tasks go to the others (stored before the ack lets it drop them)."""
        self.hosts.discard(sender.ip)
        urls = list(self._canonical_urls(sender, task.number, dict.fromkeys(task.URLs, 0)))
        actions = self._move_ledger(sender.ip, task.number, urls) + self._forget(sender.ip)
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
        if ip not in self.known and not held and not event.urls and not self.ledger.get(ip):
            return refused("unknown-host", "this center has no such host and holds nothing for it")
        urls = list(self._canonical_urls(Host(ip), event.number, dict.fromkeys(event.urls, 0)))
        unfinished = len(self.ledger.get(ip, ()))
        moving = self._held_by(ip) | set(urls)
        actions = self._move_ledger(ip, event.number, urls) + self._forget(ip) + self._note_moved(ip, moving)
        self.counters.inc("tasks_reassigned", amount=len(urls))
        where = ", ".join(sorted(self.hosts)) or "no live host yet (kept for the first that joins)"
        log.warning("operator: host %s is gone; %d tasks of task_URL, %d of its task_pool and %d more of its "
                    "ledger (unfinished) go to %s", ip, held, len(urls), unfinished, where)
        return actions + [Send(reply, wire.encode(Ack(event.number, "stored")))]

    def _task_acked(self, sender: Host, number: int) -> list[Action]:
        dropped = self.moved_out.get(sender.ip, {}).pop(number, None)
        if dropped is not None:  # it has dropped these of what moved from it
            held = self.moved.get(sender.ip, set())
            held.difference_update(dropped)
            if not held:
                self.moved.pop(sender.ip, None)
            return [ForgetMoved(sender.ip, dropped)]
        key = task_key(number, sender.ip)
        if self.tasks.pop(key, None) is None:
            self.counters.inc("repeated_acks")
            return []
        return [DropTask(key)]

    def _reoffer(self, event: Reoffer) -> list[Action]:
        actions: list[Action] = []
        for number, urls in sorted(event.tasks.items()):
            key = task_key(number, event.host)
            self.tasks[key] = list(dict.fromkeys([*self.tasks.get(key, []), *urls]))
            self.ledger.setdefault(event.host, set()).update(urls)
            actions += [SaveTask(key, tuple(self.tasks[key])), Ledger(event.host, tuple(urls))]
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
                actions += self._reroute_stale(rec)
            actions.append(SetTimer(rec.number, self.config.resume_grace))
        self.tasks.update({k: list(v) for k, v in event.tasks.items()})
        self.sequences.update(event.sequences)
        self.known.update(event.hosts)
        self.ledger.update({host: set(urls) for host, urls in event.ledger.items() if urls})
        self.moved.update({host: set(urls) for host, urls in event.moved.items() if urls})
        for ip in self.known:  # away until they join again
            actions += self._await_return(ip)
        log.debug("resumed %d sets and %d task assignments", len(event.sets), len(event.tasks))
        return actions

