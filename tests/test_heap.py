"""glibc's malloc bounded in the daemons (dedupnet/adapters/heap.py): at most two arenas
however many threads allocate, a block of 128 KiB or more mapped on its own even after a
bigger one was freed, and both in `dedupnet center` and `dedupnet local` as started."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from dedupnet.adapters import heap

from .helpers import DEDUPNET, free_port, status, wait_for

pytestmark = pytest.mark.skipif(heap.glibc() is None, reason="glibc's malloc only")

#: Run in a fresh interpreter (arenas and thresholds are per process and never undone):
#: bound or not, then 8 threads alive at once each allocate; prints the arenas
#: (malloc_info's heaps) and whether a 200 KiB block was mapped on its own after a 1 MiB
#: one was freed (mallinfo2's mapped blocks).
PROBE = r"""
import ctypes, re, sys, threading
from dedupnet.adapters import heap
if sys.argv[1] == "bound":
    assert heap.bound(environ={}) == {"arena_max": 2, "mmap_threshold": 131072, "trim_threshold": 131072}
libc = heap.glibc()

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.open_memstream.restype = ctypes.c_void_p
libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]

libc.free(libc.malloc(1 << 20))  # glibc raises its mmap threshold to 1 MiB here, unless it is fixed
before = libc.mallinfo2().hblks
block = libc.malloc(200 << 10)
mapped = libc.mallinfo2().hblks - before
libc.free(block)

barrier = threading.Barrier(9)
def work():
    kept = [bytearray(4096) for _ in range(100)]  # over pymalloc's 512 bytes: malloc's
    barrier.wait()
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
barrier.wait()
buf, size = ctypes.c_char_p(), ctypes.c_size_t()
stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
libc.malloc_info(0, stream)
libc.fclose(stream)
arenas = len(re.findall(r"<heap nr=", ctypes.string_at(buf, size.value).decode()))
barrier.wait()
print(arenas, mapped)
"""


def probe(how: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    arenas, mapped = out.stdout.split()
    return int(arenas), int(mapped)


def test_bound_keeps_two_arenas_and_a_fixed_mmap_threshold():
    assert probe("bound") == (2, 1)
    arenas, mapped = probe("default")  # what the bounds change: the probe can tell them apart
    assert arenas > 2 and mapped == 0


def test_the_operators_own_bounds_are_left_alone(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append(param)
            return 1

    monkeypatch.setattr(heap, "glibc", Libc)
    assert heap.bound(environ={"MALLOC_ARENA_MAX": "4",
                               "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}) == {"mmap_threshold": 131072}
    assert calls == [heap.M_MMAP_THRESHOLD]
    monkeypatch.setattr(heap, "glibc", lambda: None)
    assert heap.bound(environ={}) == {}


def thread_heaps(pid: int) -> int:
    """glibc's heaps of arenas other than the main one in a running process, read from its
    memory map: anonymous mappings that start on a 64 MiB boundary and, with the
    reserved (PROT_NONE) rest after them, span 64 MiB."""
    rows = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            rows.append((start, end, parts[1], len(parts) > 5))
    found = 0
    for i, (start, end, perms, named) in enumerate(rows):
        if named or start % (64 << 20) or not perms.startswith("rw"):
            continue
        if i + 1 < len(rows) and rows[i + 1][0] == end and rows[i + 1][2].startswith("---") and not rows[i + 1][3]:
            end = rows[i + 1][1]
        found += end - start == 64 << 20
    return found


def test_started_daemons_keep_one_arena_besides_the_main_one(tmp_path):
    """Unbounded, a host started like this has made two arenas besides the main one by
    the time it is connected (its worker threads); bounded, one at most."""
    port, host_port = free_port("127.0.1.1"), free_port("127.0.1.10")
    procs = []

    def start(*args):
        log = open(tmp_path / f"{args[0]}.log", "w")
        procs.append(subprocess.Popen([*DEDUPNET, *args, "--log-level", "DEBUG"], cwd=tmp_path, stdout=log,
                                      stderr=subprocess.STDOUT))

    try:
        start("center", "--network", "1", "--listen", f"127.0.1.1:{port}", "--no-discovery")
        assert wait_for(lambda: status(f"127.0.1.1:{port}"), 60)
        start("local", "--network", "1", "--ip", "127.0.1.10", "--center", f"127.0.1.1:{port}",
              "--listen", f"127.0.1.10:{host_port}")
        assert wait_for(lambda: (s := status(f"127.0.1.10:{host_port}")) and s["connected"], 60)
        heaps = [thread_heaps(p.pid) for p in procs]
        assert max(heaps) <= 1, heaps
        for name in ("center", "local"):
            assert "malloc bounded: arena_max 2, mmap_threshold 131072, trim_threshold 131072" in \
                (tmp_path / f"{name}.log").read_text()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
