"""Redis' wire format (RESP) as the store writes it: a command packed in one step, and
a fingerprint as a set member of fixed width, so that numpy can lay out many at once
and a bucket's command head is made once."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

# Members are written with a fixed number of decimal digits so that numpy can
# build every member's RESP bulk string in one vectorised step.
MEMBER_OFFSET = 10**16
MEMBER_DIGITS = 17
MEMBER_RECORD = 5 + MEMBER_DIGITS + 2  # b"$17\r\n" + digits + b"\r\n"
MEMBER_HEAD = b"$%d\r\n" % MEMBER_DIGITS
#: Up to this many fingerprints a batch lays out their commands without numpy.
FEW_FINGERPRINTS = 64


class _BucketHeads(dict):
    """``command`` and one bucket's key in RESP, made once per (command, pool, bucket)."""

    def __init__(self, command: bytes, key: str):
        super().__init__()
        self.cmd = bulk(command)
        self.prefix = key.encode() + b":"

    def __missing__(self, bucket: int) -> bytes:
        head = self[bucket] = self.cmd + bulk(self.prefix + b"%d" % bucket)
        return head


@functools.lru_cache(maxsize=1024)
def bucket_heads(command: bytes, key: str) -> _BucketHeads:
    return _BucketHeads(command, key)


def bulk(arg: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def encode_arg(arg: Any) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, (int, np.integer)):
        return b"%d" % int(arg)
    if isinstance(arg, float):
        return repr(arg).encode()
    raise TypeError(f"cannot send {type(arg).__name__} to Redis")


def fingerprint_fields(fps: np.ndarray) -> list[bytes]:
    """Fingerprints as 8-byte big-endian strings: compact hash fields."""
    raw = np.asarray(fps, dtype=">u8").tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


def pack_command(*args: Any) -> bytes:
    """One command in RESP."""
    parts = [b"*%d\r\n" % len(args)]
    parts.extend(bulk(encode_arg(a)) for a in args)
    return b"".join(parts)
