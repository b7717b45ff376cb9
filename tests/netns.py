"""Networks on real interfaces for tests: Linux network namespaces joined by veth pairs
and bridges (iproute2), daemons started in them with ``ip netns exec``, and sockets of
this (test) process opened inside them.

Nothing here touches the namespace the tests run in: every interface, address and
route is created inside a namespace of the lab (``ip -n NS ...``, veth peers created
straight into their namespace), so every packet stays inside the lab, and deleting the
namespaces removes all of it. Namespace names carry the test process's pid
(``dnt<pid>-<name>``); leftovers of a run that was killed outright are removed by the
next one (:func:`remove_stale`).

The test process itself stays in its own namespace. To reach a daemon or to serve the
synthetic web inside a namespace it opens sockets there: :func:`entered` switches the
calling thread into a namespace for a moment (``setns(2)``), and
:class:`NetnsSocketFactory`, installed as trio's socket factory, creates every trio
socket in the namespace named by :data:`current_netns` (a context variable, so one task
can talk to a daemon in one namespace while another serves the web in a second).
Sockets keep the namespace they were created in.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import trio

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
PREFIX = "dnt"
_STALE = re.compile(rf"^{PREFIX}(\d+)-")

#: The namespace in which trio sockets are created (None: this process's own).
current_netns: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_netns", default=None)

_libc = ctypes.CDLL(None, use_errno=True)


class LabError(RuntimeError):
    """A command that builds or changes the lab failed."""


def run(*argv: str, timeout: float = 15.0, check: bool = True) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv)}: no answer in {timeout:g} s") from None
    if check and out.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """The calling thread in network namespace ``ns`` for the ``with`` block (which must
    not await: other trio tasks run on this thread), then back in its own."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / ns, os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)  # if this fails the thread is lost in ns: the error says so
        finally:
            os.close(target)
    finally:
        os.close(own)


class NetnsSocketFactory(trio.abc.SocketFactory):
    """trio sockets created in the namespace :data:`current_netns` names."""

    def socket(self, family=socket.AF_INET, type=socket.SOCK_STREAM, proto=0):  # noqa: A002 - trio's names
        ns = current_netns.get()
        if ns is None:
            sock = socket.socket(family, type, proto)
        else:
            with entered(ns):
                sock = socket.socket(family, type, proto)
        return trio.socket.from_stdlib_socket(sock)


@contextlib.contextmanager
def in_netns(ns: str | None) -> Iterator[None]:
    """Trio sockets this task (and the tasks it starts) creates are in ``ns``."""
    token = current_netns.set(ns)
    try:
        yield
    finally:
        current_netns.reset(token)


def unavailable() -> str | None:
    """Why namespaces cannot be built here (a reason to skip), or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "building network namespaces needs root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2) on PATH"
    if not hasattr(_libc, "setns"):
        return "the C library has no setns()"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        run("ip", "netns", "add", probe)
    except (LabError, OSError) as e:
        return f"ip netns unavailable: {e}"
    try:
        run("ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
        run("ip", "-n", probe, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", probe, "link", "set", "lo", "up")
        with entered(probe):
            socket.socket().close()
    except (LabError, OSError) as e:
        return f"veth pairs, bridges or setns unavailable: {e}"
    finally:
        run("ip", "netns", "del", probe, check=False)
    return None


def netem_available(ns: str, dev: str) -> bool:
    """Whether the kernel has the netem qdisc (tried on ``dev``, then removed)."""
    out = run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms", check=False)
    if out.returncode != 0:
        return False
    run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete the lab namespaces of test processes that are gone (killed outright)."""
    removed = []
    for name in list_namespaces():
        m = _STALE.match(name)
        if m and not _alive(int(m.group(1))):
            kill_processes_in(name)
            run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


def list_namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def kill_processes_in(ns: str) -> list[int]:
    """SIGKILL what still runs in lab namespace ``ns`` (only processes this test started,
    and their children: nothing else runs in a lab namespace)."""
    out = run("ip", "netns", "pids", ns, check=False)
    pids = [int(p) for p in out.stdout.split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


class Lab:
    """Namespaces and links of one test; :meth:`close` removes them all."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.namespaces: list[str] = []

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def add(self, name: str) -> str:
        ns = self.ns(name)
        run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def ip(self, name: str, *args: str) -> None:
        run("ip", "-n", self.ns(name), *args)

    def tc(self, name: str, *args: str) -> subprocess.CompletedProcess:
        return run("tc", "-n", self.ns(name), *args)

    def bridge(self, name: str, dev: str = "br0") -> None:
        self.ip(name, "link", "add", dev, "type", "bridge")
        self.ip(name, "link", "set", dev, "up")

    def veth(self, a: str, a_dev: str, b: str, b_dev: str) -> None:
        """A veth pair, one end in each namespace, both up."""
        self.ip(a, "link", "add", a_dev, "type", "veth", "peer", "name", b_dev, "netns", self.ns(b))
        self.ip(a, "link", "set", a_dev, "up")
        self.ip(b, "link", "set", b_dev, "up")

    def plug(self, name: str, dev: str, switch: str, port: str, address: str, bridge: str = "br0") -> None:
        """Interface ``dev`` of ``name``, with ``address``, on the bridge of ``switch``."""
        self.veth(name, dev, switch, port)
        self.ip(switch, "link", "set", port, "master", bridge)
        self.ip(name, "addr", "add", address, "dev", dev)

    def exec_argv(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *argv]

    def close(self) -> list[str]:
        """Kill what still runs in the namespaces and delete them; returns what was left
        (problems, for the caller to report)."""
        problems = []
        for ns in reversed(self.namespaces):
            left = kill_processes_in(ns)
            if left:
                problems.append(f"processes still running in {ns} were killed: {left}")
            out = run("ip", "netns", "del", ns, check=False)
            if out.returncode != 0:
                problems.append(f"ip netns del {ns}: {out.stderr.strip()}")
        self.namespaces.clear()
        return problems


# -- random loss without netem: an eBPF classifier ------------------------------------
# Some kernels lack netem (CONFIG_NET_SCH_NETEM unset) and the gact action, but have
# clsact and cls_bpf. This tc filter program drops each packet with probability p
# (bpf_get_prandom_u32() <= p * 2**32: TC_ACT_SHOT, else TC_ACT_OK), assembled here,
# loaded with bpf(2) and handed to tc through a pin in a private bpffs mount.
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD, _BPF_OBJ_PIN = 5, 6
_BPF_PROG_TYPE_SCHED_CLS = 3
_BPF_FUNC_GET_PRANDOM_U32 = 7
_TC_ACT_OK, _TC_ACT_SHOT = 0, 2


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    import struct

    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def random_drop_program(share: float) -> bytes:
    threshold = min(int(share * 2**32), 2**31 - 1)
    return b"".join([
        _insn(0x85, imm=_BPF_FUNC_GET_PRANDOM_U32),  # call bpf_get_prandom_u32 -> r0
        _insn(0x25, dst=0, off=2, imm=threshold),     # if r0 > threshold: goto pass
        _insn(0xB7, dst=0, imm=_TC_ACT_SHOT),          # r0 = TC_ACT_SHOT
        _insn(0x95),                                    # exit
        _insn(0xB7, dst=0, imm=_TC_ACT_OK),            # pass: r0 = TC_ACT_OK
        _insn(0x95),                                    # exit
    ])


def _bpf(cmd: int, attr: bytes) -> int:
    import platform

    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf(2) syscall number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(128))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return ret


def _load_and_pin(share: float, path: str) -> None:
    import struct

    code = ctypes.create_string_buffer(random_drop_program(share))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = struct.pack("<IIQQIIQII16s", _BPF_PROG_TYPE_SCHED_CLS, len(code.raw) // 8, ctypes.addressof(code),
                       ctypes.addressof(license_), 1, len(log), ctypes.addressof(log), 0, 0, b"dnt_drop")
    try:
        fd = _bpf(_BPF_PROG_LOAD, attr)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}; verifier: {log.value.decode(errors='replace')}") from None
    name = ctypes.create_string_buffer(path.encode())
    _bpf(_BPF_OBJ_PIN, struct.pack("<QII", ctypes.addressof(name), fd, 0))
    os.close(fd)


def _attach_random_drop(ns: str, dev: str, share: float) -> None:
    """Runs in a private mount namespace (see :func:`add_random_drop`)."""
    import tempfile

    where = tempfile.mkdtemp(prefix="dnt-bpffs-")
    run("mount", "-t", "bpf", "bpf", where)
    try:
        _load_and_pin(share, f"{where}/drop")
        if "clsact" not in run("tc", "-n", ns, "qdisc", "show", "dev", dev).stdout:
            run("tc", "-n", ns, "qdisc", "add", "dev", dev, "clsact")
        run("tc", "-n", ns, "filter", "add", "dev", dev, "egress", "bpf", "da", "object-pinned", f"{where}/drop")
    finally:
        run("umount", where, check=False)
        os.rmdir(where)


def add_random_drop(ns: str, dev: str, share: float) -> None:
    """Drop each packet ``dev`` (in namespace ``ns``) sends with probability ``share``.
    The bpffs that carries the program to tc is mounted in a mount namespace of its own
    (``unshare --mount``), so nothing is mounted where the tests run. LabError if the
    kernel or the tools cannot."""
    root = str(Path(__file__).resolve().parent.parent)
    run("unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c",
        f"import sys; sys.path.insert(0, {root!r}); from tests.netns import _attach_random_drop; "
        f"_attach_random_drop({ns!r}, {dev!r}, {share!r})", timeout=30)


if __name__ == "__main__":  # pragma: no cover - a manual check: python -m tests.netns
    print(unavailable() or "network namespaces available")
