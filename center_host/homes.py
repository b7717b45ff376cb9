"""One home per site at a center (docs/PROTOCOL.md §11): the map that says where a URL
is decided, the earlier maps still asked about, and the frames out with each home (a
few per home at a time). A part of the center's sans-I/O core
(:class:`~center_host.protocol.CenterProtocol`) that owns this state; the sets it reads
are the stages' (center_host/stages.py), passed in."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from dedupnet.codec import wire
from dedupnet.codec.homes import HomeMap
from dedupnet.codec.messages import FLAG_NEW_SET, Frame

from .config import CenterConfig
from .events import Action, Peer, Send
from .sets import SetRecord, Stage


class Homes:
    """The maps, and per home network the own sets whose URLs for it have not gone yet
    (oldest first) and the frames out with it now (each by its number, the lowest of
    its sets'). Up to ``routed_frames_out`` frames per home at a time, each carrying
    the waiting sets' URLs for it (as R4 gathers for the peers), a part-full one only
    when none is out: what a URL costs on the WAN does not grow with the number of
    sets, and a link that resets often still gets whole frames through. Not stored: a
    restarted center queues its stored routes again."""

    def __init__(self, config: CenterConfig) -> None:
        self.config = config
        self.map: HomeMap = config.home_map()
        self.previous: tuple[HomeMap, ...] = config.previous_maps()
        #: home network -> the numbers of the sets waiting for it, oldest first (an
        #: OrderedDict: taken from the front, see sets.remember)
        self.route_queue: dict[int, OrderedDict[int, None]] = {}
        #: home network -> {frame number: the numbers of its sets, lowest first}
        self.route_out: dict[int, dict[int, tuple[int, ...]]] = {}
        #: home network -> at least as many URLs as its queue holds (counted as sets are
        #: queued, made exact by each walk; routes only shrink in between): while a frame
        #: is out, fewer than ``gather_max`` cannot make a full one, and the queue is not
        #: walked again for every set that joins it. Were it ever low, a full frame would
        #: only wait for the frames out, as a part-full one does.
        self.queued_urls: dict[int, int] = {}

    def describe(self) -> str:
        """The map (and the earlier ones still asked about, after ``;``) as every peer
        must have it."""
        return ";".join(m.describe() for m in (self.map, *self.previous))

    def home_of(self, url: str) -> int:
        return self.map.home_of(url)

    def split(self, rec: SetRecord) -> tuple[list[str], dict[int, list[str]]]:
        """The URLs of ``rec`` not routed yet: those decided here (homed here, or all of
        a set a peer routed here: it is never routed on), and the others by home network."""
        routed = {url for urls in rec.routes.values() for url in urls}
        routed_in = rec.origin.startswith("net:")
        here: list[str] = []
        away: dict[int, list[str]] = {}
        for url in rec.frame.URL_set:
            if url in routed:
                continue
            home = self.map.home_of(url)
            if home == self.config.network or routed_in:
                here.append(url)
            else:
                away.setdefault(home, []).append(url)
        return here, away

    def moved_in(self, rec: SetRecord) -> dict[int, list[str]]:
        """URLs homed here whose site had another home under an earlier map, by that
        earlier home (a configured peer; a network no longer configured cannot be asked)."""
        moved: dict[int, list[str]] = {}
        here = self.config.network
        for url in rec.frame.URL_set:
            if self.map.home_of(url) != here:
                continue
            for network in {m.home_of(url) for m in self.previous} - {here}:
                if network in self.config.peers:
                    moved.setdefault(network, []).append(url)
        return moved

    def stale(self, rec: SetRecord) -> bool:
        """``rec`` routes a URL to a network that is not its home now (a map changed
        across a restart)."""
        return any(self.map.home_of(url) != network for network, urls in rec.routes.items() for url in urls)

    def heads(self, network: int, number: int) -> bool:
        """Set ``number`` names a frame out with ``network``."""
        return number in self.route_out.get(network, {})

    def frame_out(self, network: int, number: int) -> tuple[int, ...]:
        """The sets of the frame ``number`` out with ``network`` (none: no such frame)."""
        return self.route_out.get(network, {}).get(number, ())

    def frame_taken(self, network: int, number: int) -> None:
        """The home has acknowledged the frame ``number`` out with it."""
        del self.route_out[network][number]

    def queue(self, rec: SetRecord, networks: Iterable[int], sets: dict[int, SetRecord],
              peers: set[int]) -> list[Action]:
        for network in sorted(networks):
            self.route_queue.setdefault(network, OrderedDict())[rec.number] = None
            self.queued_urls[network] = self.queued_urls.get(network, 0) + len(rec.routes.get(network, ()))
        return [a for network in sorted(networks) for a in self.next_frame(network, sets, peers)]

    def next_frame(self, network: int, sets: dict[int, SetRecord], peers: set[int]) -> list[Action]:
        """While fewer than ``routed_frames_out`` are out with a connected home: the
        waiting sets' URLs for it, oldest sets first and up to ``gather_max`` (one set at
        least), become a frame out, under the lowest of their numbers. A part-full frame
        goes only when none is out (Nagle's rule): an idle home gets a URL in one round
        trip, a busy one full frames, up to the window. The home decides each as one set;
        a set whose number it has concluded with other URLs is decided anew, so its record
        keeps it exact whichever sets a frame holds (a restarted center may group them
        otherwise)."""
        if network not in peers:
            return []  # a home that is down is sent what it waits for when it is back
        out = self.route_out.setdefault(network, {})
        queue = self.route_queue.get(network, OrderedDict())
        actions: list[Action] = []
        while len(out) < self.config.routed_frames_out and queue:
            if out and self.queued_urls.get(network, 0) < self.config.gather_max:
                return actions  # surely part-full: it waits for the frames out (and gathers meanwhile)
            taken, members, size, full = self._gather(network, queue, sets)
            if out and not full:
                self.queued_urls[network] = size  # the whole queue was walked: its size is known
                return actions
            for number in taken:
                del queue[number]
            self.queued_urls[network] = max(0, self.queued_urls.get(network, 0) - size) if queue else 0
            if members:
                out[members[0]] = tuple(members)
                actions += self.send_frame(network, members[0], sets, peers)
        return actions

    def _gather(self, network: int, queue: OrderedDict[int, None],
                sets: dict[int, SetRecord]) -> tuple[list[int], list[int], int, bool]:
        """The next frame's sets from the front of ``queue`` (left in it): the numbers it
        takes (sets with nothing left for ``network`` among them), its members lowest
        first, its URLs, and whether it is full (the next set would pass ``gather_max``)."""
        taken: list[int] = []
        members: list[int] = []
        size = 0
        for number in queue:
            rec = sets.get(number)
            urls = rec.routes.get(network) if rec is not None and rec.stage is Stage.HOME else None
            if urls and members and size + len(urls) > self.config.gather_max:
                return taken, sorted(members), size, True
            taken.append(number)
            if urls:
                members.append(number)
                size += len(urls)
        return taken, sorted(members), size, size >= self.config.gather_max

    def send_frame(self, network: int, number: int, sets: dict[int, SetRecord], peers: set[int]) -> list[Action]:
        """The frame ``number`` out with a home, to it if it is connected (else when it is back)."""
        members = [sets[n] for n in self.frame_out(network, number) if n in sets]
        if not members or network not in peers:
            return []
        urls = {url: 0 for rec in members for url in rec.routes.get(network, ())}
        return [Send((Peer(network),), wire.encode(Frame(urls, members[0].frame.IP, number, FLAG_NEW_SET)))]
