"""The forms one encoded message takes on its way to each peer: its bodies compressed
or plain (zstd bodies, for a peer that chose those), tagged with a connection's key,
and the kinds it holds (for the bytes-by-kind counters). A broadcast hands every peer
the same object, so each conversion is made once per object and cached here for the
next peer."""

from __future__ import annotations

import struct
from collections import OrderedDict

from dedupnet.codec.auth import Keyring
from dedupnet.codec.wire import COMPRESS_MIN_BODY, HEADER_SIZE, MAGIC, compressed, is_compressed, uncompressed

from .handshake import kind_name

_BODY_AND_TAG = struct.Struct(">IB")  # body length, tag length at offset 4 of a header


_RECODED: OrderedDict[tuple[int, bool], tuple[bytes, bytes]] = OrderedDict()
_RECODED_MAX = 4  # a broadcast sends one object to every peer in a row: a few entries suffice


def _recode(data: bytes, compress: bool) -> bytes:
    """``data`` with its bodies compressed (``compress``) or plain, converted once per
    object: a broadcast calls this with the same bytes for every peer, and every peer
    gets the same converted object (one compression, one copy in memory)."""
    if compress:
        if len(data) < HEADER_SIZE + COMPRESS_MIN_BODY:
            return data
    elif not is_compressed(data):
        return data
    key = (id(data), compress)
    hit = _RECODED.get(key)
    if hit is not None and hit[0] is data:
        _RECODED.move_to_end(key)
        return hit[1]
    out = compressed(data) if compress else uncompressed(data)
    if out is not data:
        _RECODED[key] = (data, out)  # holding data keeps its id from being reused
        if len(_RECODED) > _RECODED_MAX:
            _RECODED.popitem(last=False)
    return out


_SIGNED: OrderedDict[tuple[int, int, int], tuple[bytes, Keyring, bytes]] = OrderedDict()


def _signed(data: bytes, keyring: Keyring) -> bytes:
    """``data`` tagged with ``keyring``'s sending key, once per object and key (a
    broadcast signs once for all the peers of one keyring, as it compresses once)."""
    key = (id(data), id(keyring), keyring.send_id)
    hit = _SIGNED.get(key)
    if hit is not None and hit[0] is data and hit[1] is keyring:
        _SIGNED.move_to_end(key)
        return hit[2]
    out = keyring.sign(data)
    _SIGNED[key] = (data, keyring, out)
    if len(_SIGNED) > _RECODED_MAX:
        _SIGNED.popitem(last=False)
    return out


def _sent_kinds(data: bytes) -> list[tuple[str, int]]:
    """The kinds and sizes of the messages in ``data`` (normally one), from their headers:
    byte 3 of each header is the kind, bytes 4..8 the body length, byte 8 the tag length."""
    kinds = []
    offset = 0
    while offset + HEADER_SIZE <= len(data) and data[offset : offset + 2] == MAGIC:
        body_len, tag_len = _BODY_AND_TAG.unpack_from(data, offset + 4)
        size = HEADER_SIZE + body_len + tag_len
        kinds.append((kind_name(data[offset + 3]), size))
        offset += size
    return kinds or [("unknown", len(data))]
