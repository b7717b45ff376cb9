"""One daemon per data directory.

Two daemons started on one data directory (two hosts given the same ``--ip`` share
``dedupnet-data/host-IP`` by default) would each start a Redis that appends to the
same AOF, and as the same member knock each other off their center. A daemon holds an
exclusive ``flock`` on a file in its data directory while it runs; the kernel drops it
when the process ends, however it ends, so a crashed daemon never leaves a stale lock
to clean up by hand. The file holds the holder's pid, for the one line a second daemon
stops with."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from dedupnet.codec.errors import SettingsError

LOCK_NAME = "daemon.lock"


@contextlib.contextmanager
def hold(data_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``data_dir``'s lock until the block ends (or this process does).
    :class:`SettingsError` naming the directory and the holder's pid if another
    process holds it."""
    path = Path(data_dir) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise SettingsError(
                f"the data directory {data_dir} is in use by another daemon (pid {holder}): give each daemon "
                "its own --data-dir (two hosts with the same --ip share one by default), or stop that one",
                reason="data-dir-in-use") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a daemon starting)
