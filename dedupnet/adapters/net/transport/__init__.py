"""trio transport: dedupnet messages framed on TCP streams, a listener and a reconnecting client.

By job: :mod:`.handshake` (sans I/O: who may register as what, and the compression
both ends use), :mod:`.connection` (framing, the queue, the writer), :mod:`.server`
(accept, per-source limits, TLS accept), :mod:`.client` (connect, reconnect),
:mod:`.options` (the limits and deadlines, one object) and :mod:`.keys` (key files
re-read). Callers import from here.

This is the I/O adapter around the sans-I/O codec in :mod:`dedupnet.codec.wire`: it reads bytes
from a :class:`trio.SocketStream`, feeds them to a :class:`~dedupnet.codec.wire.Decoder` and
hands out messages; it takes bytes already encoded with :func:`~dedupnet.codec.wire.encode` and
writes them out. It knows nothing of the protocol's decisions beyond the handshake.

Why it is shaped this way
-------------------------

* **A stalled peer never blocks anyone else.** Every connection has a bounded outgoing
  queue (a trio memory channel, ``max_queue`` messages) drained by its own writer task.
  :meth:`Connection.send_nowait` never waits: a center broadcasting one encoded frame to
  every host calls it per peer, and a peer whose queue is full is closed (and counted)
  instead of holding up the broadcast. :meth:`Connection.send` waits for room, but at most
  ``send_timeout`` seconds; the writer's own ``send_all`` has the same deadline.
* **Bad input costs one connection, never the daemon.** A :class:`~dedupnet.codec.errors.ProtocolError`
  from the decoder is logged once, counted under its reason, answered with an
  :class:`~dedupnet.codec.messages.Error` (best effort, short deadline) and the connection is
  closed; the stream cannot be resynchronised anyway (see :mod:`dedupnet.codec.wire`).
  A message that decodes but then raises where the daemon handles it (its reactor) is
  handed back with :meth:`Connection.fail` and raised from that connection's receive:
  the handler's catch-all (``handler_error`` / ``session_error``, logged with the
  traceback) is the one place an exception caused by a peer lands, and it closes that
  connection only.
* **The sender is the connection, not the frame.** A connection starts with a
  :class:`~dedupnet.codec.messages.Register`; with ``verify_source`` (the default) the server
  accepts it only if its ``IP`` is the TCP peer address, so everything arriving later on
  that connection is attributed to an address the kernel vouches for (paper gap 2,
  docs/PROTOCOL.md). Clients therefore bind their source address to their own IP
  (``local_ip``); on Linux any 127.x.y.z can be bound, which is how one machine hosts a
  whole simulated system.
* **Heartbeats never queue behind data.** :meth:`Connection.send_urgent` puts a message
  in a one-slot priority lane that the writer takes before the next queued message
  (after finishing the one it is writing: messages are never interleaved); a newer
  urgent message replaces an unsent one. The daemons send their heartbeats this way, so
  a busy connection does not make its peer think it is dead.
* **Compression is negotiated, never assumed.** :func:`connect` offers
  ``deflate-stream`` and ``zstd`` in its Register (``compress=True``, the default);
  :func:`serve` answers such a Register with a :class:`~dedupnet.codec.messages.Welcome`
  naming the one it chooses, which the client's :meth:`Connection.receive` consumes.
  ``deflate-stream``: the server's bytes after its Welcome, and the client's after its
  own Welcome (written just before its next message), are one deflate stream, every
  write flushed (docs/PROTOCOL.md section 5). ``zstd`` (an older peer): both
  directions send bodies of at least ``wire.COMPRESS_MIN_BODY`` bytes compressed. A peer that offers nothing (an
  older one, or ``compress=False``) gets no Welcome and only plain bodies. Callers
  always hand the connection one encoded form (plain, or ``encode(..., compress=True)``)
  and the connection converts it for its peer, once per encoded object, so a broadcast
  is compressed once however many peers it goes to.
* **Frames can be authenticated** (:mod:`dedupnet.codec.auth`). A connection
  with a :class:`~dedupnet.codec.auth.Keyring` tags every message it sends with the keyring's
  sending key (after compression: the tag covers the body as sent; once per encoded
  object and key, so a broadcast is still signed once) and its decoder rejects any
  message without a valid tag of an accepted key *before* the body is decompressed
  or parsed (``bad_input{reason="bad-tag"}``, connection closed). A server is given a
  keyring per role (``keyrings``: a center's hosts and control clients use the LAN
  key, its peer centers the peer key): the Register must verify under one of them and
  its role must be one whose keyring verified it; from then on the connection uses
  that keyring only. A role without a keyring is served as before (untagged).
* **Limits against abuse**. ``max_connections_per_source`` caps the
  connections one source address may hold open (one more is closed at once, counted
  ``handshake_failed{reason="too-many"}``); the handshake deadline bounds a client
  that trickles its Register (slowloris) however slowly it sends; and each connection
  may have token buckets on the bytes and the messages it receives
  (``max_bytes_per_s``, ``max_messages_per_s``, each with a burst). A connection over
  its rate is *throttled*, not closed: its reader stops reading until the bucket has
  refilled (counted ``throttled{what}``), so TCP flow control slows the sender down and
  a flood costs the daemon at most the configured rate. Throttling rather than closing
  because a legitimate burst (a host catching up after a reconnect) must only be
  delayed, never dropped; a peer that sends garbage is closed by the decoder anyway.
* **A flood of connections cannot flood the log.** Every line a server writes about a
  connection (refused, aborted, bad input, registered) goes through one
  :class:`~dedupnet.adapters.net.ratelimit.LogLimiter` per listener: a budget per source
  address and one for all together; what is over it is counted (``log_suppressed``)
  and the next line about that source says how many were left out.
* **Every wait has a deadline**: connect, handshake, each send, the writer's
  ``send_all``, the best-effort error and the flush on close. The one exception is
  :meth:`Connection.receive`, which waits as long as its caller wants (pass ``timeout=``
  or wrap it; the daemons' heartbeat deadline is that bound).

Running a connection
--------------------

A :class:`Connection` is an async context manager: entering it starts its writer task in
an internal nursery; leaving it closes the connection (flushing the queue for up to
``close_timeout`` seconds if the block ended normally, at once if it raised). Exceptions
from the block propagate unchanged (not wrapped in an ExceptionGroup)::

    async with await connect("127.0.0.1", 7000, register, local_ip="127.0.0.5",
                             counters=counters) as conn:
        conn.send_nowait(encode(frame))
        msg = await conn.receive()

:func:`serve` enters the connection for its handler, and :func:`connect_forever` for its
``on_connected`` session; their callbacks get a running connection. Only one task may
call :meth:`Connection.receive` at a time; any number may send.

Counters (in the :class:`~dedupnet.adapters.monitor.metrics.Counters` passed in)
---------------------------------------------------------------

=======================================  =======================================================
``frames_received{kind[,flag]}``         messages decoded; ``flag`` only for kind ``frame``
``received_bytes``                       bytes read from sockets
``frames_sent{kind}``, ``sent_bytes``    messages / bytes written (counted once written;
                                         bytes as sent, i.e. compressed where negotiated)
``compressed_sent``                      messages sent with a compressed body
``compressed_received``                  messages received with a compressed body
``urgent_replaced``                      an unsent urgent message replaced by a newer one
``bad_input{reason}``                    ProtocolError reasons (bad-magic, too-large,
                                         bad-compression, unexpected-welcome, ...)
``send_overflow``                        send_nowait found the queue full (peer closed)
``send_timeout``                         send / the writer waited past ``send_timeout``
``connections_accepted``                 server: TCP connections accepted
``handshake_failed{reason}``             server: timeout, not-register, bad-role,
                                         source-mismatch, closed, bad-input,
                                         too-many (max_connections_per_source)
``throttled{what}``                      a receive waited for a rate limit (``bytes``,
                                         ``messages``)
``key_reloads``, ``key_reload_failed``   :func:`watch_keyrings`: key files re-read
``handler_error``                        server: a handler raised (logged with traceback)
``connected``, ``connect_failed``        client: connections made / attempts failed
``handshake_failed{reason="tls"}``       TLS (dedupnet/adapters/net/tls.py): the TLS handshake failed (wrong
                                         CA, no client certificate, not TLS), or a plain
                                         connection for a role that must use TLS; both sides
``handshake_failed{reason="wrong-network"}``  the peer's certificate names another network
``tls_sent_bytes``, ``tls_received_bytes``  TCP bytes of TLS connections (records, handshakes)
``tls_payload_sent_bytes``               the part of ``sent_bytes`` that went inside TLS
``session_error``                        client: ``on_connected`` raised (logged)
``heartbeat_missed``                     client: the server was silent for ``silence_timeout``
                                         (connection given up, dialled again)
``log_suppressed``                       server: a line about a connection not logged, its
                                         source over its budget (dedupnet/adapters/net/ratelimit.py)
=======================================  =======================================================
"""

from dedupnet.adapters.net.ratelimit import TokenBucket

from .client import close_when_silent, connect, connect_forever
from .connection import Connection, ConnectionClosed, Handler
from .handshake import ClientHandshake, ServerHandshake
from .keys import watch_keyrings
from .options import Options
from .server import serve

__all__ = [
    "ClientHandshake",
    "ConnectionClosed",
    "Connection",
    "Handler",
    "Options",
    "ServerHandshake",
    "serve",
    "connect",
    "connect_forever",
    "close_when_silent",
    "TokenBucket",
    "watch_keyrings",
]
# _recode and _signed are imported here for the tests that check a broadcast is
# converted and signed once.
