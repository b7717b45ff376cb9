"""Counters and gauges the daemons share, and a tiny HTTP endpoint: ``/metrics`` for
scraping, and any further routes a daemon adds (the status page, dedupnet/adapters/status_page.py).

Why not ``prometheus_client``: what the daemons need is small — named counters with string
labels, a few gauges, a snapshot the simulation harness can put in its JSON report, and
the Prometheus text format for an operator's monitoring system. This module is that and
nothing more. Measured (``bench/compare_metrics.py``, docs/DECISIONS.md "Hand-written or a
library"): the library cannot give one metric two label sets, as our call sites do; its
scrape of a daemon's ~40 series is 4-5× slower and its import 33-46 ms against 4-8.

Naming: a series is ``name`` plus labels, e.g. ``inc("frames_received", kind="frame",
flag="1")``. :meth:`Counters.snapshot` keys it as ``frames_received{kind="frame",flag="1"}``
(labels in the order of the first ``inc``; the order of keyword arguments in later calls
does not matter). :meth:`Counters.render_prometheus` exposes counters the way Prometheus
expects them, with the prefix and a ``_total`` suffix: ``dedupnet_frames_received_total``,
each family with the ``# HELP`` text declared for it in dedupnet/adapters/metric_catalog.py.

Counters may be incremented from worker threads (the Redis store runs in
``trio.to_thread``), so updates take a lock; it is uncontended in the common case.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Awaitable, Callable, Mapping

import trio

from dedupnet.adapters.listen import open_listeners
from dedupnet.adapters.metric_catalog import METRICS, exposed_name

__all__ = ["Counters", "serve_http", "serve_metrics", "CONTENT_TYPE", "Route"]

log = logging.getLogger("dedupnet.adapters.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the Prometheus text exposition format 0.0.4."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_Key = tuple[str, tuple[tuple[str, str], ...]]  # (name, sorted labels): identity of a series


def _escape(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    """Help text as the text format wants it: backslash and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


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
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        items = tuple((k, str(v)) for k, v in labels.items())
        for k, _ in items:
            if not _LABEL.fullmatch(k) or k.startswith("__"):
                raise ValueError(f"invalid label name {k!r} for metric {name!r}")
        key = (name, tuple(sorted(items)))
        if key not in self._display:
            self._display[key] = items
        return key

    def _series(self, key: _Key) -> str:
        return key[0] + _labels_text(self._display[key])

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

    # -- exposition --

    def render_prometheus(self, prefix: str = "dedupnet_") -> str:
        """All series in the Prometheus text exposition format 0.0.4.

        Counters are named ``<prefix><name>_total`` (the Prometheus convention for
        counters) and gauges ``<prefix><name>``; each metric has its ``# HELP`` (from
        dedupnet/adapters/metric_catalog.py) and ``# TYPE`` lines before its samples.
        """
        with self._lock:
            counters = sorted(self._counters.items())
            gauges = sorted(self._gauges.items())
            display = dict(self._display)
        lines: list[str] = []
        for kind, series in (("counter", counters), ("gauge", gauges)):
            current = None
            for key, value in series:
                name = exposed_name(key[0], kind, prefix)
                if name != current:
                    declared = METRICS.get(key[0])
                    text = declared.help if declared is not None else "not declared in dedupnet/adapters/metric_catalog.py"
                    lines.append(f"# HELP {name} {_escape_help(text)}")
                    lines.append(f"# TYPE {name} {kind}")
                    current = name
                lines.append(f"{name}{_labels_text(display[key])} {_number(value)}")
        return "\n".join(lines) + "\n" if lines else ""


# --- the HTTP endpoint: /metrics and the daemon's other routes -----------------------------

_HEAD_LIMIT = 8 * 1024
_HEAD_TIMEOUT = 5.0
_ROUTE_TIMEOUT = 5.0
_SEND_TIMEOUT = 5.0
_LINGER_TIMEOUT = 1.0
_LINGER_BYTES = 64 * 1024

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}  # fmt: skip

#: A route answers ``GET``/``HEAD`` of one path: ``(content type, body[, extra headers])``.
Route = Callable[[], Awaitable[tuple]]


def _response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              head_only: bool = False, headers: Mapping[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if head_only else head + body


async def _read_head(stream: trio.abc.Stream) -> bytes | None:
    """The request head (up to the blank line), or None if it exceeds 8 KiB. Never reads
    more than the limit plus one byte, so a client cannot make us buffer more."""
    head = bytearray()
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        if len(head) > _HEAD_LIMIT:
            return None
        chunk = await stream.receive_some(_HEAD_LIMIT + 1 - len(head))
        if not chunk:
            break  # client closed early: answer what we have (likely 400)
        head += chunk
    if len(head) > _HEAD_LIMIT:
        return None
    return bytes(head)


async def _route(routes: Mapping[bytes, Route], method: bytes, target: bytes) -> bytes:
    """The response to one parsed request. A route that fails or takes longer than 5 s is
    answered 500 / 503 (and logged), never left hanging."""
    route = routes.get(target) if method in (b"GET", b"HEAD") else None
    if route is None:
        paths = ", ".join(p.decode() for p in routes)
        return _response(404, f"not found; try GET {paths}\n".encode())
    result = None
    with trio.move_on_after(_ROUTE_TIMEOUT):
        try:
            result = await route()
        except Exception:  # noqa: BLE001 - one failing page must not take the endpoint down
            log.exception("HTTP %s failed", target.decode("ascii", "replace"))
            return _response(500, b"internal error; see the daemon's log\n")
    if result is None:
        log.warning("HTTP %s took longer than %.0f s; answered 503", target.decode("ascii", "replace"), _ROUTE_TIMEOUT)
        return _response(503, b"not ready in time; try again\n")
    content_type, body, *headers = result
    return _response(200, body, content_type, head_only=method == b"HEAD", headers=headers[0] if headers else None)


async def _answer(counters: Counters, routes: Mapping[bytes, Route], stream: trio.SocketStream) -> None:
    """Answer one HTTP request on ``stream``, then close it (no keep-alive). Every answer
    but 200 is counted: ``http_errors{status}``."""
    try:
        response = request = None
        with trio.move_on_after(_HEAD_TIMEOUT):
            head = await _read_head(stream)
            if head is None:
                response = _response(431, b"request head too large\n")
            else:
                parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
                if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
                    response = _response(400, b"bad request\n")
                else:
                    request = parts[0], parts[1].split(b"?", 1)[0]
        if request is not None:  # outside the head's deadline: the route has its own
            response = await _route(routes, *request)
        elif response is None:
            response = _response(408, b"request head not received in time\n")
        if not response.startswith(b"HTTP/1.1 200 "):
            counters.inc("http_errors", status=response[9:12].decode("ascii"))
        with trio.move_on_after(_SEND_TIMEOUT):
            await stream.send_all(response)
            # Closing with unread input would reset the connection, and the client could
            # lose the response: shut down our side, then discard what it still sends.
            await stream.send_eof()
            with trio.move_on_after(_LINGER_TIMEOUT):
                drained = 0
                while drained < _LINGER_BYTES and (chunk := await stream.receive_some(_HEAD_LIMIT)):
                    drained += len(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the scraper went away; nothing to do
    except Exception:  # never let one request take the endpoint down
        log.exception("HTTP request failed")
    finally:
        await trio.aclose_forcefully(stream)


async def serve_http(
    counters: Counters,
    host: str | None,
    port: int,
    routes: Mapping[str, Route] | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` (Prometheus text format) and ``routes`` on ``host:port``
    until cancelled.

    A deliberately minimal HTTP/1.1 responder: one request per connection, the request
    head must arrive within 5 s and fit in 8 KiB (else 408 / 431), ``GET`` or ``HEAD``
    of a known path gives 200 (a route gets 5 s: else 503), any other request 404, then
    the connection is closed. ``port`` 0 picks a free port; the bound port is reported
    through ``task_status`` (``port = await nursery.start(serve_http, counters, host, 0)``).
    """

    async def metrics() -> tuple[str, bytes]:
        return CONTENT_TYPE, counters.render_prometheus().encode("utf-8")

    table = {b"/metrics": metrics, **{path.encode("ascii"): route for path, route in (routes or {}).items()}}
    listeners = await open_listeners(host, port, "--http")
    bound = listeners[0].socket.getsockname()[1]
    log.info("HTTP on http://%s:%d/ (%s)", host or "*", bound, ", ".join(p.decode() for p in table))
    task_status.started(bound)
    await trio.serve_listeners(lambda stream: _answer(counters, table, stream), listeners)


async def serve_metrics(
    counters: Counters,
    host: str | None,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` alone (:func:`serve_http` without further routes)."""
    await serve_http(counters, host, port, task_status=task_status)
