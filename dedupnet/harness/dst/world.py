"""A whole simulated system: the web, the network, L centers and L x H hosts, the
faults of one schedule, and what the checker needs from the history."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from center_host.daemon import CenterSettings, PeerAddress
from local_host.daemon import LocalSettings

from dedupnet.adapters.net.transport.client import RECONNECT
from dedupnet.codec import wire
from dedupnet.codec.messages import Ack, Frame, Register, Task
from dedupnet.harness.cluster import center_ip, host_ip, lan
from dedupnet.codec.settings import SETTINGS
from dedupnet.harness.report import SimConfig, assign_seeds
from dedupnet.harness.web import SyntheticWeb, WebSpec

from . import faults as fl
from .clock import Scheduler
from .crawler import CrawlModel, Web
from .net import Network
from .nodes import CenterNode, HostNode, Node, kind_of
from .store import Journal

#: The daemons' heartbeat settings (the declared defaults): a member silent this long leaves.
HEARTBEAT = SETTINGS["heartbeat_interval"].default
HEARTBEAT_TIMEOUT = SETTINGS["heartbeat_timeout"].default


@dataclass
class DstConfig:
    networks: int = 4
    hosts: int = 3
    pages: int = 2000
    sites: int = 20
    seed: int = 1
    mode: str = "exact"
    #: Faults drawn for this seed (``faults`` = 0 and no ``schedule``: a clean run).
    faults: int = 3
    kinds: tuple[str, ...] = fl.KINDS
    #: An explicit schedule (replaces the drawn one).
    schedule: tuple[fl.Fault, ...] | None = None
    seeds: int = 6
    set_size: int = SimConfig.set_size
    answer_timeout: float = SETTINGS["answer_timeout"].default
    partition_policy: str | None = None
    #: Virtual seconds without progress (a page answered, a URL admitted), after the last
    #: fault ended, that make a run that is not quiescent a stall.
    stall_after: float = 600.0
    #: Virtual seconds after which a run is given up whatever happens.
    time_limit: float = 7200.0
    crawl: CrawlModel = field(default_factory=CrawlModel)
    #: The centers' ``routing`` (None: the daemons' default for the mode).
    routing: str | None = None
    #: URLs whose every step is kept (a violation's replay).
    watch: frozenset[str] = frozenset()


class World:
    def __init__(self, cfg: DstConfig):
        self.cfg = cfg
        self.sched = Scheduler(cfg.seed)
        self.synthetic = SyntheticWeb(WebSpec(pages=cfg.pages, sites=cfg.sites, seed=cfg.seed))
        self.crawl_model = cfg.crawl
        self.web = Web(self.synthetic, self.sched, cfg.crawl)
        self.web.on_answer = self._answered
        self.net = Network(self.sched, self._deliver, self._closed)
        self.schedule = sorted(cfg.schedule, key=lambda f: f.at) if cfg.schedule is not None else fl.schedule(
            cfg.seed, cfg.networks, cfg.hosts, cfg.faults, cfg.kinds)
        self.journaled = {self._node_of_target(f.target) for f in self.schedule if f.kind.startswith("power-")}
        self.configured = set(range(1, cfg.networks + 1)) - {
            int(f.target[4:]) for f in self.schedule if f.kind == "add-network"}
        #: Home routing's map (docs/PROTOCOL.md §11): every configured network's weight, and
        #: the maps before each change, as the operator's procedure gives them to every center.
        self.weights = {n: 1.0 for n in sorted(self.configured)}
        self.previous_weights: tuple[dict[int, float], ...] = ()
        self.nodes: dict[str, Node] = {}
        self.centers: dict[int, CenterNode] = {}
        self.hosts: dict[str, HostNode] = {}
        for n in range(1, cfg.networks + 1):
            self.centers[n] = c = CenterNode(self, self._center_settings(n))
            self.nodes[c.name] = c
            for i in range(cfg.hosts):
                h = HostNode(self, LocalSettings(n, host_ip(n, i), lan(n), (center_ip(n), 0), set_size=cfg.set_size,
                                                 mode=cfg.mode))
                self.hosts[h.name] = self.nodes[h.name] = h
        self.seed_urls = self.synthetic.seeds(cfg.seeds)
        # -- the history the checker reads
        self.admits: dict[str, list[int]] = defaultdict(list)  # URL -> networks that admitted it
        self.first_found: dict[str, float] = {}
        self.admit_latency: list[float] = []
        self.discovered: set[str] = set()
        self.destroyed: set[str] = set()  # URLs whose only record a fault destroyed
        self.forgotten_admissions: set[str] = set()  # admissions a fault took from a center's record
        self.fault_log: list[tuple[float, str]] = []
        self.watch_log: list[str] = []
        self.watched_numbers: set[int] = set()
        self.active: dict[int, fl.Fault] = {}
        self.pending = list(self.schedule)
        self.last_heal = 0.0
        self.silent: dict[tuple[str, str], object] = {}
        #: Failed dials in a row, per (dialler, target): RECONNECT's waits, as connect_forever's.
        self.failures: Counter[tuple[str, str]] = Counter()
        self.delivered: Counter[str] = Counter()
        self.delivered_bytes: Counter[str] = Counter()
        self.reach = self.synthetic.reachable_detail(self.seed_urls)
        self.target_total = max(1, len(self.reach.fetched))
        self.stalled = False
        self.quiet_at: float | None = None
        self.last_progress = 0.0

    # -- layout --------------------------------------------------------------------------
    def _center_settings(self, n: int) -> CenterSettings:
        c = self.cfg
        peers = [PeerAddress(m, center_ip(m), 0, lan(m)) for m in sorted(self.configured) if m != n]
        routing = {} if c.routing is None else {"routing": c.routing}
        return CenterSettings(n, center_ip(n), 0, lan(n), peers, mode=c.mode, answer_timeout=c.answer_timeout,
                              partition_policy=c.partition_policy,
                              weights=dict(self.weights), previous_weights=self.previous_weights, **routing)

    def journal_for(self, name: str) -> Journal:
        return Journal(lambda: self.sched.now, self.sched.rng.random(), name in self.journaled)

    def register_of(self, node: Node) -> Register:
        if isinstance(node, CenterNode):
            s = node.settings
            return Register(s.ip, s.network, "center", f"{s.ip}:7000", s.lan, homes=node.core.homes_described())
        s = node.settings
        return Register(s.ip, s.network, "host", f"{s.ip}:7000", s.lan)

    def start(self) -> None:
        for n in sorted(self.configured):
            self.centers[n].start()
        for h in self.hosts.values():
            if h.network in self.configured:
                h.start()
        plan = assign_seeds([h.name for h in self.hosts.values() if h.network in self.configured], self.seed_urls)
        for ip, urls in plan.items():
            self.push(self.hosts[ip], urls)

    def push(self, host: HostNode, urls: list[str]) -> None:
        host.store.push(urls)
        self.discovered.update(urls)
        host.wake()

    # -- connections (dedupnet/adapters/net/transport/client.py connect_forever) ---------------------
    def pair_of(self, a: str, b: str):
        return self.net.pair(a, b, wan=a.startswith("c") and b.startswith("c"))

    def dial(self, node: Node, target: str) -> None:
        failures = self.failures[(node.name, target)]
        if failures:
            delay = RECONNECT.delay(failures, self.sched.rng)
        else:  # at once: a first dial, or after a long session (the draw keeps each seed's run as it was)
            delay = 0.0
            self.sched.rng.random()
        node.after(delay, self._attempt, node, target)

    def _attempt(self, node: Node, target: str) -> None:
        if target.startswith("c") and int(target[1:]) not in self.configured:
            return  # no longer a peer
        p = self.pair_of(node.name, target)
        key = (node.name, target)
        if p.up:
            self.net.close(p, None)  # the other end still holds the old one: it is replaced
        tnode = self.nodes[target]
        epoch = None if tnode.state != "up" else self.net.connect(p)
        if epoch is None:
            self.failures[key] += 1
            node.after(RECONNECT.delay(self.failures[key], self.sched.rng), self._attempt, node, target)
            return
        # connect_forever: the Register goes first, then the session reads (and the host's
        # core hears Connected) before anything the other end sends can arrive.
        self.send(node, target, wire.encode(self.register_of(node)), epoch=epoch)
        if isinstance(node, HostNode):
            node.connected(epoch)

    def refuse(self, node: Node, other: str) -> None:
        self.net.close(self.pair_of(node.name, other), node.name)

    def send(self, node: Node, to: str, data: bytes, *, epoch: int | None = None) -> None:
        if epoch is None:
            epoch = node.epoch if isinstance(node, HostNode) else node.joined.get(to)
        if epoch is None or not self.net.send(self.pair_of(node.name, to), node.name, epoch, data,
                                              "wan" if to.startswith("c") and node.name.startswith("c") else "lan"):
            node.counters.inc("send_skipped")
            return
        self.sched.record_bytes(node.name, data)

    def _deliver(self, to: str, frm: str, epoch: int, data: bytes) -> None:
        node = self.nodes[to]
        message = wire.decode_one(data)
        where = "wan" if to.startswith("c") and frm.startswith("c") else "lan"
        kind = f"{where}:{kind_of(message)}"
        self.delivered[kind] += 1
        self.delivered_bytes[kind] += len(data)
        if self.cfg.watch:
            self._watch_message(frm, to, message)
        node.post(node.incarnation, node.receive, frm, epoch, message)

    def _watch_message(self, frm: str, to: str, message) -> None:
        urls = message.URL_set if isinstance(message, Frame) else message.URLs if isinstance(message, Task) else ()
        number = getattr(message, "number", None)
        for u in sorted(self.cfg.watch.intersection(urls)):
            value = f" = {message.URL_set[u]}" if isinstance(message, Frame) else ""
            self.note(f"{frm} -> {to}: {kind_of(message)} number {number} holds {u}{value}")
            self.watched_numbers.add(number)
        if isinstance(message, Ack) and number in self.watched_numbers:
            self.note(f"{frm} -> {to}: ack number {number} {message.status}")

    def _closed(self, end: str, other: str, epoch: int) -> None:
        node = self.nodes[end]
        p = self.pair_of(end, other)
        if self.sched.now - p.since >= RECONNECT.cap:
            self.failures[(end, other)] = 0
        node.post(node.incarnation, node.closed, other, epoch)

    # -- heartbeats (center_host/daemon.py _heartbeats) --------------------------------
    def heard(self, member: str, center: str) -> bool:
        m = self.nodes[member]
        return m.state == "up" and "frozen" not in m.paused and self.net.passes(member, center)

    def recheck(self) -> None:
        """A member whose heartbeats cannot arrive is closed ``heartbeat_timeout`` later
        (checked every ``heartbeat_interval``), unless they arrive again meanwhile."""
        for c in self.centers.values():
            if c.state != "up":
                continue
            for member, epoch in list(c.joined.items()):
                key = (c.name, member)
                if self.heard(member, c.name):
                    self.silent.pop(key, None)
                elif key not in self.silent:
                    token = self.silent[key] = object()
                    c.after(HEARTBEAT_TIMEOUT + HEARTBEAT * self.sched.rng.random(), self._silent_check, c, member,
                            epoch, token)

    def _silent_check(self, c: CenterNode, member: str, epoch: int, token: object) -> None:
        key = (c.name, member)
        if self.silent.get(key) is token and c.joined.get(member) == epoch:
            del self.silent[key]
            c.counters.inc("heartbeat_missed")
            self.net.close(self.pair_of(c.name, member), c.name)

    # -- what the checker needs ---------------------------------------------------------
    def note(self, text: str) -> None:
        self.watch_log.append(f"{self.sched.now:10.3f}  {text}")

    def found(self, host: HostNode, entries) -> None:
        now = self.sched.now
        for _, url in entries:
            self.first_found.setdefault(url, now)
        if self.cfg.watch:
            for eid, url in entries:
                if url in self.cfg.watch:
                    self.note(f"{host.name}: walker takes {url} (entry {eid.decode()}) from URL_pool")

    def admitted(self, center: CenterNode, urls) -> None:
        now = self.sched.now
        self.last_progress = now
        for url in urls:
            self.admits[url].append(center.network)
            t = self.first_found.get(url)
            if t is not None:
                self.admit_latency.append(now - t)
            if url in self.cfg.watch:
                self.note(f"{center.name}: admits {url}")

    def _answered(self, url: str, host: str) -> None:
        self.last_progress = self.sched.now
        if url in self.cfg.watch:
            self.note(f"{host}: fetched {url}")
        while self.pending and self.pending[0].at * self.target_total <= len(self.web.answered):
            f = self.pending.pop(0)
            self.sched.at(self.sched.now, self.fire, f)

    def pushed(self, links) -> None:
        self.discovered.update(links)

    # -- faults -------------------------------------------------------------------------
    def _node_of_target(self, target: str) -> str:
        if target.startswith("host:"):
            n, i = target[5:].split(".")
            return host_ip(int(n), int(i))
        if target.startswith("center:"):
            return f"c{int(target[7:])}"
        return target

    def _link_of(self, target: str) -> tuple[str, str]:
        if target.startswith("wan:"):
            a, b = target[4:].split(":")[0].split("-")
            return f"c{a}", f"c{b}"
        n, i = target[4:].split(":")[0].split(".")
        return host_ip(int(n), int(i)), f"c{n}"

    def fire(self, f: fl.Fault) -> None:
        self.fault_log.append((self.sched.now, str(f)))
        self.note(f"FAULT {f}")
        index = len(self.fault_log)
        end = getattr(self, "_" + f.kind.replace("-", "_"))(f)
        if end is not None:
            self.active[index] = f
            self.sched.after(f.duration, self._heal, index, f, end)
        else:
            self.last_heal = self.sched.now

    def _heal(self, index: int, f: fl.Fault, end) -> None:
        self.note(f"HEAL {f}")
        end()
        del self.active[index]
        self.last_heal = self.sched.now
        self.recheck()

    def _process_node(self, f: fl.Fault) -> Node | None:
        node = self.nodes[self._node_of_target(f.target)]
        if node.lost or (isinstance(node, HostNode) and node.network not in self.configured):
            return None
        if isinstance(node, CenterNode) and node.network not in self.configured:
            return None
        return node

    def _crash(self, node: Node, *, fin: bool) -> None:
        """The process is gone; with ``fin`` its kernel closes its connections."""
        if node.state != "up":
            return
        node.stop()
        for p in list(self.net.pairs.values()):
            if p.up and node.name in (p.a, p.b) and fin:
                self.net.close(p, node.name)
        self.recheck()

    def _restart(self, node: Node) -> None:
        if node.lost or node.state == "up":
            return
        for p in list(self.net.pairs.values()):
            if p.up and node.name in (p.a, p.b):
                self.net.close(p, None)  # a machine that comes back answers old connections with RST
        node.start()
        self.recheck()

    def _restart_later(self, node: Node):
        return lambda: self._restart(node)

    def _crash_host(self, f):
        node = self._process_node(f)
        if node is None:
            return None
        self._crash(node, fin=True)
        return self._restart_later(node)

    _crash_center = _crash_host

    def _power_host(self, f):
        node = self._process_node(f)
        if node is None:
            return None
        self._crash(node, fin=False)
        before = Counter(node.store.records())
        admitted = set(node.store.admitted) if isinstance(node, CenterNode) else set()
        lost = node.store.journal.lose_unsynced()
        self.destroyed |= {u for _, u in before - Counter(node.store.records())}  # a record of it is gone
        if isinstance(node, CenterNode):
            self.forgotten_admissions |= admitted - node.store.admitted
        self.note(f"{node.name}: Redis lost {lost} writes not yet fsynced")
        return self._restart_later(node)

    _power_center = _power_host

    def _wipe_host(self, f):
        node = self._process_node(f)
        if node is None:
            return None
        self._crash(node, fin=False)
        self.destroyed |= set(node.store.contents())
        node.store.wipe()
        return self._restart_later(node)

    def _lost_host(self, f):
        node = self._process_node(f)
        if node is None:
            return None
        self._crash(node, fin=False)
        node.lost = True
        return None

    def _freeze_host(self, f):
        node = self._process_node(f)
        if node is None or node.state != "up":
            return None
        node.pause("frozen")
        self.recheck()

        def thaw():
            if isinstance(node, CenterNode):  # its own pause is not counted against anyone
                for key in [k for k in self.silent if k[0] == node.name]:
                    del self.silent[key]
            node.unpause("frozen")
        return thaw

    _freeze_center = _freeze_host

    def _redis_outage(self, f):
        node = self._process_node(f)
        if node is None or node.state != "up":
            return None
        node.pause("redis")
        return lambda: node.unpause("redis")

    def _cut(self, f, directions):
        for frm, to in directions:
            self.net.set_cut(frm, to, True)
        self.recheck()

        def heal():
            for frm, to in directions:
                self.net.set_cut(frm, to, False)
        return heal

    def _partition_wan(self, f):
        a, b = self._link_of(f.target)
        return self._cut(f, [(a, b), (b, a)])

    _partition_lan = _partition_wan

    def _half_open(self, f):
        a, b = self._link_of(f.target)
        return self._cut(f, [(a, b)] if f.target.endswith(":up") else [(b, a)])

    def _reset(self, f):
        a, b = self._link_of(f.target)
        self.net.close(self.pair_of(a, b), None)
        return None

    def _slow_wan(self, f):
        a, b = self._link_of(f.target)
        key = frozenset((a, b))
        self.net.slow[key] = 20 + 80 * self.sched.rng.random()
        return lambda: self.net.slow.pop(key, None)

    def _reconfigure(self) -> None:
        """Every running center restarts with the new configuration, one after the other
        over some seconds as an operator goes round them (its Redis keeps everything);
        meanwhile centers on different maps refuse to peer."""
        for n in sorted(self.configured):
            c = self.centers[n]
            c.settings = self._center_settings(n)
            if c.state == "up":
                self.sched.after(10 * self.sched.rng.random(), self._restart_configured, c)

    def _restart_configured(self, c: CenterNode) -> None:
        if c.state == "up" and not c.lost:
            self._crash(c, fin=True)
            self._restart(c)

    def routes_home(self) -> bool:
        return self.centers[min(self.configured)].core.homes is not None

    def _new_map(self, weights: dict[int, float]) -> None:
        """§11 "Changing the map": every center gets the new map and the one before it."""
        self.previous_weights = (dict(self.weights), *self.previous_weights)
        self.weights = weights

    def _add_network(self, f):
        n = int(f.target[4:])
        if n in self.configured:
            return None
        self.configured.add(n)
        self._new_map({**self.weights, n: 1.0})
        self._reconfigure()
        self.centers[n].start()
        for h in self.hosts.values():
            if h.network == n:
                h.start()
        extra = self.synthetic.seeds(self.cfg.seeds + 1)[-1]
        self.push(self.hosts[host_ip(n, 0)], [extra])
        self.reach = self.synthetic.reachable_detail([*self.seed_urls, extra])
        self.target_total = max(1, len(self.reach.fetched))
        return None

    def _remove_network(self, f):
        n = int(f.target[4:])
        if n not in self.configured or len(self.configured) < 2 or not self.weights.get(n):
            return None
        if self.routes_home():
            # Retired (§11): home to no site, its center still answers for its past and its
            # hosts crawl what they were given.
            self._new_map({**self.weights, n: 0.0})
            self._reconfigure()
            return None
        self.configured.discard(n)
        # From now on nothing is known of what it admitted (docs/PROTOCOL.md §10).
        self.forgotten_admissions |= self.centers[n].store.admitted
        for node in [self.centers[n], *(h for h in self.hosts.values() if h.network == n)]:
            self._crash(node, fin=True)
            node.lost = True
        self._reconfigure()
        return None

    # -- the end -------------------------------------------------------------------------
    def gone(self, node: Node) -> bool:
        return node.lost or node.network not in self.configured

    def busy(self) -> list[str]:
        """What still has work (empty: quiescent)."""
        out = []
        if self.active:
            out.append(f"{len(self.active)} faults not healed")
        if self.net.in_flight:
            out.append(f"{self.net.in_flight} messages in flight")
        lost_hosts = {h.name for h in self.hosts.values() if self.gone(h)}
        for h in self.hosts.values():
            if self.gone(h):
                continue
            if h.state != "up" or h.paused:
                out.append(f"{h.name} {h.state} {sorted(h.paused)}")
                continue
            s = h.store
            if len(s.url_pool) or s.unacked or len(s.task_pool) or h.core.held:
                out.append(f"{h.name}: URL_pool {len(s.url_pool)}, unacked {len(s.unacked)}, "
                           f"task_pool {len(s.task_pool)}")
        for c in self.centers.values():
            if self.gone(c):
                continue
            if c.state != "up" or c.paused:
                out.append(f"{c.name} {c.state} {sorted(c.paused)}")
                continue
            tasks = [k for k in c.core.members.tasks if k.split(":", 1)[1] not in lost_hosts]
            # A lost host's ledger is re-issued once it has been silent for reissue_after.
            held = sum(len(urls) for ip, urls in c.core.members.ledger.items() if ip in lost_hosts)
            if c.core.stages.sets or c.core.stages.waiting or tasks or held:
                out.append(f"{c.name}: {len(c.core.stages.sets)} sets, {len(c.core.stages.waiting)} held frames, "
                           f"{len(tasks)} task keys, {held} URLs of lost hosts to re-issue")
        return out

    def stranded(self) -> set[str]:
        """URLs held only by daemons that are gone for good: what their stores hold but
        their tasks. What a live center gave a lost host is not among them: its ledger
        re-issues it."""
        out: set[str] = set()
        for node in self.nodes.values():
            if node.lost:
                out.update(u for place, u in node.store.records() if place != "task_pool")
        return out

    def run(self) -> None:
        self.start()

        def done() -> bool:
            if not self.busy():
                self.pending.clear()  # any left: the crawl ended before their turn
                return True
            since = self.sched.now - max(self.last_heal, self.last_progress)
            if since > self.cfg.stall_after and not self.active:
                self.stalled = True
                return True
            return False

        self.sched.run(self.cfg.time_limit, done)
        if self.busy() and not self.stalled:
            self.stalled = True
        self.quiet_at = self.sched.now
