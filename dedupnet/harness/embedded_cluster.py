"""A Redis Cluster of embedded servers, for the tests, the benchmarks and
``dedupnet sim --redis-cluster``: every node an :class:`~dedupnet.adapters.storage.embedded.EmbeddedRedis`
in cluster mode on a loopback port."""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from dedupnet.adapters.children import free_port
from dedupnet.adapters.storage.embedded import EmbeddedRedis, EmbeddedRedisError

__all__ = ["EmbeddedCluster"]

log = logging.getLogger("dedupnet.adapters.storage.embedded")  # one logger for every embedded server


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
                          "cluster-port": str(free_port(self.host)),
                          # write(2) the AOF before every reply: a SIGKILLed node loses nothing
                          # acknowledged. With everysec a write waits while a previous fsync is
                          # still running (a busy disk), and a kill then loses it (measured: 178 of
                          # 319 keys of a node). Not power-loss safe: a harness, not a deployment.
                          "appendfsync": "no", **self.config}
                node = EmbeddedRedis(persistent=True, data_dir=self._dir / f"node{i}", host=self.host,
                                     port=free_port(self.host), config=config, startup_timeout=self.startup_timeout)
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
