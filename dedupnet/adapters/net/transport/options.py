"""How connections behave: their limits, their deadlines and compression, in one object.

One frozen value rather than a keyword list per function: :func:`~.server.serve`,
:func:`~.client.connect`, :func:`~.client.connect_forever` and :class:`~.connection.Connection`
all read the same object, so a new limit is declared once, with its default, and reaches
every place that needs it without being handed on by name through each signature (httpx's
``Timeout``/``Limits`` are the model). The entry points still take the fields as keywords,
which they fold into the object with :meth:`Options.but`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dedupnet.codec.messages import MAX_URLS
from dedupnet.codec.wire import DEFAULT_MAX_FRAME_SIZE

__all__ = ["Options", "DEFAULT_MAX_QUEUE", "DEFAULT_SEND_TIMEOUT", "DEFAULT_CLOSE_TIMEOUT", "DEFAULT_ERROR_TIMEOUT"]

DEFAULT_MAX_QUEUE = 1024  # messages waiting for the writer, per connection
DEFAULT_SEND_TIMEOUT = 10.0
DEFAULT_CLOSE_TIMEOUT = 1.0  # flush on a normal close
DEFAULT_ERROR_TIMEOUT = 1.0  # best-effort Error message before closing


@dataclass(frozen=True)
class Options:
    """The tunables of a connection and of the server or client that makes it.

    Fields only one side reads say so; the other side ignores them.
    """

    #: Largest frame body and most URLs in one frame the decoder accepts.
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_urls: int = MAX_URLS
    #: Messages waiting for the writer; a peer that lets more pile up is closed.
    max_queue: int = DEFAULT_MAX_QUEUE
    #: Longest wait for room in the queue, and for the socket to take one message.
    send_timeout: float = DEFAULT_SEND_TIMEOUT
    #: Flush of the queue on a normal close.
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    #: The best-effort Error message before closing on bad input or a refused handshake.
    error_timeout: float = DEFAULT_ERROR_TIMEOUT
    #: Offer (client) or accept (server) compressed bodies.
    compress: bool = True
    #: Token buckets on what each connection is read at (None: no limit); a burst must
    #: hold one whole frame, and is raised to that if smaller.
    max_bytes_per_s: float | None = None
    burst_bytes: float | None = None
    max_messages_per_s: float | None = None
    burst_messages: float | None = None
    #: Client: the TCP connect, the TLS handshake and sending the Register, each.
    connect_timeout: float = 5.0
    #: Server: a client's TLS handshake and Register, together.
    handshake_timeout: float = 5.0
    #: Server: connections one source address may hold open (None: no limit).
    max_connections_per_source: int | None = None

    def but(self, **changes: object) -> Options:
        """These options with ``changes`` (keyword names as the fields'; an unknown
        name is a TypeError, as it was for a function's keywords)."""
        return dataclasses.replace(self, **changes) if changes else self


DEFAULT = Options()
