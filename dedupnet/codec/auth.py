"""Authenticated frames: HMAC tags keyed by a shared secret, with key ids for rotation.

Sans-I/O (no sockets, no trio): a :class:`Keyring` holds keys read from a key file and
does two things, :meth:`Keyring.sign` (encoded messages in, the same messages with a
tag out) and :meth:`Keyring.verify` (the :class:`~dedupnet.codec.wire.Decoder`'s hook, called
with a message's header and body *before* the body is decompressed or parsed). The trio
transport (:mod:`dedupnet.adapters.net.transport`) calls them; a daemon re-reads its key file
(:meth:`Keyring.reload`) so keys can be rotated without stopping anything.

Why: a center trusted a connection by its TCP source address alone (PROTOCOL.md gap 2),
so anything that could connect from an address inside the LAN could send a flag=3
answer that marks URLs as seen (never crawled: lost) or inject a flag=1 set.
With a LAN key every message carries a tag that only holders of the key can compute.

The tag (``wire`` header byte 8 ``tag_len`` = :data:`TAG_LEN` = 18)::

    offset  size  field
         0     2  key id: uint16, big-endian, 1..65535 (0 is never a key)
         2    16  HMAC-SHA256(secret, header + body)[:16]

computed over the 16-byte header (with ``tag_len`` = 18 filled in) and the body *as
sent* (compressed if flag bit 0 is set), so a receiver checks it before spending
anything on the body. 128 bits of HMAC-SHA256 is the truncation RFC 2104 §5 and NIST
SP 800-107 allow (at least half the hash, at least 80 bits); a forger's chance per try
is 2**-128. The key id is not covered by the HMAC: it only chooses the key, and a
changed id selects a key under which the HMAC fails.

What it does not do: it does not encrypt (frames are readable on the LAN; TLS is the
option for that), and it has no replay counter: TCP delivers a connection's bytes once
and in order, and a frame replayed on another connection arrives after that
connection's Register, which must itself be tagged and name the connection's own
source address (``verify_source``), so a replayed Register from another address is
refused and a replayed frame cannot be injected without an accepted handshake.

Key file (``lan_key_file`` / ``peer_key_file``), UTF-8 text, one key a line::

    # KEY_ID  HEX_SECRET                                                        [send]
    1         6b1f0c2e4a9d7f35b8e0c1d2a3f4e5d6b7c8d9e0f1a2b3c4d5e6f708192a3b4c
    2         0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0  send

``KEY_ID`` is a decimal integer 1..65535; ``HEX_SECRET`` at least 16 bytes (32 hex
digits; 32 bytes is what ``dedupnet sim --lan-key`` and :func:`new_key_line` make);
``#`` starts a comment. Every key listed is *accepted*; the one marked ``send`` is the
key this daemon tags with (a file with one key needs no mark). Rotation from key 1 to
key 2 without stopping the LAN, each step applied to every daemon of the LAN (center
and hosts) before the next starts:

1. add ``2 SECRET2`` (key 1 still ``send``): everyone accepts both, sends with 1;
2. move ``send`` to key 2: everyone accepts both, sends with 2 (a daemon that has not
   reloaded yet still sends 1, which everyone accepts);
3. remove key 1.

Daemons re-read the file every ``key_poll_interval`` seconds (default 1) and log the
change; a file that does not parse is logged and counted, and the keys in use stay.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dedupnet.codec.errors import ProtocolError

__all__ = [
    "TAG_LEN",
    "MAC_LEN",
    "KEY_ID_LEN",
    "MIN_SECRET",
    "Keyring",
    "KeyFileError",
    "parse_key_file",
    "new_key_line",
]

log = logging.getLogger("dedupnet.codec.auth")

KEY_ID_LEN = 2
MAC_LEN = 16  # HMAC-SHA256 truncated to 128 bits
TAG_LEN = KEY_ID_LEN + MAC_LEN  # 18
MIN_SECRET = 16  # bytes
MAX_KEY_ID = 0xFFFF

_HEADER_SIZE = 16  # wire.HEADER_SIZE (not imported: wire imports nothing of ours, nor we of it)
_LEN = struct.Struct(">IB")  # body_len, tag_len at offset 4 of a header
_KEY_ID = struct.Struct(">H")


class KeyFileError(ValueError):
    """A key file that cannot be used (names the file, the line and what is wrong)."""


@dataclass(frozen=True)
class _Keys:
    secrets: Mapping[int, bytes]  # accepted keys by id
    send_id: int


def parse_key_file(text: str, source: str = "key file") -> tuple[dict[int, bytes], int]:
    """``({key_id: secret}, send_id)`` from a key file's text (format: module docstring)."""
    keys: dict[int, bytes] = {}
    send: list[int] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source} line {number}"
        if len(fields) not in (2, 3) or (len(fields) == 3 and fields[2] != "send"):
            raise KeyFileError(f"{where}: expected 'KEY_ID HEX_SECRET [send]'")
        if not fields[0].isdigit() or not 1 <= int(fields[0]) <= MAX_KEY_ID:
            raise KeyFileError(f"{where}: key id must be an integer 1..{MAX_KEY_ID}, got {fields[0]!r}")
        key_id = int(fields[0])
        try:
            secret = bytes.fromhex(fields[1])
        except ValueError:
            raise KeyFileError(f"{where}: the secret is not hex") from None
        if len(secret) < MIN_SECRET:
            raise KeyFileError(f"{where}: the secret has {len(secret)} bytes, at least {MIN_SECRET} are needed")
        if key_id in keys:
            raise KeyFileError(f"{where}: key id {key_id} is listed twice")
        keys[key_id] = secret
        if len(fields) == 3:
            send.append(key_id)
    if not keys:
        raise KeyFileError(f"{source}: no keys")
    if len(send) > 1:
        raise KeyFileError(f"{source}: more than one key is marked 'send' ({', '.join(map(str, send))})")
    if not send:
        if len(keys) > 1:
            raise KeyFileError(f"{source}: {len(keys)} keys and none marked 'send'")
        send = list(keys)
    return keys, send[0]


def new_key_line(key_id: int = 1, *, send: bool = True) -> str:
    """A key file line with a fresh random 32-byte secret (``secrets.token_hex``)."""
    return f"{key_id} {secrets.token_hex(32)}{' send' if send else ''}\n"


class Keyring:
    """The keys of one trust domain (a LAN, or the peer centers): one *sending* key and
    the set of *accepted* keys. Shared by every connection of that domain, so a
    :meth:`reload` takes effect on all of them at once (already queued messages keep
    the tag they got when queued, which the receivers still accept during a rotation).

    ``sign(data)``: ``data`` (whole encoded messages, tagged or not) with every message
    tagged by the sending key. ``verify(header_and_body, tag)``: raises
    ``ProtocolError(reason="bad-tag")`` unless ``tag`` is a valid tag of an accepted key.
    """

    tag_len = TAG_LEN

    def __init__(self, keys: Mapping[int, bytes], send_id: int, *, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._text: str | None = None
        self._set(dict(keys), send_id)
        #: Reloads that changed the keys, and attempts that failed (file unreadable or invalid).
        self.reloads = 0
        self.reload_errors = 0

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """Read ``path``; raises :class:`KeyFileError` (or OSError) if it cannot be used."""
        text = Path(path).read_text(encoding="utf-8")
        keys, send_id = parse_key_file(text, str(path))
        ring = cls(keys, send_id, path=path)
        ring._text = text
        return ring

    @classmethod
    def single(cls, secret: bytes, key_id: int = 1) -> Keyring:
        return cls({key_id: secret}, key_id)

    def _set(self, keys: dict[int, bytes], send_id: int) -> None:
        if send_id not in keys:
            raise KeyFileError(f"the sending key {send_id} is not among the keys")
        for key_id, secret in keys.items():
            if not 1 <= key_id <= MAX_KEY_ID or len(secret) < MIN_SECRET:
                raise KeyFileError(f"key {key_id}: id must be 1..{MAX_KEY_ID} and the secret >= {MIN_SECRET} bytes")
        self._keys = _Keys(keys, send_id)
        self._send_prefix = _KEY_ID.pack(send_id)
        self._send_secret = keys[send_id]

    # -- introspection --

    @property
    def send_id(self) -> int:
        return self._keys.send_id

    @property
    def accepted(self) -> frozenset[int]:
        return frozenset(self._keys.secrets)

    def __repr__(self) -> str:
        return f"<Keyring send={self.send_id} accepted={sorted(self.accepted)}{' ' + str(self.path) if self.path else ''}>"

    # -- rotation --

    def update(self, keys: Mapping[int, bytes], send_id: int) -> None:
        """Replace the keys (what :meth:`reload` does with a changed file)."""
        self._set(dict(keys), send_id)
        self.reloads += 1

    def reload(self) -> bool:
        """Re-read :attr:`path`; True if the keys changed. A file that cannot be read or
        parsed is logged and counted (:attr:`reload_errors`), and the keys stay."""
        if self.path is None:
            return False
        try:
            text = self.path.read_text(encoding="utf-8")
            if text == self._text:
                return False
            keys, send_id = parse_key_file(text, str(self.path))
        except (OSError, UnicodeDecodeError, KeyFileError) as exc:
            self.reload_errors += 1
            log.error("cannot reload keys from %s: %s (keeping send=%d, accepted=%s)", self.path, exc,
                      self.send_id, sorted(self.accepted))
            return False
        before = (self.send_id, self.accepted)
        self._text = text
        if (send_id, frozenset(keys)) == before and all(self._keys.secrets[k] == v for k, v in keys.items()):
            return False
        self.update(keys, send_id)
        log.warning("keys reloaded from %s: sending with key %d, accepting %s (was: sending %d, accepting %s)",
                    self.path, send_id, sorted(keys), before[0], sorted(before[1]))
        return True

    # -- tagging --

    def tag(self, header_and_body: bytes | memoryview) -> bytes:
        """The tag of one message whose header already says ``tag_len`` = :data:`TAG_LEN`."""
        return self._send_prefix + hmac.digest(self._send_secret, header_and_body, hashlib.sha256)[:MAC_LEN]

    def sign(self, data: bytes) -> bytes:
        """``data`` (one or more whole encoded messages) with each message tagged by the
        sending key (an existing tag is replaced). Raises ValueError if ``data`` is not
        whole messages (a bug of the caller: the transport only sends what it encoded)."""
        n = len(data)
        if n >= _HEADER_SIZE:
            body_len, tag_len = _LEN.unpack_from(data, 4)
            if n == _HEADER_SIZE + body_len + tag_len:  # the usual case: one message
                return self._sign_one(data, 0, body_len)
        out = []
        offset = 0
        while offset < n:
            if offset + _HEADER_SIZE > n:
                raise ValueError("not whole messages")
            body_len, tag_len = _LEN.unpack_from(data, offset + 4)
            end = offset + _HEADER_SIZE + body_len + tag_len
            if end > n:
                raise ValueError("not whole messages")
            out.append(self._sign_one(data, offset, body_len))
            offset = end
        return b"".join(out)

    def _sign_one(self, data: bytes, offset: int, body_len: int) -> bytes:
        head = bytearray(data[offset : offset + _HEADER_SIZE])
        head[8] = TAG_LEN
        body = data[offset + _HEADER_SIZE : offset + _HEADER_SIZE + body_len]
        mac = hmac.new(self._send_secret, head, hashlib.sha256)
        mac.update(body)
        return b"".join((head, body, self._send_prefix, mac.digest()[:MAC_LEN]))

    def verify(self, header_and_body: bytes | memoryview, tag: bytes) -> int:
        """The key id of a valid ``tag`` over ``header_and_body``; else ProtocolError
        ``bad-tag`` (missing, wrong length, unknown key id, or a wrong HMAC)."""
        if len(tag) != TAG_LEN:
            raise ProtocolError(f"message has a tag of {len(tag)} bytes, expected an HMAC tag of {TAG_LEN} "
                                "(no key, or not this LAN's)", "bad-tag")
        key_id: int = _KEY_ID.unpack_from(tag)[0]
        secret = self._keys.secrets.get(key_id)
        if secret is None:
            raise ProtocolError(f"message tagged with key {key_id}, which is not accepted here "
                                f"(accepting {sorted(self.accepted)})", "bad-tag")
        expected = hmac.digest(secret, header_and_body, hashlib.sha256)[:MAC_LEN]
        if not hmac.compare_digest(expected, tag[KEY_ID_LEN:]):
            raise ProtocolError(f"message tag does not verify with key {key_id}", "bad-tag")
        return key_id

    def knows(self, tag: bytes) -> bool:
        """Whether ``tag`` names a key id accepted here (no HMAC check)."""
        return len(tag) == TAG_LEN and _KEY_ID.unpack_from(tag)[0] in self._keys.secrets


def keyring_from(path: str | os.PathLike[str] | None) -> Keyring | None:
    """:meth:`Keyring.from_file` of ``path``, or None without one (a setting not given).
    A file that cannot be read is a :class:`KeyFileError` too (a daemon refuses to start)."""
    if path is None:
        return None
    try:
        return Keyring.from_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc}") from None


def write_key_file(path: str | os.PathLike[str], lines: Iterable[str]) -> None:
    """Write a key file readable by its owner only (mode 0600), replacing it atomically
    (a daemon polling it never reads half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("".join(lines))
    os.replace(tmp, path)
