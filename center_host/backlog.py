"""The counts a center's back-pressure reads on every frame: the sets held per stage,
the URLs routed to home networks and not taken yet, and the frames held back per
host. Kept as running counts, changed where a set enters or leaves ``Stages.sets``,
changes stage (``Stages._advance``) or has its routes changed, and where a frame is
held back or goes on: counted by a scan, they cost every event time in proportion to
the backlog, the sets waiting for a home network that is slow or down. A part of
:class:`~center_host.stages.Stages`, which owns it; :meth:`Backlog.check` recounts by
scan, for the tests and the simulator to call after every event."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .events import Host
from .sets import SetRecord, Stage


def _size(routes: Mapping[int, list[str]]) -> int:
    return sum(map(len, routes.values()))


class Backlog:
    """Running counts of what ``Stages`` holds; every set that enters or leaves
    ``Stages.sets``, and every change to a held set's stage or routes, goes through
    here, so the counts follow the sets."""

    def __init__(self) -> None:
        #: Sets in ``Stages.sets``, per stage.
        self.by_stage: dict[Stage, int] = dict.fromkeys(Stage, 0)
        #: URLs in the routes of the sets in ``Stages.sets``, all home networks together.
        self.routed = 0
        #: Frames in ``Stages.waiting``, per host that sent them (no entry: none).
        self.held: dict[Host, int] = {}

    def own_in_flight(self) -> int:
        """Own sets in a stage that asks others (``Stages.own_in_flight``)."""
        return self.by_stage[Stage.LAN] + self.by_stage[Stage.DIST]

    # -- the sets held -----------------------------------------------------------------
    def enter(self, sets: dict[int, SetRecord], rec: SetRecord) -> None:
        """``rec`` enters ``sets`` (``Stages.sets``), replacing any record of its number."""
        old = sets.get(rec.number)
        if old is not None:
            self._left(old)
        sets[rec.number] = rec
        self.by_stage[rec.stage] += 1
        self.routed += _size(rec.routes)

    def leave(self, sets: dict[int, SetRecord], rec: SetRecord) -> None:
        """``rec`` leaves ``sets`` (``Stages.sets``)."""
        del sets[rec.number]
        self._left(rec)

    def _left(self, rec: SetRecord) -> None:
        self.by_stage[rec.stage] -= 1
        self.routed -= _size(rec.routes)

    def staged(self, before: Stage, after: Stage) -> None:
        """A held set went from stage ``before`` to ``after``."""
        self.by_stage[before] -= 1
        self.by_stage[after] += 1

    # -- a held set's routes -----------------------------------------------------------
    def set_routes(self, rec: SetRecord, routes: dict[int, list[str]]) -> None:
        self.routed += _size(routes) - _size(rec.routes)
        rec.routes = routes

    def add_routes(self, rec: SetRecord, routes: Mapping[int, list[str]]) -> None:
        """``rec.routes.update(routes)``."""
        for network, urls in routes.items():
            self.routed += len(urls) - len(rec.routes.get(network, ()))
            rec.routes[network] = urls

    def pop_route(self, rec: SetRecord, network: int) -> list[str]:
        """The URLs routed to ``network`` leave ``rec`` (none if it routes none there)."""
        urls = rec.routes.pop(network, [])
        self.routed -= len(urls)
        return urls

    def unroute(self, rec: SetRecord, url: str) -> None:
        """``url`` leaves every route of ``rec`` that holds it."""
        for urls in rec.routes.values():
            if url in urls:
                urls.remove(url)
                self.routed -= 1

    # -- frames held back --------------------------------------------------------------
    def hold(self, sender: Host) -> None:
        self.held[sender] = self.held.get(sender, 0) + 1

    def release(self, sender: Host) -> None:
        left = self.held[sender] - 1
        if left:
            self.held[sender] = left
        else:
            del self.held[sender]

    # -- the check ---------------------------------------------------------------------
    def check(self, sets: Mapping[int, SetRecord], waiting: Iterable[tuple[Host, object]]) -> None:
        """Recount by scan and raise AssertionError if a running count differs (for
        tests and the simulator: it costs what the counts save)."""
        by_stage = dict.fromkeys(Stage, 0)
        for rec in sets.values():
            by_stage[rec.stage] += 1
        held: dict[Host, int] = {}
        for sender, _ in waiting:
            held[sender] = held.get(sender, 0) + 1
        routed = sum(_size(rec.routes) for rec in sets.values())
        if (by_stage, routed, held) != (self.by_stage, self.routed, self.held):
            raise AssertionError(f"backlog counts drifted: counted {self.by_stage}, {self.routed} routed, held "
                                 f"{self.held}; by scan {by_stage}, {routed} routed, held {held}")
