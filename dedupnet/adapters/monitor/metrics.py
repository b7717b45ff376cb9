"""Counters and gauges the daemons share, and a tiny HTTP endpoint: ``/metrics`` for
scraping, and any further routes a daemon adds (the status page, dedupnet/adapters/monitor/status_page.py).

Why not ``prometheus_client``: what the daemons need is small — named counters with string
labels, a few gauges, a snapshot the simulation harness can put in its JSON report, and
the Prometheus text format for an operator's monitoring system. This module is that and
nothing more. Measured (``bench/compare_metrics.py``, docs/DECISIONS.md "Hand-written or a
library"): the library cannot give one metric two label sets, as our call sites do; its
scrape of a daemon's ~40 series is 4-5× slower and its import 33-46 ms against 4-8.

The registry itself is :class:`~dedupnet.codec.counters.Counters` (pure, so the sans-I/O
cores count with it; re-exported here). :func:`render_prometheus` exposes its counters the
way Prometheus expects them, with the prefix and a ``_total`` suffix:
``dedupnet_frames_received_total``, each family with the ``# HELP`` text declared for it in
dedupnet/adapters/monitor/metric_catalog.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping

import trio

from dedupnet.adapters.net.listen import open_listeners
from dedupnet.adapters.monitor.metric_catalog import METRICS, exposed_name
from dedupnet.codec.counters import Counters, labels_text

__all__ = ["Counters", "render_prometheus", "serve_http", "serve_metrics", "CONTENT_TYPE", "Route"]

log = logging.getLogger("dedupnet.adapters.monitor.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the Prometheus text exposition format 0.0.4."""


def _escape_help(text: str) -> str:
    """Help text as the text format wants it: backslash and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


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


def render_prometheus(counters: Counters, prefix: str = "dedupnet_") -> str:
    """All series in the Prometheus text exposition format 0.0.4.

    Counters are named ``<prefix><name>_total`` (the Prometheus convention for
    counters) and gauges ``<prefix><name>``; each metric has its ``# HELP`` (from
    dedupnet/adapters/monitor/metric_catalog.py) and ``# TYPE`` lines before its samples.
    """
    counters_, gauges, display = counters.series()
    lines: list[str] = []
    for kind, series in (("counter", counters_), ("gauge", gauges)):
        current = None
        for key, value in series:
            name = exposed_name(key[0], kind, prefix)
            if name != current:
                declared = METRICS.get(key[0])
                text = declared.help if declared is not None else "not declared in dedupnet/adapters/monitor/metric_catalog.py"
                lines.append(f"# HELP {name} {_escape_help(text)}")
                lines.append(f"# TYPE {name} {kind}")
                current = name
            lines.append(f"{name}{labels_text(display[key])} {_number(value)}")
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
        return CONTENT_TYPE, render_prometheus(counters).encode("utf-8")

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
