"""Child processes that never outlive us, and a free port to start one on.

The embedded Redis server, the simulation's daemons and the tests' servers are all
children of a process that may be killed outright (SIGKILL, ``os._exit``), when no
``atexit`` hook or ``finally`` runs. On Linux the kernel can still stop them: a child
spawned with ``PR_SET_PDEATHSIG`` gets SIGTERM when its parent goes. :func:`spawn` is
``subprocess.Popen`` with that signal set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable

__all__ = ["free_port", "spawn"]


def free_port(host: str) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind 0, read, close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl


_prctl = _load_prctl()


def _make_preexec() -> Callable[[], None] | None:
    if _prctl is None:
        return None
    prctl = _prctl
    parent = os.getpid()
    sig = int(signal.SIGTERM)

    def preexec() -> None:  # runs in the forked child, before exec: keep it tiny
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


# PR_SET_PDEATHSIG fires when the thread that forked the child exits, not
# when the process does. A server started from a worker thread (e.g.
# trio.to_thread.run_sync, whose idle threads exit after a while) would be
# killed with that thread. So spawn from the main thread, or else from one
# daemon thread kept for the life of the interpreter.

_spawner_lock = threading.Lock()
_spawner_queue: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[Any]]] | None = None


def _spawner_loop(jobs: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[Any]]]) -> None:
    while True:
        func, reply = jobs.get()
        try:
            reply.put((True, func()))
        except BaseException as exc:  # handed back to the caller
            reply.put((False, exc))


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)``; on Linux the child gets SIGTERM when this
    process dies."""
    preexec = _make_preexec()

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, preexec_fn=preexec, **kwargs)

    if preexec is None or threading.current_thread() is threading.main_thread():
        return popen()
    global _spawner_queue
    with _spawner_lock:
        if _spawner_queue is None:
            _spawner_queue = queue.SimpleQueue()
            threading.Thread(
                target=_spawner_loop, args=(_spawner_queue,), name="dedupnet-redis-spawner", daemon=True
            ).start()
        jobs = _spawner_queue
    reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
    jobs.put((popen, reply))
    ok, result = reply.get()
    if not ok:
        raise result
    return result
