"""A power cut, as filesystem crash tests make one: each daemon's Redis data on its own
ext4 filesystem in a loop-mounted file, shut down without flushing its journal.

``EXT4_IOC_SHUTDOWN`` with ``EXT4_GOING_FLAGS_NOLOGFLUSH`` stops the filesystem at once:
every later write fails, and what the journal had not committed is gone when it is
mounted again, as after a machine that lost power. What ``fsync`` put on disk survives
(the journal's committed transactions are replayed on mount); what was only written is
lost, each filesystem at its own point. Needs root, ``losetup``/``mount`` and
``mkfs.ext4``; :func:`unavailable` says why not where they are missing.

Every mount gets a loop device of its own (``losetup --find``), detached again when it is
unmounted: ``mount -o loop`` would reuse a device still attached to the image, and with
it the filesystem that was shut down, whose every file then answers EIO.
:meth:`LoopDisk.remove` (unmount, delete the image) leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["LoopDisk", "unavailable"]

#: ``_IOR('X', 125, __u32)`` (linux/ext4.h) and its flag that drops the journal's tail.
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 0x2

#: Megabytes per disk: a daemon's AOF of a simulation fits many times (the file is sparse).
DISK_MB = 64


def _run(*argv: str) -> str:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


class LoopDisk:
    """One ext4 filesystem in ``<root>/disk.img``, mounted on ``<root>/mnt``."""

    def __init__(self, root: Path, size_mb: int = DISK_MB):
        self.root = Path(root)
        self.image = self.root / "disk.img"
        self.mountpoint = self.root / "mnt"
        self.size_mb = size_mb
        self.mounted = False
        self.device: str | None = None
        self.cuts = 0

    def create(self) -> "LoopDisk":
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size_mb * 1024 * 1024)
        _run("mkfs.ext4", "-q", "-F", str(self.image))
        self.mount()
        return self

    def mount(self) -> None:
        device = _run("losetup", "--find", "--show", str(self.image))
        try:
            _run("mount", device, str(self.mountpoint))
        except OSError:
            _run("losetup", "--detach", device)
            raise
        self.device, self.mounted = device, True

    def cut(self) -> None:
        """The power goes: the filesystem stops, its journal's uncommitted tail is dropped."""
        fd = os.open(self.mountpoint, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)
        self.cuts += 1

    def unmount(self, wait: float = 10.0) -> None:
        """Once nothing holds a file open on it: a killed server's files close only as it
        exits, so a busy mount is tried again for up to ``wait`` seconds."""
        if not self.mounted:
            return
        deadline = time.monotonic() + wait
        while True:
            try:
                _run("umount", str(self.mountpoint))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.mounted = False
        device, self.device = self.device, None
        if device is not None:
            _run("losetup", "--detach", device)

    def remove(self) -> None:
        try:
            self.unmount()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def unavailable() -> str | None:
    """None if a power cut can be made here, else a one-line reason."""
    if os.geteuid() != 0:
        return "a power cut needs root (loop devices, mount, the ext4 shutdown ioctl)"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
        if shutil.which(tool) is None:
            return f"a power cut needs {tool}, which is not on PATH"
    root = Path(tempfile.mkdtemp(prefix="dedupnet-powercheck-"))
    disk = LoopDisk(root, size_mb=8)
    try:
        disk.create()
        disk.cut()
    except OSError as e:
        return f"no loop-mounted ext4 with a shutdown here: {e}"
    finally:
        try:
            disk.remove()
        except OSError as e:  # noqa: PERF203 - said, not raised: the check's answer is what matters
            return f"a loop-mounted test disk could not be unmounted: {e}"
    return None
