"""Counters and gauges the roles keep, as a plain registry: named series with string
labels, read as a snapshot (the simulation harness puts it in its JSON report). Pure, so
the sans-I/O cores count what they do; the Prometheus exposition and the HTTP endpoint
are dedupnet/adapters/monitor/metrics.py.

Naming: a series is ``name`` plus labels, e.g. ``inc("frames_received", kind="frame",
flag="1")``. :meth:`Counters.snapshot` keys it as ``frames_received{kind="frame",flag="1"}``
(labels in the order of the first ``inc``; the order of keyword arguments in later calls
does not matter).

Counters may be incremented from worker threads (the Redis store runs in
``trio.to_thread``), so updates take a lock; it is uncontended in the common case.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping

__all__ = ["Counters", "labels_text"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_Key = tuple[str, tuple[tuple[str, str], ...]]  # (name, sorted labels): identity of a series


def _escape(value: str) -> str:
    """A label value as Prometheus's text format wants it (a snapshot's keys are spelled
    the same way): backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    """``{k="v",...}``, or "" with no labels: one series' labels as a snapshot and the
    exposition both spell them."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


class Counters:
    """A registry of monotonically increasing counters and of gauges, keyed by name + labels.

    Label values are converted with ``str``; names must be valid Prometheus names (they
    are constants in the code, so an invalid one is a bug and raises ``ValueError``).
    Reading a series that was never incremented gives 0.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[_Key, int] = {}
        self._gauges: dict[_Key, float] = {}
        # Labels in the order first used, for display: a series keeps one spelling.
        self._display: dict[_Key, tuple[tuple[str, str], ...]] = {}

    # -- keys --

    def _key(self, name: str, labels: Mapping[str, object]) -> _Key:
        """A series' key; its names are checked the first time it is seen (a counter is
        incremented on every page and set: the check was most of an increment's cost)."""
        items = tuple((k, str(v)) for k, v in labels.items())
        key = (name, tuple(sorted(items)) if len(items) > 1 else items)
        if key not in self._display:
            if not _NAME.fullmatch(name):
                raise ValueError(f"invalid metric name {name!r}")
            for k, _ in items:
                if not _LABEL.fullmatch(k) or k.startswith("__"):
                    raise ValueError(f"invalid label name {k!r} for metric {name!r}")
            self._display[key] = items
        return key

    def _series(self, key: _Key) -> str:
        return key[0] + labels_text(self._display[key])

    # -- counters --

    def inc(self, name: str, amount: int = 1, **labels: object) -> None:
        """Add ``amount`` (>= 0) to the counter ``name`` with ``labels``."""
        if amount < 0:
            raise ValueError(f"counter {name!r} can only increase, got amount {amount}")
        with self._lock:
            key = self._key(name, labels)
            self._counters[key] = self._counters.get(key, 0) + amount

    def get(self, name: str, **labels: object) -> int:
        """The value of one series (0 if never incremented)."""
        key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
        with self._lock:
            return self._counters.get(key, 0)

    def total(self, name: str) -> int:
        """The sum of ``name`` over all its label values."""
        with self._lock:
            return sum(v for (n, _), v in self._counters.items() if n == name)

    def snapshot(self) -> dict[str, int]:
        """Every counter series as ``{'name{label="value",...}': value}`` (JSON-ready)."""
        with self._lock:
            return {self._series(key): value for key, value in sorted(self._counters.items())}

    # -- gauges --

    def set_gauge(self, name: str, value: float, **labels: object) -> None:
        """Set the gauge ``name`` with ``labels`` to ``value`` (a level, not a count)."""
        with self._lock:
            key = self._key(name, labels)
            self._gauges[key] = value

    def replace_gauges(self, names: set[str], series: list[tuple[str, Mapping[str, object], float]]) -> None:
        """Make ``series`` (``(name, labels, value)``) the only series of the gauges
        ``names``, in one step: a level read afresh drops the members, stages or pools
        that are gone instead of leaving their last value behind."""
        with self._lock:
            for key in [k for k in self._gauges if k[0] in names]:
                del self._gauges[key]
                self._display.pop(key, None)
            for name, labels, value in series:
                self._gauges[self._key(name, labels)] = value

    def get_gauge(self, name: str, **labels: object) -> float:
        """The value of one gauge series (0 if never set)."""
        key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
        with self._lock:
            return self._gauges.get(key, 0)

    def gauges(self) -> dict[str, float]:
        """Every gauge series, keyed like :meth:`snapshot`."""
        with self._lock:
            return {self._series(key): value for key, value in sorted(self._gauges.items())}

    def series(self) -> tuple[list[tuple[_Key, int]], list[tuple[_Key, float]], dict[_Key, tuple[tuple[str, str], ...]]]:
        """Counters, gauges (each sorted by key) and every key's display labels, taken in one
        step: what an exposition renders."""
        with self._lock:
            return sorted(self._counters.items()), sorted(self._gauges.items()), dict(self._display)
