"""A center's members and its tasks: who is connected, the LAN hosts it knows (and the
highest sequence of each one's sets), admitted URLs handed to them as tasks
(``task_URL`` -> ``task_pool``), each host's ledger, and the work that moves when a host
leaves or stays away. A part of the
center's sans-I/O core (:class:`~center_host.protocol.CenterProtocol`) that owns this
state and knows nothing of sets."""

from __future__ import annotations

import ipaddress
import logging

from dedupnet.codec import wire
from dedupnet.codec.counters import Counters
from dedupnet.codec.messages import Ack, Done, Task
from dedupnet.codec.numbers import MAX_SEQUENCE, split_number

from .config import CenterConfig
from .events import (Action, CancelTimer, DropTask, ForgetHost, ForgetMoved, Host, Member, NoteHost, NoteMoved,
                     NoteSequence, Peer, Reassign, Reoffer, Resume, SaveTask, Send, SetTimer, Unledger, member_from_str)
from .ledger import Ledgers
from .sets import canonical_urls, owner_of, task_key, task_parts

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
    """Who is connected, the LAN hosts known, and the tasks handed out to them."""

    def __init__(self, config: CenterConfig, counters: Counters) -> None:
        self.config = config
        self.counters = counters
        self.wait = config.partition_policy == "wait"
        self.hosts: set[str] = set()  # live LAN members
        self.peers: set[int] = set()  # connected peer networks
        #: Every LAN host that has joined and neither left gracefully nor been reassigned
        #: (durable: NoteHost), with its status address: the ones not live are down.
        self.known: dict[str, str] = {}
        self.tasks: dict[str, list[str]] = {}  # unacknowledged task assignments
        #: Host IP -> the URLs given to it that it has not reported finished (durable:
        #: Ledger/Unledger; docs/PROTOCOL.md section 12).
        self.ledger = Ledgers()
        #: Hosts re-issued while away -> the URLs that moved from them (durable: NoteMoved),
        #: sent to each when it is back, to drop; and the re-issue timers of hosts away.
        self.moved: dict[str, set[str]] = {}
        self.reissue_timers: dict[int, str] = {}
        #: What moved, as sent to a host that is back: number -> the URLs of that message.
        self.moved_out: dict[str, dict[int, tuple[str, ...]]] = {}
        #: Host IP -> the highest sequence of its sets stored here (durable: NoteSequence).
        self.sequences: dict[str, int] = {}

    def live(self, member: str) -> bool:
        m = member_from_str(member)
        return m.ip in self.hosts if isinstance(m, Host) else m.network in self.peers

    def waited_for(self, member: str) -> bool:
        """Not a LAN host that has left, nor a peer network no longer configured."""
        m = member_from_str(member)
        return m.ip in self.hosts if isinstance(m, Host) else m.network in self.config.peers

    def join(self, member: Member) -> None:
        if isinstance(member, Peer):
            self.peers.add(member.network)
        else:
            self.hosts.add(member.ip)

    def leave(self, member: Member) -> None:
        if isinstance(member, Host):
            self.hosts.discard(member.ip)
        else:
            self.peers.discard(member.network)

    def reused(self, sender: Host, number: int) -> list[Action]:
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

    def note_sequence(self, sender: Member, number: int) -> list[Action]:
        """A set of ``sender``'s is stored: its sequence, if the highest yet."""
        if not isinstance(sender, Host):
            return []
        sequence = split_number(number)[2]
        if sequence <= self.sequences.get(sender.ip, 0):
            return []
        self.sequences[sender.ip] = sequence
        return [NoteSequence(sender.ip, sequence)]

    def host_joined(self, member: Host, address: str) -> list[Action]:
        """A LAN host (back): its re-issue is off, it drops what moved while it was away,
        and it is sent again the tasks it has not acknowledged; then what was admitted
        while no host was there is handed out (and sent) as usual."""
        asks: list[Action] = []
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
        resend: list[Action] = [Send((member,), wire.encode(Task(task_parts(k)[0], tuple(urls))))
                                for k, urls in self.tasks.items() if task_parts(k)[1] == member.ip]
        return asks + resend + self._reassign("")

    def host_left(self, ip: str) -> list[Action]:
        actions: list[Action] = []
        if not self.wait:
            # "admit": a host that left is not waited for, its unacknowledged tasks move.
            # Under "wait" they stay its own and go to it again when it is back
            # (host_joined): a lost connection is not a lost host, and a task whose ack was
            # lost with the connection may already be in its task_pool, being crawled;
            # handing it to another host would fetch it twice. Only a graceful leave
            # (handed_back) moves a host's tasks.
            actions += self._reassign(ip)
        if ip in self.known:
            actions += self._await_return(ip)
        return actions

    def _await_return(self, ip: str) -> list[Action]:
        """A LAN host is away: if it is not back within ``reissue_after``, its work moves."""
        if self.config.reissue_after <= 0:
            return []
        self.reissue_timers[reissue_timer(ip)] = ip
        return [SetTimer(reissue_timer(ip), self.config.reissue_after)]

    def reissue(self, timer: int) -> list[Action]:
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

    def _note_moved(self, ip: str, urls: set[str]) -> list[Action]:
        if not urls:
            return []
        self.moved.setdefault(ip, set()).update(urls)
        return [NoteMoved(ip, tuple(sorted(urls)))]

    # -- task_URL -> task_pool (gap 8) -------------------------------------------------
    def assign(self, number: int, urls: list[str]) -> list[Action]:
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
            actions += [SaveTask(key, tuple(self.tasks[key])), *self.ledger.give(host, batch),
                        Send((Host(host),), wire.encode(Task(number, tuple(self.tasks[key]))))]
        return actions

    def _reassign(self, gone: str) -> list[Action]:
        actions: list[Action] = []
        for key in [k for k in self.tasks if task_parts(k)[1] == gone]:
            urls = self.tasks.pop(key)
            actions.append(DropTask(key))
            if gone:
                actions += self.ledger.take(gone, urls)
            actions += self.assign(task_parts(key)[0], urls)
            if gone:
                self.counters.inc("tasks_reassigned", amount=len(urls))
        return actions

    def _move_ledger(self, gone: str, number: int | None, urls: list[str]) -> list[Action]:
        """A host that is gone (it left, or the operator says so): its ``task_URL`` entries,
        ``urls`` (what it handed back, or the operator took from its store) and every other
        URL still on its ledger (fetched and not yet reported, or lost with its disk) go to
        the live hosts, by site: a site moves whole. What it had fetched and not reported
        is fetched again: at least once, never lost."""
        actions = self._reassign(gone)
        rest = sorted(self.ledger.get(gone, ()))
        actions += self.ledger.take(gone, rest)
        moved = list(dict.fromkeys([*urls, *rest]))
        self.counters.inc("ledger_moved", amount=len(rest))
        for i in range(0, len(moved), MAX_MESSAGE_URLS):  # each task within what a host takes
            actions += self.assign(number if i == 0 and number is not None else self._spare_number(),
                                    moved[i:i + MAX_MESSAGE_URLS])
        return actions

    def _spare_number(self) -> int:
        """A task number of :data:`SPARE_NUMBERS` that no assignment waiting for its ack has."""
        taken = {n for n in (task_parts(k)[0] for k in self.tasks) if n in SPARE_NUMBERS}
        n = max(taken, default=SPARE_NUMBERS.start - 1) + 1
        if n not in SPARE_NUMBERS:
            n = next(m for m in SPARE_NUMBERS if m not in taken)
        return n

    def tasks_done(self, sender: Host, done: Done) -> list[Action]:
        """A host's report: these tasks of its own are finished, off its ledger (stored
        before the ack lets it drop the report). URLs not on its ledger (moved meanwhile)
        change nothing."""
        urls = list(canonical_urls(self.counters, sender, done.number, dict.fromkeys(done.URLs, 0)))
        off = self.ledger.take(sender.ip, urls)
        hit = sum(len(a.urls) for a in off if isinstance(a, Unledger))
        self.counters.inc("tasks_reported", amount=hit)
        if hit < len(urls):
            self.counters.inc("reports_unknown", amount=len(urls) - hit)
        return [*off, Send((sender,), wire.encode(Ack(done.number, "stored")))]

    def handed_back(self, sender: Host, task: Task) -> list[Action]:
        """A host that leaves for good hands its uncrawled tasks back: it is no longer
        a member, its tasks go to the others (stored before the ack lets it drop them)."""
        self.hosts.discard(sender.ip)
        urls = list(canonical_urls(self.counters, sender, task.number, dict.fromkeys(task.URLs, 0)))
        actions = self._move_ledger(sender.ip, task.number, urls) + self._forget(sender.ip)
        self.counters.inc("tasks_handed_back", amount=len(task.URLs))
        log.info("%s leaves and hands back %d tasks", sender, len(task.URLs))
        return actions + [Send((sender,), wire.encode(Ack(task.number, "stored")))]

    def _forget(self, host: str) -> list[Action]:
        return [ForgetHost(host)] if self.known.pop(host, None) is not None else []

    def operator_reassign(self, event: Reassign) -> list[Action]:
        """``dedupnet reassign``: the operator's word that a host is gone, so its work
        moves as a graceful leave's would (:meth:`handed_back`). Refused while the host
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
        urls = list(canonical_urls(self.counters, Host(ip), event.number, dict.fromkeys(event.urls, 0)))
        unfinished = len(self.ledger.get(ip, ()))
        moving = self._held_by(ip) | set(urls)
        actions = self._move_ledger(ip, event.number, urls) + self._forget(ip) + self._note_moved(ip, moving)
        self.counters.inc("tasks_reassigned", amount=len(urls))
        where = ", ".join(sorted(self.hosts)) or "no live host yet (kept for the first that joins)"
        log.warning("operator: host %s is gone; %d tasks of task_URL, %d of its task_pool and %d more of its "
                    "ledger (unfinished) go to %s", ip, held, len(urls), unfinished, where)
        return actions + [Send(reply, wire.encode(Ack(event.number, "stored")))]

    def task_acked(self, sender: Host, number: int) -> list[Action]:
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

    def reoffer(self, event: Reoffer) -> list[Action]:
        actions: list[Action] = []
        for number, urls in sorted(event.tasks.items()):
            key = task_key(number, event.host)
            self.tasks[key] = list(dict.fromkeys([*self.tasks.get(key, []), *urls]))
            actions += [SaveTask(key, tuple(self.tasks[key])), *self.ledger.give(event.host, urls)]
            if event.host in self.hosts:
                actions.append(Send((Host(event.host),), wire.encode(Task(number, tuple(self.tasks[key])))))
        self.counters.inc("tasks_reoffered", amount=sum(len(u) for u in event.tasks.values()))
        return actions

    # -- restart (durability) ----------------------------------------------------------
    def resume(self, event: Resume) -> list[Action]:
        """The stored tasks, sequences, ledgers and known hosts; each known host is away until it
        joins again."""
        self.tasks.update({k: list(v) for k, v in event.tasks.items()})
        self.sequences.update(event.sequences)
        self.known.update(event.hosts)
        self.ledger.restore(event.ledger)
        self.moved.update({host: set(urls) for host, urls in event.moved.items() if urls})
        actions: list[Action] = []
        for ip in self.known:
            actions += self._await_return(ip)
        return actions
