"""A local host's side of the protocol as a pure state machine (paper §2.2, §2.3).

Events in, actions out; no sockets, no trio, no Redis. The host

* de-dups what its crawler found (§2.2) and sends each ``URL_set`` with flag=1,
  keeping it in ``URL_pool`` until the center acknowledges the frame (gap 7). What it
  is given goes at once while nothing of this host's awaits the center's ack, and
  otherwise gathers until the ack comes back or a set is full (:meth:`HostProtocol.
  _may_go`: Nagle's rule, group commit);
* answers the center's flag=2 requests (§2.3), except its own (its ``IP``);
* takes the tasks the center assigns into ``task_pool``, acknowledging them.

As at the center, the adapter answers a :class:`Lookup` with :class:`LookupDone`
before feeding any other event. Each look-up is for one :data:`Pending` thing (a batch
found, the center's request, a task, a set to number again); its token starts with
that thing's ``KIND``, which tells the adapter whether ``task_pool`` is asked too.

What arrives from the center, and the method that takes it::

    flag=2 (a look-up)       _from_center -> Lookup -> _answer_request (flag=3 back)
    flag=1, flag=3           refused (a host sends those, the center does not)
    Ack                      _from_center (release), or _rejected (renumber or keep)
    Task                     _from_center -> Lookup -> _take_task
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Union

import numpy as np

from dedupnet.codec import wire
from dedupnet.codec.counters import Counters
from dedupnet.codec.messages import FLAG_ANSWER, FLAG_LOOKUP, FLAG_NEW_SET, Ack, Done, Frame, Task, normalize_ip
from dedupnet.codec.numbers import MAX_SEQUENCE, make_number
from dedupnet.codec.settings import default_of
from dedupnet.codec.urls import canonical_set, fingerprint_many

from .local_dedup import local_reduce

log = logging.getLogger("dedupnet.local")

#: The highest sequence a center may tell this host to number from: a real host is far
#: below it (2^30 sets is 10^12 URLs at the default set size), and one at the top of
#: the space would leave the host no number for its next set.
MAX_RENUMBER = MAX_SEQUENCE // 2
#: Sets' worth of found URLs the core is given at most at once (what it holds goes as
#: soon as it fills one set; a bigger batch goes as several).
HELD_SETS = 4


# -- events -----------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """Entries ``(id, url)`` taken from ``URL_pool`` (normalised URLs): held by the core
    until they may go (:meth:`HostProtocol._may_go`)."""

    entries: list[tuple[bytes, str]]


@dataclass(frozen=True)
class FromCenter:
    message: object


@dataclass(frozen=True)
class Connected:
    """The connection to the center is (re-)established."""


@dataclass(frozen=True)
class LookupDone:
    token: tuple[str, int]
    seen: list[bool]  # index-aligned with the Lookup's urls
    sequences: range = range(0)  # reserved numbers' sequences (for "found" look-ups)


@dataclass(frozen=True)
class Reoffer:
    """The center came back with a store behind what it had acknowledged: frames it had
    acknowledged (their bytes, from the adapter's log) go to it again, with their numbers;
    what it still holds it acknowledges as a repeat (docs/PROTOCOL.md section 7)."""

    frames: list[bytes]


@dataclass(frozen=True)
class Finished:
    """The first ``count`` entries of ``tasks_done`` (the finished tasks' URLs, written
    with ``finish_URL``): to report to the center (docs/PROTOCOL.md section 12)."""

    urls: tuple[str, ...]
    count: int


@dataclass(frozen=True)
class Resume:
    """After a restart: frames sent but never acknowledged, number -> (frame bytes, entry ids)."""

    unacked: dict[int, tuple[bytes, list[bytes]]]


# -- actions ----------------------------------------------------------------------
@dataclass(frozen=True)
class Send:
    data: bytes


@dataclass(frozen=True)
class Lookup:
    """Which ``urls`` this host has seen: ``finish_URL``, and in exact mode ``task_pool``.
    Also reserve ``sets`` sequence numbers, none below ``floor`` (the counter is raised
    to it first: the center has stored sets numbered below it)."""

    token: tuple[str, int]
    urls: tuple[str, ...]
    sets: int = 0
    floor: int = 0


@dataclass(frozen=True)
class SaveUnacked:
    number: int
    frame: bytes
    ids: tuple[bytes, ...]


@dataclass(frozen=True)
class Release:
    """The center holds ``number`` durably: its URLs leave ``URL_pool``. ``frame``: the
    frame it acknowledged (b"" for a renumbered one), kept in the adapter's re-offer log."""

    number: int
    ids: tuple[bytes, ...]
    frame: bytes = b""


@dataclass(frozen=True)
class Forget:
    """Entries that leave ``URL_pool`` here: crawled already, or repeated in the batch (§2.2 step 2)."""

    ids: tuple[bytes, ...]


@dataclass(frozen=True)
class AddTasks:
    """New tasks into ``task_pool``. ``number``: the task message's, which makes the write
    happen once however often it is sent (None: the caller's writes are idempotent)."""

    urls: tuple[str, ...]
    number: int | None = None


@dataclass(frozen=True)
class DropTasks:
    """These tasks moved to other hosts while this one was away (its center re-issued
    them): out of ``task_pool``, never crawled here (docs/PROTOCOL.md section 12)."""

    urls: tuple[str, ...]


@dataclass(frozen=True)
class TakeDone:
    """The first ``count`` entries of ``tasks_done`` are in report ``number`` now (stored
    unacknowledged)."""

    count: int
    number: int | None = None


Action = Union[Send, Lookup, SaveUnacked, Release, Forget, AddTasks, TakeDone, DropTasks]
#: Every event the core takes (:meth:`HostProtocol.handle`).
Event = Union[Found, FromCenter, Connected, LookupDone, Reoffer, Resume, Finished]


# -- what a look-up is for (``KIND``: the first part of its token) --------------------
@dataclass(frozen=True)
class FoundBatch:
    """A batch from ``URL_pool``: local de-dup (§2.2)."""

    KIND: ClassVar[str] = "found"
    entries: list[tuple[bytes, str]]


@dataclass(frozen=True)
class Request:
    """The center's flag=2 request (§2.3), its URLs checked."""

    KIND: ClassVar[str] = "answer"
    frame: Frame


@dataclass(frozen=True)
class OfferedTask:
    """A task from the center, its URLs checked: ``task_pool`` is looked up too."""

    KIND: ClassVar[str] = "task"
    task: Task


@dataclass(frozen=True)
class Renumbering:
    """A set the center refused as numbered before: a new number only."""

    KIND: ClassVar[str] = "renumber"
    number: int


@dataclass(frozen=True)
class Reporting:
    """Finished tasks to report: a number only."""

    KIND: ClassVar[str] = "report"
    urls: tuple[str, ...]
    count: int


Pending = Union[FoundBatch, Request, OfferedTask, Renumbering, Reporting]


@dataclass(frozen=True)
class HostConfig:
    ip: str
    network: int
    host_id: int
    set_size: int = default_of("set_size")
    mode: str = default_of("mode")
    #: Frames in flight before the host stops taking from URL_pool (back-pressure).
    max_unacked: int = 64


@dataclass
class HostProtocol:
    config: HostConfig
    counters: Counters = field(default_factory=Counters)
    unacked: dict[int, tuple[bytes, list[bytes]]] = field(default_factory=dict)
    _pending: dict[tuple[str, int], Pending] = field(default_factory=dict)
    #: What ``Found`` gave that has not gone to a look-up yet (it stays pending in
    #: ``URL_pool``: a restart de-dups it again).
    held: list[tuple[bytes, str]] = field(default_factory=list)
    #: Unacknowledged messages the center refused on this connection: kept for the next
    #: one, and not awaited on this one.
    _refused: set[int] = field(default_factory=set)
    _batches: int = 0
    _reports: int = 0

    def __post_init__(self) -> None:
        self.ip = normalize_ip(self.config.ip)

    @property
    def can_take(self) -> bool:
        return len(self.unacked) < self.config.max_unacked

    @property
    def room(self) -> int:
        """Entries the core takes now: a few sets' worth held at most."""
        return HELD_SETS * self.config.set_size - len(self.held)

    @property
    def in_flight(self) -> bool:
        """A message of this host's awaits the center's ack on this connection."""
        return any(number not in self._refused for number in self.unacked)

    def handle(self, event: Event) -> list[Action]:
        actions = self._handle(event)
        if self.held and self._may_go():
            actions += self._go()
        return actions

    def _may_go(self) -> bool:
        """Nagle's rule (group commit): what is held goes when nothing of this host's is in
        flight to its center, else once it fills a set. An idle system admits in one round
        trip, and sets fill as far as the acks take longer (a center's cost is mostly per
        set), with no timer to tune. The adapter answers the look-up this starts before
        it feeds another event, and the sets it makes are in flight."""
        return not self.in_flight or len(self.held) >= self.config.set_size

    def _handle(self, event: Event) -> list[Action]:
        match event:
            case Found(entries):
                self.held += entries
                return []
            case LookupDone():
                return self._lookup_done(event)
            case FromCenter(message):
                return self._from_center(message)
            case Connected():
                # Gap 7: whatever the center has not acknowledged is sent again (it de-dups by number).
                self.counters.inc("frames_resent", amount=len(self.unacked))
                self._refused.clear()
                return [Send(data) for data, _ in self.unacked.values()]
            case Resume(unacked):
                self.unacked.update(unacked)
                return []
            case Reoffer(frames):
                return self._reoffer(frames)
            case Finished(urls, count):
                self._reports += 1
                token = (Reporting.KIND, self._reports)
                self._pending[token] = Reporting(urls, count)
                return [Lookup(token, (), sets=1)]
        raise TypeError(f"not a host event: {event!r}")

    # -- §2.2 --------------------------------------------------------------------------
    def _go(self) -> list[Action]:
        entries, self.held = self.held, []
        self._batches += 1
        token = (FoundBatch.KIND, self._batches)
        self._pending[token] = FoundBatch(entries)
        urls = tuple(u for _, u in entries)
        return [Lookup(token, urls, sets=-(-len(urls) // self.config.set_size))]

    def _reduce(self, entries: list[tuple[bytes, str]], done: LookupDone) -> list[Action]:
        urls = [u for _, u in entries]
        ids = [i for i, _ in entries]
        result = local_reduce(urls, fingerprint_many(urls), np.asarray(done.seen, dtype=bool), self.config.set_size)
        gone = result.crawled + result.repeated
        actions: list[Action] = [Forget(tuple(ids[i] for i in gone))] if gone else []
        self.counters.inc("urls_dropped", stage="host", amount=len(gone))
        index = {u: i for i, u in reversed(list(enumerate(urls)))}
        for seq, url_set in zip(done.sequences, result.url_sets):
            number = make_number(self.config.network, self.config.host_id, seq)
            data = wire.encode(Frame(url_set, self.ip, number, FLAG_NEW_SET))
            set_ids = tuple(ids[index[u]] for u in url_set)
            self.unacked[number] = (data, list(set_ids))
            self.counters.inc("sets_sent")
            log.debug("set %d: %d URLs to the center", number, len(url_set))
            actions += [SaveUnacked(number, data, set_ids), Send(data)]
        return actions

    # -- messages from the center ------------------------------------------------------
    def _from_center(self, message: object) -> list[Action]:
        if isinstance(message, Frame):
            if message.flag != FLAG_LOOKUP:
                self.counters.inc("rejected", reason="unexpected-flag")
                log.warning("rejected unexpected-flag: flag=%d number %d from the center", message.flag, message.number)
                return []
            if message.IP == self.ip:
                # §2.3: the host made this frame; it does not answer its own request.
                self.counters.inc("own_requests_dropped")
                return []
            token = (Request.KIND, message.number)
            urls = self._canonical(message.number, message.URL_set)
            self._pending[token] = Request(Frame(urls, message.IP, message.number, message.flag))
            return [Lookup(token, tuple(urls))]
        if isinstance(message, Ack):
            if message.status == "rejected":
                return self._rejected(message)
            entry = self.unacked.pop(message.number, None)
            self._refused.discard(message.number)
            if entry is None:
                self.counters.inc("repeated_acks")
                return []
            return [Release(message.number, tuple(entry[1]), entry[0])]
        if isinstance(message, Done):  # what moved from this host while it was away
            moved = tuple(self._canonical(message.number, dict.fromkeys(message.URLs, 0)))
            self.counters.inc("tasks_dropped_moved", amount=len(moved))
            log.warning("the center moved %d of this host's tasks to other hosts while it was away: dropped here",
                        len(moved))
            return [DropTasks(moved), Send(wire.encode(Ack(message.number, "stored")))]
        if isinstance(message, Task):
            token = (OfferedTask.KIND, message.number)
            offered = tuple(self._canonical(message.number, dict.fromkeys(message.URLs, 0)))
            self._pending[token] = OfferedTask(Task(message.number, offered))
            return [Lookup(token, offered)]
        self.counters.inc("rejected", reason="unexpected-message")
        log.warning("rejected unexpected-message: %s from the center", type(message).__name__)
        return []

    def _reoffer(self, frames: list[bytes]) -> list[Action]:
        """Acknowledged frames go back to the center as unacknowledged ones, stored first;
        their URL_pool entries are gone already (no ids)."""
        actions: list[Action] = []
        for data in frames:
            stored = wire.decode_one(data)
            if not isinstance(stored, (Frame, Done)):
                raise TypeError(f"an unacknowledged message that is not a set or a report: {type(stored).__name__}")
            number = stored.number
            if number in self.unacked:
                continue
            self.unacked[number] = (data, [])
            actions += [SaveUnacked(number, data, ()), Send(data)]
        self.counters.inc("sets_reoffered", amount=len(actions) // 2)
        return actions

    def _canonical(self, number: int, url_set: dict[str, int]) -> dict[str, int]:
        """What the center sends is checked as a center checks what a host sends
        (docs/PROTOCOL.md §8): only URLs a pool may hold, in their one spelling."""
        urls, bad = canonical_set(url_set)
        if bad:
            self.counters.inc("bad_input", reason="bad-url", amount=bad)
            log.warning("message %d from the center: %d URLs dropped (not http(s) URLs a pool may hold)", number, bad)
        return urls

    def _rejected(self, ack: Ack) -> list[Action]:
        """The center would not take a set. Its URLs stay in ``URL_pool`` either way: a set
        whose number the center has seen with other URLs (this host's store, and its
        sequence, were lost) is numbered again from the sequence the center names; any
        other refusal keeps the set for the next connection and says why."""
        if ack.number not in self.unacked:
            self.counters.inc("repeated_acks")
            return []
        if ack.reason == "number-reused" and ack.sequence and ack.sequence <= MAX_RENUMBER:
            self.counters.inc("sets_renumbered")
            token = (Renumbering.KIND, ack.number)
            self._pending[token] = Renumbering(ack.number)
            return [Lookup(token, (), sets=1, floor=ack.sequence)]
        self._refused.add(ack.number)
        self.counters.inc("sets_rejected", reason=ack.reason or "unknown")
        log.error("set %d refused by the center (%s); kept, and sent again on the next connection",
                  ack.number, ack.reason or "no reason given")
        return []

    def _renumber(self, old: int, done: LookupDone) -> list[Action]:
        entry = self.unacked.pop(old, None)
        if entry is None:  # acknowledged meanwhile
            return []
        data, ids = entry
        frame = wire.decode_one(data, max_urls=max(len(ids), 1))
        if not isinstance(frame, Frame):
            raise TypeError(f"set {old}: stored as a {type(frame).__name__}, not a frame")
        number = make_number(self.config.network, self.config.host_id, done.sequences[0])
        data = wire.encode(Frame(frame.URL_set, frame.IP, number, frame.flag))
        self.unacked[number] = (data, ids)
        log.warning("set %d: number used before this host's store was lost; sent again as %d", old, number)
        return [SaveUnacked(number, data, tuple(ids)), Release(old, ()), Send(data)]

    def _lookup_done(self, done: LookupDone) -> list[Action]:
        match self._pending.pop(done.token):
            case FoundBatch(entries):
                return self._reduce(entries, done)
            case Renumbering(number):
                return self._renumber(number, done)
            case Request(frame):
                return self._answer_request(frame, done)
            case OfferedTask(task):
                return self._take_task(task, done)
            case Reporting(urls, count):
                return self._report(urls, count, done)
        raise TypeError(f"no look-up is pending for {done.token!r}")

    def _report(self, urls: tuple[str, ...], count: int, done: LookupDone) -> list[Action]:
        """Finished tasks become a report kept as an unacknowledged message (sent again on
        every connection until the center's ack), in the write that takes them out of
        ``tasks_done``: a report is never lost, and never made twice."""
        number = make_number(self.config.network, self.config.host_id, done.sequences[0])
        data = wire.encode(Done(number, urls))
        self.unacked[number] = (data, [])
        self.counters.inc("tasks_reported", amount=len(urls))
        return [SaveUnacked(number, data, ()), TakeDone(count, number), Send(data)]

    def _answer_request(self, frame: Frame, done: LookupDone) -> list[Action]:
        """§2.3: seen URLs get value 1, then flag=3 back to the center."""
        answer = {u: int(s) for u, s in zip(frame.URL_set, done.seen)}
        self.counters.inc("answers_sent")
        return [Send(wire.encode(Frame(answer, frame.IP, frame.number, FLAG_ANSWER)))]

    def _take_task(self, task: Task, done: LookupDone) -> list[Action]:
        """What this host has seen already is not queued twice."""
        new = tuple(dict.fromkeys(u for u, s in zip(task.URLs, done.seen) if not s))
        self.counters.inc("tasks_received", amount=len(new))
        return [AddTasks(new, task.number), Send(wire.encode(Ack(task.number, "stored")))]

