"""Settings: defaults, then a TOML config file, then command-line flags (last wins).

The file is flat ``key = value`` TOML whose keys are the field names below; an
unknown key is an error that names it, so a typo never passes silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from center_host.protocol import FOREIGN_LOOKUPS, LOCAL_LOOKUPS, PARTITION_POLICIES, ROUTINGS
from dedupnet.codec.homes import parse_weights
from dedupnet.codec.numbers import check_network

MODES = ("exact", "paper")


@dataclass
class Settings:
    #: Redis to use; none = start the embedded server.
    redis_url: str | None = None
    #: Key prefix of this host's or center's pools on that server.
    prefix: str | None = None
    #: Fingerprint sets are split into 2**bucket_bits intsets (see dedupnet/adapters/store.py).
    bucket_bits: int = 10
    #: A host's ``finish_URL``: ``exact`` (intsets, ~8 bytes a URL) or ``bloom`` (a Bloom
    #: filter, ~1.8 bytes a URL at 0.1 %: each false positive is a URL never crawled;
    #: dedupnet/adapters/bloom.py, docs/DECISIONS.md).
    finish_url_filter: str = "exact"
    #: URLs the Bloom filter is sized for; past it the false-positive rate climbs.
    bloom_capacity: int = 10_000_000
    #: The Bloom filter's false-positive rate at ``bloom_capacity`` URLs.
    bloom_error_rate: float = 0.001
    #: URLs per URL_set (paper §2.2 step 3: "a fixed size").
    set_size: int = 1000
    #: Seconds a host waits for a URL_set to fill before sending it part full (like a
    #: message producer's linger): full sets cost the centers far less per URL.
    set_linger: float = 0.5
    #: Largest frame body accepted from the network, checked before reading it.
    max_frame_size: int = 4 * 1024 * 1024
    #: Largest URL_set accepted from the network.
    max_urls_per_set: int = 10_000
    #: Longest normalised URL admitted into a pool.
    max_url_length: int = 2048
    #: ``exact`` (no URL admitted twice) or ``paper`` (the paper's look-ups only).
    mode: str = "exact"
    log_level: str = "INFO"

    # -- the daemons (``dedupnet center`` / ``dedupnet local``) -------------------------
    #: This LAN's network id (1..65535), part of every ``number``.
    network: int | None = None
    #: This host's or center's IP: its identity (paper §2.1). Default: the address that
    #: reaches the center (hosts) or the first peer (centers), per netifaces.
    ip: str | None = None
    #: The LAN in CIDR notation. Default: the netmask of the interface holding ``ip``.
    lan: str | None = None
    #: ``host:port`` to listen on (center: hosts and peers; host: status). Host default: ip:0.
    listen: str | None = None
    #: ``host:port`` of this host's center, or ``auto``: found by LAN discovery.
    center: str | None = None
    #: LAN discovery (paper gap 5, dedupnet/adapters/discovery.py): a center answers hosts started
    #: with ``center = "auto"`` on UDP ``discovery_port`` unless ``discovery = false``.
    discovery: bool = True
    discovery_port: int = 7799
    #: A host with ``center = "auto"``: where its queries go (default: the broadcast
    #: address of each of its IPv4 interfaces, of ``ip`` or in ``lan`` if given), and
    #: for how long it asks before it gives up with an error.
    discovery_address: str | None = None
    discovery_timeout: float = 30.0
    #: Peer networks of a center: ``"NETWORK,HOST:PORT,CIDR"`` each.
    peers: list[str] = dataclasses.field(default_factory=list)
    #: Where the embedded Redis keeps its append-only file (daemons only).
    data_dir: str | None = None
    #: ``host:port`` of the daemon's HTTP endpoint: Prometheus metrics at /metrics, the
    #: live status page at / and its JSON at /status.json (docs/STATUS.md).
    http: str | None = None
    #: The old name of ``http`` (it served /metrics only); still accepted.
    metrics: str | None = None
    #: Seconds to wait for answers to a broadcast before re-sending (paper gap 3).
    answer_timeout: float = 2.0
    #: Re-sends to silent members before a set is concluded incomplete (``admit``), or
    #: before re-sends slow down (``wait``).
    max_resends: int = 2
    #: A member that does not answer: ``wait`` (exact mode's default: never conclude
    #: without a live member; a set whose peer network is down waits for it) or ``admit``
    #: (paper mode's default: conclude after ``max_resends``, counted). docs/PROTOCOL.md §10.
    partition_policy: str | None = None
    #: Who answers another network's set (§2.4): ``center`` (exact mode's default: the
    #: center's admitted record speaks for its LAN) or ``lan`` (the paper: every LAN host).
    foreign_lookup: str | None = None
    #: Who answers this LAN's own sets (§2.3): ``center`` (exact mode's default: the
    #: center's admitted record, no LAN broadcast) or ``lan`` (the paper: every other host).
    local_lookup: str | None = None
    #: Exact mode, a center: where a URL is decided (docs/PROTOCOL.md §11). ``home`` (the
    #: default): by the center of its site's home network alone; ``broadcast``: by asking
    #: every peer network (§10). Every center of the system must have the same.
    routing: str | None = None
    #: ``routing = "home"``: each network's share of the sites, ``"NETWORK=WEIGHT"`` each
    #: (1 for a network not named). Every center must have the same list.
    weights: list[str] = dataclasses.field(default_factory=list)
    #: After a change of the map (a network added, retired with weight 0, a weight
    #: changed): the maps before, ``"NETWORK=WEIGHT,..."`` each, every network listed. A
    #: site that moved is admitted by its new home only once its earlier home has said
    #: it did not admit the URL (docs/PROTOCOL.md §11, "Changing the map").
    previous_weights: list[str] = dataclasses.field(default_factory=list)
    #: Exact mode, a center: seconds its LAN's sets gather into one set for the peer
    #: networks while one of its own is out with them (docs/PROTOCOL.md §10, R4): every
    #: peer answers every set, so this divides their work by up to the hosts per LAN.
    #: 0: each host's set goes on alone.
    gather_linger: float = 0.5
    heartbeat_interval: float = 1.0
    #: A member silent this long leaves the LAN (or the set of peers).
    heartbeat_timeout: float = 5.0
    #: A host stopped by SIGTERM/SIGINT: seconds the pages whose request is on the wire
    #: get to finish before they are cut off (then handed back and fetched again elsewhere).
    stop_grace: float = 10.0
    #: ... and seconds the whole stop (pages, URL_pool through the protocol, the hand-back)
    #: may take before the host exits with what is left in its Redis.
    stop_timeout: float = 60.0
    #: Send every message whose safety depends on a write (an acknowledged set, an
    #: answer, a task, a task's acknowledgement) only once that write is fsynced to the
    #: AOF of the daemon's Redis (``WAITAOF``; docs/DECISIONS.md, "Durable acknowledgements").
    #: A Redis that cannot tell (AOF off) is used all the same, with a warning.
    durable_acks: bool = True
    #: Offer and accept zstd-compressed bodies (negotiated per connection; a peer that
    #: does not offer it always gets plain JSON).
    compress: bool = True
    #: Authenticated frames (dedupnet/codec/auth.py): a key file of ``KEY_ID
    #: HEX_SECRET [send]`` lines. ``lan_key_file``: a center's hosts (and control
    #: clients) must tag every message with it; a host tags its center connection.
    #: ``peer_key_file``: the same between peer centers. Re-read every
    #: ``key_poll_interval`` seconds (rotate keys without a restart).
    lan_key_file: str | None = None
    peer_key_file: str | None = None
    key_poll_interval: float = 1.0
    #: Limits against abuse (a center): connections one source address may hold open;
    #: bytes and messages a second read from one connection (above: throttled).
    max_connections_per_source: int = 16
    max_bytes_per_s: float = 32 * 1024 * 1024
    max_messages_per_s: float = 20_000
    #: TLS (dedupnet/adapters/tls.py, docs/DECISIONS.md): this daemon's certificate and key (PEM)
    #: and the deployment's CA. A center with all three requires TLS of its peer
    #: centers, with client certificates naming the peer's network id.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    #: TLS on the LAN too: a center requires it of its hosts; a host speaks it to its
    #: center (needs ``tls_ca``; ``tls_cert``/``tls_key`` optional).
    lan_tls: bool = False
    #: Run a daemon that listens beyond loopback without authentication for a role it
    #: serves (no LAN key; peers without TLS). Without it such a daemon does not start
    #: (dedupnet/service/exposure.py); with it, it warns at start and every minute.
    insecure: bool = False

    # -- the crawler on a host (``dedupnet local``) -------------------------------------
    #: Run the crawler on this host's task_pool.
    crawl: bool = True
    #: Serve the URLFrontier API (gRPC) for other crawlers on ``host:port`` (a port
    #: alone: on 127.0.0.1); needs the ``frontier`` extra. None: off.
    frontier: str | None = None
    #: Seed URLs, sent through the protocol like any discovered URL.
    seeds: list[str] = dataclasses.field(default_factory=list)
    seeds_file: str | None = None
    #: Requests at once, all sites together / to one site; seconds between two to one site.
    concurrency: int = 32
    per_site_concurrency: int = 2
    per_site_delay: float = 0.25
    #: Links of pages at this depth are not followed (seeds: depth 0); none = no limit.
    max_depth: int | None = None
    #: Hosts (and their subdomains) links may point to; empty = any.
    allowed_domains: list[str] = dataclasses.field(default_factory=list)
    respect_robots: bool = True
    #: Write fetched pages as JSON lines into this directory.
    store_dir: str | None = None
    #: Seconds between re-crawls of the seeds; none = off.
    recrawl_interval: float | None = None
    #: Re-crawl by age (dedupnet/adapters/recrawl.py, docs/PROTOCOL.md "Re-crawl by age"): a URL
    #: admitted or crawled counts as seen for this many seconds only, then it is admitted
    #: again when it is found again; never twice within it anywhere. None: seen for ever.
    #: Every daemon of the system must have the same value.
    recrawl_after: float | None = None
    #: Per-site ages, ``"GLOB=SECONDS"`` or ``"GLOB=never"``; the first glob matching a
    #: URL's site (its host) wins over ``recrawl_after``.
    recrawl_sites: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.frontier is not None:
            frontier_endpoint(str(self.frontier))  # a ValueError naming what is wrong
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.partition_policy not in (None, *PARTITION_POLICIES):
            raise ValueError(f"partition_policy must be one of {', '.join(PARTITION_POLICIES)}, not {self.partition_policy!r}")
        if self.foreign_lookup not in (None, *FOREIGN_LOOKUPS):
            raise ValueError(f"foreign_lookup must be one of {', '.join(FOREIGN_LOOKUPS)}, not {self.foreign_lookup!r}")
        if self.local_lookup not in (None, *LOCAL_LOOKUPS):
            raise ValueError(f"local_lookup must be one of {', '.join(LOCAL_LOOKUPS)}, not {self.local_lookup!r}")
        if self.routing not in (None, *ROUTINGS):
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        parse_weights(self.weights)
        for earlier in self.previous_weights:
            parse_weights(earlier)
        if self.key_poll_interval <= 0:
            raise ValueError("key_poll_interval must be positive")
        if self.set_linger < 0 or self.gather_linger < 0:
            raise ValueError("set_linger and gather_linger must not be negative")
        for name in ("set_size", "max_frame_size", "max_urls_per_set", "max_url_length", "answer_timeout",
                     "heartbeat_interval", "heartbeat_timeout", "max_connections_per_source", "max_bytes_per_s",
                     "max_messages_per_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.network is not None:
            check_network(self.network)
        if not 1 <= self.discovery_port <= 65535:
            raise ValueError("discovery_port must be within 1..65535")
        if self.stop_grace < 0 or self.stop_timeout <= 0:
            raise ValueError("stop_grace must not be negative and stop_timeout must be positive")
        if self.discovery_timeout <= 0:
            raise ValueError("discovery_timeout must be positive")
        if self.discovery_address is not None:
            try:
                ipaddress.IPv4Address(self.discovery_address)
            except ValueError:
                raise ValueError(f"discovery_address must be an IPv4 address, not {self.discovery_address!r}") from None
        if not 8 <= self.bucket_bits <= 24:
            raise ValueError("bucket_bits must be within 8..24")
        if self.set_size > self.max_urls_per_set:
            raise ValueError("set_size cannot exceed max_urls_per_set")
        from dedupnet.adapters.bloom import spec_from

        spec_from(self)  # finish_url_filter, bloom_capacity, bloom_error_rate are valid
        if self.recrawl() is not None and self.finish_url_filter == "bloom":
            raise ValueError("recrawl_after cannot be combined with finish_url_filter = 'bloom' "
                             "(a Bloom filter cannot forget a URL)")

    def recrawl(self):
        """The :class:`~dedupnet.adapters.recrawl.RecrawlPolicy` of ``recrawl_after`` and
        ``recrawl_sites``, or None (no URL ever ages). ValueError names a bad value."""
        from dedupnet.codec.ages import RecrawlPolicy

        return RecrawlPolicy.from_settings(self.recrawl_after, self.recrawl_sites)


#: Settings that name a file or directory: a relative path in a config file is relative
#: to that file's directory (so the lines ``dedupnet certs`` prints work from anywhere).
PATH_SETTINGS = ("data_dir", "tls_cert", "tls_key", "tls_ca", "lan_key_file", "peer_key_file", "seeds_file",
                 "store_dir")
#: How a list setting's items look, for the message when a file gives something else.
LIST_ITEMS = {"peers": '"NETWORK,HOST:PORT,CIDR" strings, e.g. ["2,10.2.0.1:7700,10.2.0.0/24"]',
              "recrawl_sites": '"GLOB=SECONDS" strings, e.g. ["news.*=3600"]'}


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Defaults < file < overrides (``None`` overrides are ignored: flag not given).
    ValueError names the first mistake: the file, the key, what was expected."""
    values: dict[str, Any] = {}
    if path is not None:
        values.update(read_settings_file(path))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values)


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A config file's settings, checked against :class:`Settings`: every key known, every
    value of its field's type, relative paths made relative to the file's directory."""
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    hints = typing.get_type_hints(Settings)
    for key, value in values.items():
        if key not in hints:
            close = difflib.get_close_matches(key, hints, n=1)
            hint = f"did you mean `{close[0]}`?" if close else "the settings are listed in docs/DEPLOY.md"
            raise ValueError(f"unknown setting `{key}` in {path}: {hint}")
        expected = _type_problem(key, value, hints[key])
        if expected:
            raise ValueError(f"`{key}` in {path} must be {expected}, not {_toml_kind(value)}")
    base = Path(path).resolve().parent
    for key in PATH_SETTINGS:
        if isinstance(values.get(key), str):
            values[key] = str(base / Path(values[key]).expanduser())
    return values


def _type_problem(key: str, value: Any, hint: Any) -> str | None:
    """None if ``value`` fits the annotation ``hint``; else what was expected, in words."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kind = next(k for k in typing.get_args(hint) if k is not type(None)) if optional else hint
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if kind is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if kind is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if kind is str:
        return None if isinstance(value, str) else "a string"
    if typing.get_origin(kind) is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if ok else "a list of " + LIST_ITEMS.get(key, "strings")
    return None


def _toml_kind(value: Any) -> str:
    """A TOML value as an operator wrote it: ``a string ("500")``, ``a list of tables``."""
    if isinstance(value, str):
        return f'a string ("{value}")'
    if isinstance(value, bool) or not isinstance(value, (list, dict)):
        return f"{str(value).lower() if isinstance(value, bool) else value}"
    if isinstance(value, dict):
        return "a table"
    words = {str: "strings", dict: "tables", list: "lists", bool: "booleans"}
    return "a list of " + " and ".join(sorted({words.get(type(v), "numbers") for v in value}))


def endpoint(text: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``[addr]:port``) to a pair; ValueError names what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def frontier_endpoint(text: str) -> tuple[str, int]:
    """``--frontier``: ``"host:port"``, or a port alone (on loopback: safe by default)."""
    return ("127.0.0.1", int(text)) if text.isdigit() and int(text) <= 65535 else endpoint(text)
