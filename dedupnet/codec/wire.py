"""Wire format: messages framed on a byte stream, sans-I/O (in the style of h11).

No sockets, no trio, no Redis here: :func:`encode` turns a message into bytes, and a
:class:`Decoder` turns bytes received (in any chunking) back into messages. The trio
transport feeds it whatever ``receive_some`` returns and sends whatever ``encode`` made.

Every message is a fixed 16-byte header, a JSON body (orjson, UTF-8; zstd-compressed if
flag bit 0 says so) and an optional authentication tag::

    offset  size  field       value
    ------  ----  ----------  -----------------------------------------------------------
         0     2  magic       b"DN"
         2     1  version     1
         3     1  kind        messages.Kind: 1 frame, 2 register, 3 heartbeat, 4 ack,
                              5 task, 6 status, 7 error,
                              8 welcome, 9 done
         4     4  body_len    uint32, big-endian: bytes of body after the header (as sent:
                              compressed if FLAG_ZSTD)
         8     1  tag_len     bytes of authentication tag after the body: 0 (no key),
                              or 18 with a key (dedupnet/codec/auth.py: a 2-byte key id and
                              16 bytes of HMAC-SHA256). Not part of body_len.
         9     1  flags       bit 0 (FLAG_ZSTD): the body is one zstd frame that declares
                              its content size; bits 1-7 must be zero
        10     6  reserved    must be zero
        16     -  body        body_len bytes: a JSON object valid against
                              schemas/<kind>.schema.json (after decompression)
    16+body    -  tag         tag_len bytes (computed over header and body as sent):
                              key id (uint16) + HMAC-SHA256(secret, header+body)[:16]

All integers are big-endian (network order). A frame's total size is
``16 + body_len + tag_len``; the receiver's ``max_frame_size`` limits ``body_len``
(default 4 MiB) and is checked as soon as the header is complete, before any of the
body is buffered. It limits the decompressed body too: the zstd frame must declare its
content size, which is checked before decompressing (no zip bomb gets past it), and
zstd itself refuses a body that decompresses to more than it declared.

Compression is negotiated per connection (the transport's Register/Welcome exchange).
``zstd``: a :class:`Decoder` with ``allow_compressed=False`` rejects FLAG_ZSTD as
``bad-header``. ``deflate-stream``: from a point the transport names
(:meth:`Decoder.start_inflate`, after the Welcome that switches that direction) the
bytes of the connection, headers included, are one raw deflate stream (RFC 1951),
flushed after every write (:class:`Deflater`): a message costs only what is new in it
against the last 32 KiB of the connection, so the fixed part of a heartbeat, an ack or
a small frame (the 16-byte header, the field names, the sender's IP and number prefix)
all but vanishes. The inflater is driven a bounded step at a time, only while the
decoder needs bytes for the message it assembles, so a deflate "bomb" (at most 1032:1)
never puts more than one message plus :data:`INFLATE_STEP` bytes in memory.
Only bodies of at least :data:`COMPRESS_MIN_BODY` bytes are compressed, and only when
that makes them smaller. :func:`compressed` and :func:`uncompressed` convert encoded
bytes from one form to the other (the transport does it per peer).

Broadcast: encode a frame once and send the same bytes to every peer — :func:`encode`
is pure, its output can be shared by any number of sends.

Errors are :class:`~dedupnet.codec.errors.ProtocolError` with a ``reason`` label:

===============  ===============================================================
reason           cause
===============  ===============================================================
bad-magic        the stream does not start with b"DN" (checked byte by byte)
bad-version      version byte is not 1
bad-kind         kind byte is not a known :class:`~dedupnet.codec.messages.Kind`
bad-header       a reserved byte is not zero, an unknown flag bit is set, or FLAG_ZSTD
                 on a decoder that does not allow compressed bodies (not negotiated)
bad-tag          a decoder with a keyring: tag_len is not the keyring's (checked with
                 the header, before the body is buffered), or the tag names a key id
                 not accepted or does not verify (checked before the body is
                 decompressed or parsed)
too-large        body_len > max_frame_size, or a compressed body that declares (or
                 would decompress to) more than max_frame_size bytes
bad-compression  FLAG_ZSTD body that is not exactly one valid zstd frame declaring
                 its content size; a deflate stream that is not valid deflate, or
                 that ends (a final block: the stream lasts as long as the connection)
bad-json         body is not valid JSON (orjson)
schema           body is JSON but not a valid message of its kind
bad-flag         a frame's flag is not the integer 1, 2 or 3
bad-ip           an IP field is not an IPv4/IPv6 address
too-many-urls    more URLs in a set than the decoder's max_urls
truncated        :meth:`Decoder.eof` / :func:`decode_one` with an incomplete frame
trailing-data    :func:`decode_one` given bytes after one complete frame
===============  ===============================================================

A stream cannot be resynchronised after a bad header (there are no frame delimiters),
and a peer that sends an invalid body is broken, so after any error the
:class:`Decoder` is poisoned: every later call raises the same error. The owner must
count it (``error.reason``), optionally send an :class:`~dedupnet.codec.messages.Error`, and
close the connection.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Literal

import orjson
import zstandard

from dedupnet.codec.errors import ProtocolError
from dedupnet.codec.messages import MAX_URLS, Frame, Kind, Message, from_json

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "MAX_TAG",
    "MAX_BODY",
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ZSTD",
    "COMPRESS_MIN_BODY",
    "ZSTD_LEVEL",
    "NEED_DATA",
    "header",
    "pack",
    "encode",
    "encode_frame",
    "compressed",
    "uncompressed",
    "is_compressed",
    "Decoder",
    "decode_one",
]

MAGIC = b"DN"
VERSION = 1
HEADER = struct.Struct(">2sBBIBB6s")
HEADER_SIZE = HEADER.size  # 16
FLAGS_OFFSET = 9  # the flags byte (was the first of seven reserved bytes)
MAX_TAG = 255  # tag_len is one byte
MAX_BODY = 2**32 - 1  # body_len is a uint32
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024
FLAG_ZSTD = 0x01  # flags bit 0: the body is one zstd frame (declaring its content size)
KNOWN_FLAGS = FLAG_ZSTD
#: Bodies shorter than this are never compressed. Measured (bench/bench_wire.py): a
#: frame of 5 URLs (~270 bytes) already shrinks by half for ~3 us; below ~200 bytes
#: (heartbeats, acks, small tasks) zstd's frame overhead eats most of the gain.
COMPRESS_MIN_BODY = 256
#: zstd level: 3 (zstd's default) compresses URL sets 5-7x at ~60 ns per input byte;
#: level 1 is not measurably faster on these bodies and higher levels cost 2-4x the CPU.
ZSTD_LEVEL = 3
#: ``deflate-stream``: zlib's level (its default).
DEFLATE_LEVEL = 6
#: ``deflate-stream``: the inflater produces at most this many bytes per step.
INFLATE_STEP = 64 * 1024
_RESERVED = bytes(6)
_KINDS = {kind.value: kind for kind in Kind}
_LEN = struct.Struct(">IB")  # body_len, tag_len at offset 4 of a header

assert HEADER_SIZE == 16


class _Sentinel(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return self.value


NEED_DATA = _Sentinel.NEED_DATA
"""Returned by :meth:`Decoder.next_message` when no complete message is buffered."""


# --- encoding ---------------------------------------------------------------------------


def header(kind: Kind | int, body_len: int, tag_len: int = 0, flags: int = 0) -> bytes:
    """The 16-byte header for a body of ``body_len`` bytes and a tag of ``tag_len`` bytes.

    An authenticator computes its tag over ``header(kind, len(body), TAG_LEN) + body``.
    """
    if not 0 <= body_len <= MAX_BODY:
        raise ValueError(f"body of {body_len} bytes does not fit the header's uint32 length")
    if not 0 <= tag_len <= MAX_TAG:
        raise ValueError(f"tag of {tag_len} bytes is longer than {MAX_TAG}")
    if flags & ~KNOWN_FLAGS or flags < 0:
        raise ValueError(f"unknown header flags {flags:#x}")
    return HEADER.pack(MAGIC, VERSION, Kind(kind), body_len, tag_len, flags, _RESERVED)


def pack(kind: Kind | int, body: bytes, *, tag: bytes = b"", flags: int = 0) -> bytes:
    """Frame an already-encoded ``body`` of ``kind`` (no validation of the body).

    With ``flags=FLAG_ZSTD`` the body must already be compressed (see :func:`compressed`).
    """
    return b"".join((header(kind, len(body), len(tag), flags), body, tag))


_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)  # writes the content size (we require it)


def _zstd(body: bytes) -> bytes | None:
    """``body`` compressed, or None if it is too short to try or would not get smaller."""
    if len(body) < COMPRESS_MIN_BODY:
        return None
    out = _compressor.compress(body)
    return out if len(out) < len(body) else None


class Deflater:
    """One direction of a ``deflate-stream`` connection: every write is compressed
    against everything written before it (a 32 KiB window) and flushed at once
    (``Z_PARTIAL_FLUSH``: the receiver can inflate all of it now, for ~10 bits instead
    of a sync flush's 4-5 bytes), so nothing waits in the compressor."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)

    def compress(self, data: bytes) -> bytes:
        return self._z.compress(data) + self._z.flush(zlib.Z_PARTIAL_FLUSH)


def _pack_maybe_compressed(kind: int, body: bytes, tag: bytes, compress: bool) -> bytes:
    if compress and not tag:  # a tag covers the body as sent: compress before tagging, not here
        small = _zstd(body)
        if small is not None:
            return b"".join((HEADER.pack(MAGIC, VERSION, kind, len(small), 0, FLAG_ZSTD, _RESERVED), small))
    if len(body) > MAX_BODY or len(tag) > MAX_TAG:
        return pack(kind, body, tag=tag)  # raises ValueError
    return b"".join((HEADER.pack(MAGIC, VERSION, kind, len(body), len(tag), 0, _RESERVED), body, tag))


def encode(msg: Message, *, tag: bytes = b"", compress: bool = False) -> bytes:
    """The bytes of ``msg`` on the wire: header, orjson body, ``tag``.

    Encode a frame once and send the same bytes to every peer of a broadcast. The message
    is not validated here (the receiver's :class:`Decoder` is the gate); build messages
    with valid values.

    ``compress=True`` zstd-compresses a body of at least :data:`COMPRESS_MIN_BODY` bytes
    (if that makes it smaller; never with a ``tag``). Only a peer that negotiated
    compression may receive it; :class:`~dedupnet.adapters.net.transport.Connection` converts it back
    (once per broadcast) for a peer that did not, and compresses plain bytes for a peer
    that did, so callers need not choose.
    """
    try:
        kind = msg.KIND
    except AttributeError:
        raise TypeError(f"not a dedupnet message: {type(msg).__name__}") from None
    return _pack_maybe_compressed(Kind(kind), orjson.dumps(msg.to_json()), tag, compress)


def encode_frame(frame: Frame, *, tag: bytes = b"", compress: bool = False) -> bytes:
    """Fast path of :func:`encode` for the paper's frame (the hot message)."""
    body = orjson.dumps({"URL_set": frame.URL_set, "IP": frame.IP, "number": frame.number, "flag": frame.flag})
    return _pack_maybe_compressed(1, body, tag, compress)


# --- converting encoded bytes between plain and compressed -------------------------------


def _messages(data: bytes) -> list[tuple[int, int, int, int]] | None:
    """(offset, flags, body_len, tag_len) of each message in ``data``, or None if ``data``
    is not a whole number of well-formed headers and bodies (then it is left as it is)."""
    out = []
    offset = 0
    n = len(data)
    while offset < n:
        if offset + HEADER_SIZE > n or data[offset : offset + 2] != MAGIC:
            return None
        body_len, tag_len = _LEN.unpack_from(data, offset + 4)
        out.append((offset, data[offset + FLAGS_OFFSET], body_len, tag_len))
        offset += HEADER_SIZE + body_len + tag_len
    return out if offset == n else None


def is_compressed(data: bytes) -> bool:
    """True if a message in ``data`` (encoded bytes, normally one message) has FLAG_ZSTD."""
    if len(data) >= HEADER_SIZE and len(data) == HEADER_SIZE + _LEN.unpack_from(data, 4)[0] + data[8]:
        return bool(data[FLAGS_OFFSET] & FLAG_ZSTD)  # the usual case: one message
    return any(flags & FLAG_ZSTD for _, flags, _, _ in _messages(data) or ())


def compressed(data: bytes) -> bytes:
    """``data`` (encoded messages) with every untagged plain body of at least
    :data:`COMPRESS_MIN_BODY` bytes compressed; ``data`` itself if nothing changes."""
    if len(data) < HEADER_SIZE + COMPRESS_MIN_BODY:
        return data
    parts = _messages(data)
    if parts is None:
        return data
    out = []
    changed = False
    for offset, flags, body_len, tag_len in parts:
        end = offset + HEADER_SIZE + body_len + tag_len
        small = None
        if not flags & FLAG_ZSTD and not tag_len and body_len >= COMPRESS_MIN_BODY:
            small = _zstd(data[offset + HEADER_SIZE : end])
        if small is None:
            out.append(data[offset:end])
            continue
        changed = True
        head = bytearray(data[offset : offset + HEADER_SIZE])
        _LEN.pack_into(head, 4, len(small), 0)
        head[FLAGS_OFFSET] = flags | FLAG_ZSTD
        out += (bytes(head), small)
    return b"".join(out) if changed else data


def uncompressed(data: bytes, max_frame_size: int = MAX_BODY) -> bytes:
    """``data`` (encoded messages) with every compressed body decompressed; ``data`` itself
    if none is compressed. Raises :class:`ProtocolError` (``bad-compression``,
    ``too-large``) like the decoder; a tagged message is left as it is (its tag covers the
    compressed body)."""
    parts = _messages(data)
    if parts is None or not any(flags & FLAG_ZSTD and not tag_len for _, flags, _, tag_len in parts):
        return data
    out = []
    for offset, flags, body_len, tag_len in parts:
        end = offset + HEADER_SIZE + body_len + tag_len
        if not flags & FLAG_ZSTD or tag_len:
            out.append(data[offset:end])
            continue
        body = _decompress(Kind(data[offset + 3]) if data[offset + 3] in _KINDS else Kind.FRAME,
                           data[offset + HEADER_SIZE : end], max_frame_size, zstandard.ZstdDecompressor())
        head = bytearray(data[offset : offset + HEADER_SIZE])
        _LEN.pack_into(head, 4, len(body), 0)
        head[FLAGS_OFFSET] = flags & ~FLAG_ZSTD
        out += (bytes(head), body)
    return b"".join(out)


def _decompress(kind: Kind, body: bytes | memoryview, limit: int, dctx: zstandard.ZstdDecompressor) -> bytes:
    """One zstd frame that declares its content size, at most ``limit`` bytes once
    decompressed. The declared size is checked before anything is decompressed; zstd
    fails a frame that decompresses to more (or less) than it declared."""
    name = kind.name.lower()
    try:
        size = zstandard.frame_content_size(body)
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"{name} body is not a zstd frame: {exc}", "bad-compression") from None
    if size < 0:  # CONTENTSIZE_UNKNOWN (-1) or an error
        raise ProtocolError(f"compressed {name} body does not declare its decompressed size", "bad-compression")
    if size > limit:
        raise ProtocolError(f"compressed {name} body declares {size} bytes decompressed, more than the limit of "
                            f"{limit}", "too-large")
    try:
        return dctx.decompress(body, max_output_size=limit, allow_extra_data=False)
    except (zstandard.ZstdError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"compressed {name} body is corrupt: {exc}", "bad-compression") from None


# --- decoding ---------------------------------------------------------------------------


class Decoder:
    """Incremental decoder of one byte stream (one connection).

    ``feed`` it bytes as they arrive, then call :meth:`next_message` until it returns
    :data:`NEED_DATA` (or iterate: ``for msg in decoder``)::

        decoder.feed(await stream.receive_some(65536))
        for msg in decoder:
            handle(msg, decoder.last_tag)

    Memory: :meth:`feed` keeps a reference to each chunk (no copy); the decoder copies
    into its own buffer only the frame it is assembling, one header at a time, so that
    buffer never holds more than ``16 + max_frame_size + 255`` bytes (:attr:`max_buffer`).
    The header's body length is checked against ``max_frame_size`` before any body byte is
    copied. Bytes fed but not yet decoded are reported by :attr:`pending`; draining after
    every ``feed`` (as above) keeps them below one frame plus one chunk.

    ``verify_tag``, if given, is called as ``verify_tag(header_and_body, tag)`` for every
    frame before its body is parsed (or decompressed); it raises :class:`ProtocolError` to
    reject it. The tag of the last message returned is :attr:`last_tag`.

    ``keyring`` (a :class:`dedupnet.codec.auth.Keyring`): every message must carry
    its tag. Sets ``verify_tag`` to ``keyring.verify`` and :attr:`tag_len_required` to
    its tag length, which is checked as soon as the header is complete (an untagged
    message is ``bad-tag`` before a byte of its body is buffered). Both are attributes:
    the transport changes them once a handshake says which keyring a connection uses.

    ``allow_compressed`` (an attribute; the transport sets it once compression is
    negotiated): whether a FLAG_ZSTD body is accepted, else it is ``bad-header``. A
    compressed body is limited to ``max_frame_size`` both as received and decompressed.
    :attr:`compressed_messages` counts the compressed ones returned.

    :meth:`start_inflate` (the transport calls it once ``deflate-stream`` is switched on
    for what the peer sends): every byte not yet decoded, and every byte fed later, is
    inflated first; :attr:`deflated_bytes` counts what was fed compressed.

    After a :class:`ProtocolError` the decoder is poisoned: every later ``feed``,
    ``next_message`` or ``eof`` raises the same error; close the connection.
    """

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_urls: int = MAX_URLS,
        *,
        verify_tag: Callable[[bytes, bytes], object] | None = None,
        allow_compressed: bool = True,
        keyring: object | None = None,
    ) -> None:
        if not 1 <= max_frame_size <= MAX_BODY:
            raise ValueError(f"max_frame_size must be 1..{MAX_BODY}, got {max_frame_size}")
        if max_urls < 0:
            raise ValueError(f"max_urls must be >= 0, got {max_urls}")
        self.max_frame_size = max_frame_size
        self.max_urls = max_urls
        self.verify_tag = verify_tag
        #: With a keyring: the tag length every message must have (checked with the header).
        self.tag_len_required: int | None = None
        if keyring is not None:
            self.verify_tag = keyring.verify  # type: ignore[attr-defined]
            self.tag_len_required = keyring.tag_len  # type: ignore[attr-defined]
        self.allow_compressed = allow_compressed
        self.last_tag = b""
        self.messages = 0  # messages returned so far
        self.compressed_messages = 0  # of which had a compressed body
        self._flags = 0
        self._dctx: zstandard.ZstdDecompressor | None = None
        self._chunks: deque[bytes] = deque()  # fed, not yet copied into _buf
        self._offset = 0  # bytes of _chunks[0] already consumed
        self._unread = 0  # bytes in _chunks after _offset
        self._buf = bytearray()  # the frame being assembled (header first)
        self._need = HEADER_SIZE  # len(_buf) needed for the next step
        self._kind: Kind | None = None  # set once the header is parsed
        self._body_len = 0
        self._error: ProtocolError | None = None
        self._inflater: Any = None  # zlib's decompressobj once start_inflate was called
        self._deflated: deque[bytes] = deque()  # fed, not yet inflated
        self.deflated_bytes = 0

    # -- introspection --

    @property
    def max_buffer(self) -> int:
        """Upper bound of :attr:`buffered`: ``16 + max_frame_size + 255``."""
        return HEADER_SIZE + self.max_frame_size + MAX_TAG

    @property
    def buffered(self) -> int:
        """Bytes in the decoder's own buffer (part of the frame being assembled)."""
        return len(self._buf)

    @property
    def pending(self) -> int:
        """Bytes fed and not yet returned as messages (still compressed ones counted as fed)."""
        tail = len(self._inflater.unconsumed_tail) if self._inflater is not None else 0
        return self._unread + len(self._buf) + sum(map(len, self._deflated)) + tail

    @property
    def error(self) -> ProtocolError | None:
        """The error that poisoned the decoder, if any."""
        return self._error

    # -- input --

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the stream (any chunking; ``b""`` is a no-op)."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        if not data:
            return
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse a mutable buffer
        if self._inflater is not None:
            self._deflated.append(data)
            self.deflated_bytes += len(data)
            return
        self._chunks.append(data)
        self._unread += len(data)

    def start_inflate(self) -> None:
        """From here on the stream is ``deflate-stream``: the bytes fed and not yet
        decoded (they came after the message that switched it) are inflated first.
        Call between messages, right after the one that switches."""
        if self._inflater is not None or self._kind is not None or self._buf:
            raise RuntimeError("start_inflate: already inflating, or inside a message")
        chunks, offset = self._chunks, self._offset
        if chunks and offset:
            chunks[0] = chunks[0][offset:]
        self._deflated.extend(chunks)
        self.deflated_bytes += self._unread
        chunks.clear()
        self._offset = self._unread = 0
        self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)

    def _inflate_step(self) -> bool:
        """Inflate up to INFLATE_STEP bytes into the fed chunks; False if nothing is
        left to inflate now."""
        z = self._inflater
        assert z is not None, "inflating without start_inflate"
        while True:
            if z.unconsumed_tail:
                data = z.unconsumed_tail
            elif self._deflated:
                data = self._deflated.popleft()
            else:
                return False
            try:
                out = z.decompress(data, INFLATE_STEP)
            except zlib.error as exc:
                raise ProtocolError(f"not a valid deflate stream: {exc}", "bad-compression") from None
            if z.eof:
                raise ProtocolError("the deflate stream ended (a final block); it lasts as long as the connection",
                                    "bad-compression")
            if out:
                self._chunks.append(out)
                self._unread += len(out)
                return True

    def eof(self) -> None:
        """The peer closed the stream. Call after :meth:`next_message` returned NEED_DATA.

        Raises ``ProtocolError("truncated")`` if part of a frame was received.
        """
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self.pending:
            exc = ProtocolError(f"stream closed inside a frame ({self.pending} bytes pending)", "truncated")
            self._poison(exc)
            raise exc

    # -- output --

    def next_message(self) -> Message | Literal[_Sentinel.NEED_DATA]:
        """The next complete message, or :data:`NEED_DATA`. Raises :class:`ProtocolError`."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        try:
            return self._next()
        except ProtocolError as exc:
            self._poison(exc)
            raise

    def events(self) -> Iterator[Message]:
        """Yield every complete message buffered now."""
        while True:
            msg = self.next_message()
            if msg is NEED_DATA:
                return
            yield msg

    __iter__ = events

    # -- internals --

    def _poison(self, exc: ProtocolError) -> None:
        self._error = exc
        self._deflated.clear()
        self._inflater = None
        self._chunks.clear()
        self._unread = 0
        self._buf = bytearray()

    def _fill(self) -> bool:
        """Copy from the fed chunks into _buf until it holds _need bytes; False if short."""
        buf = self._buf
        want = self._need - len(buf)
        chunks = self._chunks
        while want > 0:
            if not chunks and (self._inflater is None or not self._inflate_step()):
                break
            chunk = chunks[0]
            offset = self._offset
            avail = len(chunk) - offset
            if avail <= want:
                buf += memoryview(chunk)[offset:] if offset else chunk
                chunks.popleft()
                self._offset = 0
                self._unread -= avail
                want -= avail
            else:
                buf += memoryview(chunk)[offset : offset + want]
                self._offset = offset + want
                self._unread -= want
                want = 0
        return want == 0

    def _check_partial_header(self) -> None:
        buf = self._buf
        n = len(buf)
        if n >= 1 and (buf[0] != MAGIC[0] or (n >= 2 and buf[1] != MAGIC[1])):
            raise ProtocolError(f"bad magic {bytes(buf[:2])!r}, expected {MAGIC!r} (not a dedupnet stream)",
                                "bad-magic")
        if n >= 3 and buf[2] != VERSION:
            raise ProtocolError(f"unsupported protocol version {buf[2]} (this side speaks {VERSION})",
                                "bad-version")
        if n >= 4 and buf[3] not in _KINDS:
            raise ProtocolError(f"unknown message kind {buf[3]}", "bad-kind")

    def _parse_header(self) -> None:
        self._check_partial_header()
        _magic, _version, kind, body_len, tag_len, flags, reserved = HEADER.unpack_from(self._buf)
        if reserved != _RESERVED:
            raise ProtocolError(f"reserved header bytes must be zero, got {reserved.hex()}", "bad-header")
        if flags & ~KNOWN_FLAGS:
            raise ProtocolError(f"unknown header flag bits {flags & ~KNOWN_FLAGS:#04x} (flags {flags:#04x})",
                                "bad-header")
        if flags & FLAG_ZSTD and not self.allow_compressed:
            raise ProtocolError("compressed body (flag bit 0) but compression was not negotiated on this "
                                "connection", "bad-header")
        if self.tag_len_required is not None and tag_len != self.tag_len_required:
            raise ProtocolError(f"{Kind(kind).name.lower()} has a tag of {tag_len} bytes, expected an HMAC tag of "
                                f"{self.tag_len_required} (sent without this LAN's key?)", "bad-tag")
        if body_len > self.max_frame_size:
            raise ProtocolError(f"{Kind(kind).name.lower()} body of {body_len} bytes exceeds the limit of "
                                f"{self.max_frame_size}", "too-large")
        self._kind = _KINDS[kind]
        self._flags = flags
        self._body_len = body_len
        self._need = HEADER_SIZE + body_len + tag_len

    def _next(self) -> Message | Literal[_Sentinel.NEED_DATA]:
        if self._kind is None:
            if not self._fill():
                self._check_partial_header()
                return NEED_DATA
            self._parse_header()
        if not self._fill():
            return NEED_DATA
        kind = self._kind
        assert kind is not None  # the header was parsed
        buf = self._buf
        end = HEADER_SIZE + self._body_len
        tag = bytes(buf[end:])
        if self.verify_tag is not None:
            self.verify_tag(bytes(memoryview(buf)[:end]), tag)
        view = memoryview(buf)
        try:
            body = view[HEADER_SIZE:end]
            try:
                if self._flags & FLAG_ZSTD:
                    if self._dctx is None:
                        self._dctx = zstandard.ZstdDecompressor()
                    plain = _decompress(kind, body, self.max_frame_size, self._dctx)
                    body.release()
                    body = memoryview(plain)
                obj = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise ProtocolError(f"{kind.name.lower()} body is not valid JSON: {exc}", "bad-json") from None
            finally:
                body.release()
        finally:
            view.release()
        # Reset for the next frame before validating, so a valid frame never leaves state.
        buf.clear()
        self._kind = None
        self._need = HEADER_SIZE
        compressed = self._flags & FLAG_ZSTD
        self._flags = 0
        msg = from_json(kind, obj, max_urls=self.max_urls)
        self.last_tag = tag
        self.messages += 1
        if compressed:
            self.compressed_messages += 1
        return msg


def decode_one(
    data: bytes, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, max_urls: int = MAX_URLS,
    allow_compressed: bool = True, keyring: object | None = None,
) -> Message:
    """Decode exactly one complete frame (for tests and conformance vectors)."""
    decoder = Decoder(max_frame_size, max_urls, allow_compressed=allow_compressed, keyring=keyring)
    decoder.feed(data)
    msg = decoder.next_message()
    if msg is NEED_DATA:
        raise ProtocolError(f"incomplete frame ({len(data)} bytes)", "truncated")
    if decoder.pending:
        raise ProtocolError(f"{decoder.pending} bytes after the frame", "trailing-data")
    return msg
