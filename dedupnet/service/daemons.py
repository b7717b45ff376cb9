"""From settings to running daemons, and the small clients of ``dedupnet status``,
``push`` and ``finish``. Defaults are filled here, once, for the CLI and config file."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import orjson
import redis
import trio

from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress
from local_host.crawler.crawl import CrawlerSettings
from local_host.daemon import LocalDaemon, LocalSettings
from local_host.pools import HostPools

from dedupnet.adapters import heap
from dedupnet.adapters.storage import bloom

from dedupnet.codec.auth import keyring_from
from dedupnet.codec.homes import parse_weights
from dedupnet.service.config import Settings, endpoint, frontier_endpoint, load_settings, values_for
from dedupnet.service.exposure import check_exposure, check_frontier_exposure, warn_open_secrets, warn_while_running
from dedupnet.adapters.monitor.census import StatusRefused, fetch_status, format_report, survey
from dedupnet.adapters.net.discovery import Answer, Search, Target, find_center
from dedupnet.codec.errors import BadURL, DiscoveryError, SettingsError
from dedupnet.codec.urls import normalize
from dedupnet.codec.numbers import check_network
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.netinfo import address_in, broadcast_targets, center_lan, lan_of, sole_address, source_ip_towards
from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.net.listen import check_free
from dedupnet.adapters.runtime import RedisDied, open_store, stop_on_signals, supervise_redis
from dedupnet.adapters.storage.store_choice import store_for
from dedupnet.adapters.net.tls import TLSConfig

log = logging.getLogger("dedupnet.service.daemons")


def parse_peer(text: str) -> PeerAddress:
    try:
        network, address, cidr = text.split(",")
        host, port = endpoint(address)
        network = int(network)
    except ValueError:
        raise ValueError(f"--peer wants NETWORK,HOST:PORT,CIDR, got {text!r}") from None
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:  # the peer's LAN: a center would match no host of it, silently
        raise ValueError(f"--peer {text!r}: CIDR {cidr!r} is not a network ({exc})") from None
    return PeerAddress(check_network(network, f"--peer {text!r}: NETWORK"), host, port, cidr)


def _need(settings: Settings, *names: str) -> None:
    missing = [n for n in names if getattr(settings, n) is None]
    if missing:
        raise ValueError("missing setting(s): " + ", ".join("--" + n.replace("_", "-") for n in missing))
    if settings.lan is not None:  # a LAN that is no network would match no host, silently
        try:
            ipaddress.ip_network(settings.lan, strict=False)
        except ValueError as exc:
            raise ValueError(f"--lan {settings.lan!r} is not a network in CIDR notation ({exc})") from None


def _data_dir(settings: Settings, default: str) -> str | None:
    if settings.redis_url is not None:
        return None
    path = Path(settings.data_dir or default)
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def http_endpoint(settings: Settings) -> tuple[str, int] | None:
    """``--http``: the status page, /status.json and /metrics."""
    return endpoint(settings.http) if settings.http else None


def _check_addresses(listen: tuple[str, int], http: tuple[str, int] | None) -> None:
    """The addresses the daemon will listen on are free, before its Redis starts."""
    check_free(*listen, "--listen")
    if http is not None:
        check_free(*http, "--http")


def _tls(settings: Settings, role: str, network: int, ip: str | None = None) -> TLSConfig | None:
    """The daemon's TLS files, checked now (ValueError names what is missing), and that
    its certificate is this daemon's (SettingsError names the file)."""
    config = TLSConfig.from_settings(settings.tls_cert, settings.tls_key, settings.tls_ca, settings.lan_tls,
                                     role=role)
    if config is not None:
        config.check_names(role, network, ip)
    return config


def run_center(settings: Settings) -> int:
    _bound_heap()
    _need(settings, "network", "listen")
    listen_host, port = endpoint(settings.listen)
    peers = [parse_peer(p) for p in settings.peers]
    ip, lan = center_identity(settings, listen_host, peers)
    warning = check_exposure(settings, "center", (listen_host, port), has_peers=bool(peers))
    center = CenterSettings(
        network=settings.network, ip=ip, port=port, lan=lan, peers=peers, listen_host=listen_host,
        metrics=http_endpoint(settings), tls=_tls(settings, "center", settings.network),
        discovery_port=settings.discovery_port if settings.discovery else None,
        recrawl=settings.recrawl(), weights=parse_weights(settings.weights),
        previous_weights=tuple(parse_weights(w) for w in settings.previous_weights),
        **values_for(settings, CenterSettings),
    )
    _check_addresses((listen_host, port), center.metrics)
    warn_open_secrets(settings)
    data_dir = _data_dir(settings, f"dedupnet-data/center{settings.network}")
    with open_store(settings.redis_url, settings.prefix or f"dedupnet:center{settings.network}",
                    data_dir=data_dir, bucket_bits=settings.bucket_bits, durable_acks=settings.durable_acks,
                    maxmemory=settings.redis_maxmemory) as (store, server):
        return _run(_until_signalled, CenterDaemon(center, store), server, warning)


def _bound_heap() -> None:
    """glibc's malloc bounded before the daemon starts a thread (dedupnet/adapters/heap.py:
    an arena per worker thread and a sliding mmap threshold made hosts' RSS creep)."""
    done = heap.bound()
    if done:
        log.debug("malloc bounded: %s", ", ".join(f"{k} {v}" for k, v in done.items()))


def center_identity(settings: Settings, listen_host: str, peers: list[PeerAddress]) -> tuple[str, str]:
    """A center's ``(ip, lan)``: as given, else from ``--listen``, else detected
    (:mod:`dedupnet.adapters.net.netinfo`): the address towards the first peer and the interface
    that is not the way to the peers; the sole address without peers."""
    if settings.ip:
        return settings.ip, settings.lan or lan_of(settings.ip)
    if listen_host not in ("0.0.0.0", "::"):
        return listen_host, settings.lan or lan_of(listen_host)
    if peers:
        ip = source_ip_towards(peers[0].host)
        return ip, settings.lan or center_lan(ip)
    if settings.lan:
        ip = address_in(settings.lan)
        return ip, settings.lan
    ip = sole_address() or "127.0.0.1"
    return ip, lan_of(ip)


def run_local(settings: Settings) -> int:
    _bound_heap()
    _need(settings, "center")
    counters = Counters()
    if settings.center == "auto":
        found = discover_center(settings, counters)
        if found is None:
            return 0  # a signal stopped the search
        center, network = found.endpoint, found.network
    else:
        _need(settings, "network")
        center, network = endpoint(settings.center), settings.network
    ip = settings.ip or source_ip_towards(center[0])
    listen_host, port = endpoint(settings.listen) if settings.listen else (ip, 0)
    warning = check_exposure(settings, "host", (listen_host, port))
    frontier = frontier_endpoint(settings.frontier) if settings.frontier else None
    if frontier is not None:
        warning = "; ".join(w for w in (warning, check_frontier_exposure(settings, frontier)) if w) or None
    local = LocalSettings(
        network=network, ip=ip, lan=settings.lan or lan_of(ip), center=center, listen_port=port,
        listen_host=listen_host, metrics=http_endpoint(settings),
        crawler=crawler_settings(settings, ip) if settings.crawl else None, seeds=_seeds(settings),
        tls=_tls(settings, "host", network, ip), recrawl=settings.recrawl(), frontier=frontier,
        **values_for(settings, LocalSettings),
    )
    _check_addresses((listen_host, port), local.metrics)
    warn_open_secrets(settings)
    data_dir = _data_dir(settings, f"dedupnet-data/host-{ip}")
    with open_store(settings.redis_url, settings.prefix or f"dedupnet:host:{ip}", data_dir=data_dir,
                    bucket_bits=settings.bucket_bits, durable_acks=settings.durable_acks,
                    maxmemory=settings.redis_maxmemory) as (store, server):
        bloom.attach(store, bloom.spec_from(settings))  # finish_url_filter = "bloom": dedupnet/adapters/storage/bloom.py
        return _run(_until_signalled_leaving, LocalDaemon(local, store, counters), server, warning)


#: Seconds a daemon whose Redis died for good has to unwind before it exits anyway: a
#: store call blocked in a worker thread (on a port that accepts and never answers) cannot
#: be cancelled, and must not keep the process alive and stuck.
EXIT_GRACE = 5.0


def _run(main, daemon, server: EmbeddedRedis | None, warning: str | None = None) -> int:
    """Run ``main(daemon)`` with its embedded Redis supervised (:func:`supervise_redis`)
    and, with ``warning`` (``--insecure``), that warning repeated while it runs: 0 when
    a signal stopped it, 1 (after one line saying why) when its Redis died for good."""
    died: list[RedisDied] = []

    async def supervise(cancel_scope: trio.CancelScope) -> None:
        try:
            await supervise_redis(server, daemon.counters)
        except RedisDied as exc:
            died.append(exc)
            log.critical("exiting: %s", exc)
            exit_anyway = threading.Timer(EXIT_GRACE, os._exit, (1,))
            exit_anyway.daemon = True
            exit_anyway.start()
            cancel_scope.cancel()

    async def supervised() -> None:
        async with trio.open_nursery() as nursery:
            if server is not None:
                nursery.start_soon(supervise, nursery.cancel_scope)
            if warning:
                nursery.start_soon(warn_while_running, warning)
            await main(daemon)
            nursery.cancel_scope.cancel()

    trio.run(supervised)
    return 1 if died else 0


def discover_center(settings: Settings, counters: Counters) -> Answer | None:
    """``--center auto``: the center that answers this host's LAN discovery query
    (dedupnet/adapters/net/discovery.py), sent to ``discovery_address`` or to the broadcast address
    of each of its IPv4 interfaces; None if SIGINT/SIGTERM stopped the search.
    DiscoveryError if no center (or more than one) answers within ``discovery_timeout``."""
    if settings.discovery_address:
        targets = [Target(settings.discovery_address, settings.ip)]
    else:
        targets = [Target(broadcast, address, f" via {name} {address}")
                   for name, address, broadcast in broadcast_targets(settings.ip, settings.lan)]
    search = Search(settings.network, keyring_from(settings.lan_key_file), counters)
    log.info("looking for the center%s on UDP port %d: %s", f" of network {settings.network}" if settings.network
             else "", settings.discovery_port, ", ".join(f"{t.address}{t.via}" for t in targets) or "nowhere")

    outcome: dict[str, Answer | DiscoveryError] = {}

    async def search_until_signalled() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signals, nursery.cancel_scope)
            try:  # raised here, not through the nursery (which would wrap it in an ExceptionGroup)
                outcome["answer"] = await find_center(search, targets, settings.discovery_port,
                                                      settings.discovery_timeout)
            except DiscoveryError as exc:
                outcome["error"] = exc
            nursery.cancel_scope.cancel()

    started = time.monotonic()
    trio.run(search_until_signalled)
    if "error" in outcome:
        raise outcome["error"]
    answer = outcome.get("answer")  # none: a signal stopped the search
    if answer is not None:
        log.info("found the center of network %d at %s (LAN %s) in %.2f s", answer.network, answer.center,
                 answer.lan, time.monotonic() - started)
    return answer


def crawler_settings(settings: Settings, ip: str) -> CrawlerSettings:
    return CrawlerSettings(
        concurrency=settings.concurrency, per_site_concurrency=settings.per_site_concurrency,
        per_site_delay=settings.per_site_delay, max_depth=settings.max_depth,
        allowed_domains=frozenset(settings.allowed_domains), respect_robots=settings.respect_robots,
        store_dir=settings.store_dir, recrawl_interval=settings.recrawl_interval,
        local_address=ip,  # requests come from the host's own IP, as its frames do (the web can tell who fetched)
    )


def _seeds(settings: Settings) -> list[str]:
    """The seeds, each checked now: one the pools would refuse (``example.com/page``, no
    scheme) would otherwise be dropped in silence, and the host would sit idle."""
    seeds = [_seed(url, f"--seed {url!r}", settings) for url in settings.seeds]
    if settings.seeds_file:
        for number, line in enumerate(Path(settings.seeds_file).read_text().splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                seeds.append(_seed(line, f"seeds_file {settings.seeds_file} line {number}: {line!r}", settings))
    return seeds


def _seed(url: str, where: str, settings: Settings) -> str:
    try:
        normalize(url, max_length=settings.max_url_length)
    except BadURL as exc:
        raise SettingsError(f"{where} is not a seed URL: {exc} (a seed is a whole http:// or https:// URL)",
                            reason="bad-seed") from None
    return url


async def _until_signalled(daemon) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signals, nursery.cancel_scope)
        await daemon.run()


async def _until_signalled_leaving(daemon: LocalDaemon) -> None:
    """A host stopped by SIGTERM or SIGINT leaves its LAN: nobody can tell whether it
    will come back, so it must not keep work only it would do. It takes no new task at
    once, lets the pages on the wire finish (``stop_grace``), lets URL_pool drain
    through the protocol and hands its task_pool back to its center
    (:meth:`LocalDaemon.leave`), then exits. Not connected to its center, past
    ``stop_timeout``, or at a second signal, it exits as it is: what was not handed back
    stays in its Redis (task_pool, URL_pool), resumed when it starts again or moved by
    ``dedupnet reassign`` at its center. With ``exit_when_complete`` a host leaves the
    same way once its center says the whole crawl is complete (``LocalDaemon.complete``)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_leave_on_signals, daemon, nursery.cancel_scope)
        await daemon.run()


async def _left_behind(daemon: LocalDaemon) -> str:
    """What stays in the host's Redis, and how it is recovered, in words for one log line."""
    held = "task_pool and URL_pool stay"
    with trio.move_on_after(1.0):  # a Redis that does not answer must not hold the exit
        try:
            sizes = await daemon.store.run(daemon.pools.sizes)
        except Exception:  # noqa: BLE001 - a Redis that is gone must not turn a stop into a failure
            sizes = None
        if sizes is not None:
            held = f"{sizes['task_pool']} tasks in task_pool and {sizes['URL_pool']} URLs in URL_pool stay"
    s = daemon.settings
    return (f"{held} in this host's Redis: crawled when it starts again, or moved by `dedupnet reassign --host "
            f"{s.ip} --data-dir DATA_DIR` at its center {s.center[0]}:{s.center[1]}")


async def _first_stop(daemon: LocalDaemon, signals) -> str:
    """Why the host stops: the first signal received, or the crawl complete."""
    why: list[str] = []
    async with trio.open_nursery() as nursery:
        async def on_signal() -> None:
            async for signum in signals:
                why.append(f"{signal.Signals(signum).name} received")
                break
            nursery.cancel_scope.cancel()

        async def on_complete() -> None:
            await daemon.complete.wait()
            why.append(f"the crawl is complete in every network (the center at {daemon.census.where} says; "
                       "exit_when_complete)")
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_signal)
        nursery.start_soon(on_complete)
    return why[0]


async def _leave_on_signals(daemon: LocalDaemon, scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        why = await _first_stop(daemon, signals)
        if daemon.conn is None:
            if daemon.crawler is not None:
                daemon.crawler.stop_taking()
            log.warning("%s, not connected to the center: stopping now; %s", why, await _left_behind(daemon))
            scope.cancel()
            return
        log.info("%s: taking no new task, letting the pages on the wire finish (up to %g s), then handing "
                 "the rest back to the center (SIGTERM to stop at once)", why, daemon.settings.stop_grace)
        async with trio.open_nursery() as inner:
            async def second_signal() -> None:
                async for again in signals:
                    log.warning("%s received: stopping now; %s", signal.Signals(again).name,
                                await _left_behind(daemon))
                    inner.cancel_scope.cancel()
                    return
            inner.start_soon(second_signal)
            try:
                await daemon.leave()
            except trio.TooSlowError:
                daemon.counters.inc("leave_failed", reason="timeout")
                log.warning("the stop took longer than %g s (stop_timeout): stopping now; %s",
                            daemon.settings.stop_timeout, await _left_behind(daemon))
            except Exception as e:  # noqa: BLE001 - Redis gone, connection lost: stop as it is, never crash
                daemon.counters.inc("leave_failed", reason="error")
                log.warning("the hand-back failed (%r): stopping now; %s", e, await _left_behind(daemon))
            inner.cancel_scope.cancel()
    scope.cancel()


# -- dedupnet status ------------------------------------------------------------------
def status_target(address: str | None, config: str | None,
                  key_files: list[str] | None) -> tuple[tuple[str, int], list[str]]:
    """Where ``dedupnet status`` (or ``reassign``) asks and with which keys: as given,
    else what the daemon's own config file says (its ``listen`` address and
    ``lan_key_file``), so an operator need not repeat the key file the daemon names."""
    settings = load_settings(config) if config else None
    if address is None:
        if settings is None or settings.listen is None:
            raise ValueError("give the daemon's HOST:PORT, or --config FILE of a daemon with a listen address")
        address = settings.listen
    keys = list(key_files or [])
    if not keys and settings is not None and settings.lan_key_file:
        keys = [settings.lan_key_file]
    host, port = endpoint(address)
    return (WILDCARD_TO_LOOPBACK.get(host, host), port), keys


#: A daemon listening on every address is asked on loopback.
WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def print_status(address: tuple[str, int], *, as_json: bool = False, key_file: str | None = None) -> int:
    where = f"{address[0]}:{address[1]}"
    try:
        body = trio.run(fetch_status, address, 5.0, key_file)
    except (OSError, trio.TooSlowError) as e:
        why = "none within 5 s" if isinstance(e, trio.TooSlowError) else e.strerror or str(e)
        print(f"dedupnet status: no answer from {where}: {why}", file=sys.stderr)
        return 1
    except StatusRefused as e:
        print(f"dedupnet status: {where} did not give its status: {e}", file=sys.stderr)
        return 1
    if as_json:
        print(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(format_status(body))
    return 0


def print_cluster_status(address: tuple[str, int], *, as_json: bool = False, key_files: list[str] = ()) -> int:
    """``dedupnet status --cluster``: every reachable center and its hosts, and one
    verdict (dedupnet/adapters/monitor/census.py); exit status 0 complete, 3 in progress, 4 stuck,
    5 not started."""
    keyrings = [keyring_from(f) for f in key_files] or [None]
    report = trio.run(survey, address, keyrings)
    if not report["networks"] and report["unreachable"]:
        u = report["unreachable"][0]
        print(f"dedupnet status: no answer from {u['address']}: {u['why']}", file=sys.stderr)
        return 1
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if as_json else format_report(report))
    return {"complete": 0, "in progress": 3, "stuck": 4, "not started": 5}[report["verdict"]]


def format_status(body: dict) -> str:
    head = f"{body.get('role')} {body.get('listen') or body.get('ip')}  network {body.get('network')}  {body.get('mode')} mode"
    lines = [head]
    if "connected" in body:
        lines.append(f"  center {body['center']}: {'connected' if body['connected'] else 'NOT connected'}")
    lines.append("  pools:          " + ", ".join(f"{k} {v}" for k, v in body.get("pools", {}).items()))
    lines.append("  sets in flight: " + (", ".join(f"{k} {v}" for k, v in body.get("sets_in_flight", {}).items()) or "none"))
    if "waiting_for" in body:
        lines.append(f"  waiting for ({body.get('partition_policy')}): "
                     + (", ".join(f"{m} {n} sets" for m, n in sorted(body["waiting_for"].items())) or "nobody"))
    for network, urls in body.get("waiting_for_networks", {}).items():
        lines.append(f"  waiting for network {network.removeprefix('net:')}: {urls} URLs (of its sites, held here)")
    if "members" in body:
        lines.append("  members (seconds since last heartbeat):")
        lines += [f"    {m:<18} {age:>6.1f}" for m, age in body["members"].items()] or ["    none"]
    lines.append("  counters:")
    lines += [f"    {k:<58} {v:>10}" for k, v in sorted(body.get("counters", {}).items())]
    return "\n".join(lines)


# -- dedupnet push / finish ------------------------------------------------------------
def push_or_finish(settings: Settings, command: str, urls: list[str], *, data_dir: str | None) -> int:
    url = settings.redis_url or daemon_redis_url(data_dir)
    if settings.prefix is None and settings.ip is None:
        raise ValueError("give --ip of the host (or its --prefix)")
    store = store_for(url, settings.prefix or f"dedupnet:host:{settings.ip}", bucket_bits=settings.bucket_bits)
    bloom.attach(store, bloom.spec_from(settings))
    try:
        if settings.redis_url is None:
            _answers(store, data_dir)
        pools = HostPools(store, exact=settings.mode == "exact", recrawl=settings.recrawl())
        if command == "push":
            n = pools.push(urls)
            print(json.dumps({"pushed": n, "rejected": len(urls) - n}))
        else:
            print(json.dumps({"finished_new": pools.finish(urls), "given": len(urls)}))
    finally:
        store.close()
    return 0


def daemon_redis_url(data_dir: str | None) -> str:
    """The embedded Redis of the host daemon that runs in ``data_dir`` (it writes the
    server's URL to ``redis.url`` there while it runs)."""
    if data_dir is None:
        raise ValueError("give --redis URL, or --data-dir of the host daemon whose embedded Redis to use")
    url_file = Path(data_dir) / "redis.url"
    if not url_file.is_file():
        raise ValueError(f"no daemon found in {data_dir}: it has no redis.url, which a running host daemon "
                         f"keeps there (start `dedupnet local --data-dir {data_dir}`, or give --redis URL)")
    return url_file.read_text().strip()


def _answers(store, data_dir: str) -> None:
    """One ping, no retries: a redis.url left by a daemon that was killed names a server
    that is gone, and the store's retries would only delay saying so."""
    try:
        store.redis.ping()
    except redis.RedisError:
        raise ValueError(f"no daemon found in {data_dir}: its redis.url names {store.url}, which does not answer "
                         "(the host daemon is not running: start it again)") from None
