"""Every setting of the daemons, declared once: its name (the TOML key), type, default,
help text, flag, and the commands that read it.

Everything else is derived from this table, so none of it can drift: the
:class:`~dedupnet.service.config.Settings` object and its TOML checks, the flags of
``dedupnet center``/``local``/``push``/``demo`` and their ``--help``, the defaults of the
roles' own settings objects (``CenterSettings``, ``LocalSettings``, through
:func:`declared`), the daemon command lines of ``dedupnet sim --processes`` (the
settings marked ``sim``) and the configuration reference in docs/DEPLOY.md
(``python -m dedupnet.service.config``). It is plain data, low in the layers, so both
roles can read their defaults from it without knowing the command or the file.

A setting's ``roles`` are the commands that read it (``center``, ``local``, ``push``,
``demo``), and ``sim`` when ``dedupnet sim`` takes it as a flag of its own and gives
its value to every daemon of that role it starts.
"""

from __future__ import annotations

import argparse

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["Setting", "SETTINGS", "Retired", "RETIRED", "CENTER", "LOCAL", "PUSH", "DEMO", "SIM", "DAEMONS",
           "declared", "default_of"]

CENTER, LOCAL, PUSH, DEMO, SIM = "center", "local", "push", "demo", "sim"
DAEMONS = (CENTER, LOCAL)

#: Where a flag is listed in ``--help`` (besides "required" and "settings").
CRAWLER, SECURITY = "crawler", "TLS, keys and limits"


@dataclass(frozen=True)
class Setting:
    name: str
    #: ``bool``, ``int``, ``float``, ``str`` or ``list`` (of strings).
    type: type
    default: Any
    help: str
    roles: frozenset[str]
    #: The commands that cannot run without it (from a flag or the file; argparse is not
    #: told, the help marks it).
    required: frozenset[str] = frozenset()
    #: The flag, ``""`` for a setting of the config file only. Default: ``--name-with-dashes``,
    #: ``--no-name`` for a setting that is on by default.
    flag: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    #: Help text of one command where it says more than ``help`` (``--help`` only).
    role_help: tuple[tuple[str, str], ...] = ()
    #: ``--help``'s group: ``crawler`` or ``TLS, keys and limits``; else "settings".
    group: str = "settings"
    #: A file or directory: relative in a config file means relative to that file.
    path: bool = False
    #: A list's items, in words, for the message when a file gives something else.
    items: str = "strings"

    @property
    def optional(self) -> bool:
        """None is a value of it (not given: the daemon works it out, or it is off)."""
        return self.default is None

    @property
    def annotation(self) -> Any:
        kind = list[str] if self.type is list else self.type
        return kind | None if self.optional else kind

    @property
    def option(self) -> str:
        """The flag's name, or "" for a setting of the file only."""
        if self.flag is not None:
            return self.flag
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.default is True else f"--{dashed}"

    def help_for(self, role: str) -> str:
        return dict(self.role_help).get(role, self.help)

    def argparse_options(self) -> dict[str, Any]:
        """What ``ArgumentParser.add_argument`` needs besides the flag and the help."""
        options: dict[str, Any] = {"dest": self.name}
        if self.type is bool:
            return options | {"action": "store_const", "const": not self.default}
        if self.type is list:
            options["action"] = "append"
        elif self.type in (int, float):
            options["type"] = self.type
        if self.choices:
            options["choices"] = self.choices
        if self.metavar:
            options["metavar"] = self.metavar
        return options

    def argv(self, value: Any) -> list[str]:
        """The flags that give this setting ``value`` on a command line ([] for None, for a
        switch left as its default, and for a setting of the file only)."""
        if value is None or not self.option:
            return []
        if self.type is bool:
            return [self.option] if value != self.default else []
        if self.type is list:
            return [arg for item in value for arg in (self.option, str(item))]
        return [self.option, str(value)]

    def default_value(self) -> Any:
        return list(self.default) if self.type is list else self.default


def _s(name: str, type: type, default: Any, help: str, *roles: str, **more: Any) -> Setting:
    if "role_help" in more:
        more["role_help"] = tuple(more["role_help"].items())
    for key in ("required",):
        if key in more:
            more[key] = frozenset(more[key])
    if type is list and default is None:
        default = ()
    return Setting(name, type, default, help, frozenset(roles), **more)


_D, _ALL = DAEMONS, (CENTER, LOCAL, PUSH, DEMO)

_LIST = (
    # -- identity and where things are ------------------------------------------------
    _s("network", int, None, "this LAN's network id (1..65535), part of every number", *_D, metavar="N",
       required=(CENTER,),
       role_help={LOCAL: "this LAN's network id (1..65535); required unless --center auto (the center's answer "
                         "gives it)"}),
    _s("listen", str, None, "where hosts and peer centers connect to a center (0.0.0.0:PORT: every address); "
       "where dedupnet status reaches a host (default: its IP, any free port)", *_D, metavar="HOST:PORT",
       required=(CENTER,),
       role_help={CENTER: "where hosts and peer centers connect (0.0.0.0:PORT: every address)",
                  LOCAL: "where dedupnet status reaches this host (default: its IP, any free port)"}),
    _s("center", str, None, "this host's center; auto: find it by a UDP broadcast on the LAN (then --network is "
       "optional)", LOCAL, metavar="HOST:PORT|auto", required=(LOCAL,)),
    _s("redis_url", str, None, "Redis to use (redis://HOST:PORT/DB, or redis+cluster://HOST:PORT,... for a Redis "
       "Cluster); without it an embedded server is started", *_ALL, flag="--redis", metavar="URL"),
    _s("redis_maxmemory", str, None, "the embedded Redis's maxmemory (a size: 512mb, 2gb): full, the daemon "
       "takes no new work until memory is freed (default: none, it grows with the crawl)", *_D, metavar="SIZE"),
    _s("prefix", str, None, "key prefix of this host's or center's pools (default: dedupnet:centerN, "
       "dedupnet:host:IP)", *_ALL, metavar="P",
       role_help={CENTER: "key prefix of the center's pools (default: dedupnet:centerN)",
                  LOCAL: "key prefix of the host's pools (default: dedupnet:host:IP)",
                  PUSH: "key prefix of the host's pools (default: dedupnet:host:IP, from --ip)",
                  DEMO: "key prefix of the demo's pools (removed when it ends)"}),
    _s("ip", str, None, "this daemon's IP, its identity (default: a center's --listen address or the address that "
       "reaches its first peer; a host's address that reaches its center)", *_D, metavar="IP",
       role_help={CENTER: "this center's IP, its identity (default: the --listen address, or the address that "
                          "reaches the first peer)",
                  LOCAL: "this host's IP, its identity (default: the address that reaches the center)"}),
    _s("lan", str, None, "this LAN (default: the interface's address and netmask)", *_D, metavar="CIDR"),
    _s("mode", str, "exact", "exact: no URL admitted twice; paper: the paper's look-ups only (every daemon the same)",
       *_ALL, SIM, choices=("exact", "paper")),
    _s("log_level", str, "INFO", "the least important log lines shown; DEBUG also prints the traceback of a fatal "
       "error", *_ALL, choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    _s("data_dir", str, None, "where the embedded Redis keeps its append-only file (default: "
       "dedupnet-data/centerN or dedupnet-data/host-IP)", *_D, metavar="DIR", path=True,
       role_help={CENTER: "where the embedded Redis keeps its append-only file (default: dedupnet-data/centerN)",
                  LOCAL: "where the embedded Redis keeps its append-only file (default: dedupnet-data/host-IP)"}),
    _s("http", str, None, "serve the live status page at http://HOST:PORT/, its JSON at /status.json "
       "(docs/STATUS.md) and Prometheus metrics at /metrics (default: off)", *_D, metavar="HOST:PORT"),
    _s("peers", list, None, "another network's center and its LAN (repeat per peer)", CENTER, flag="--peer",
       metavar="NET,HOST:PORT,CIDR", items='"NETWORK,HOST:PORT,CIDR" strings, e.g. ["2,10.2.0.1:7700,10.2.0.0/24"]'),
    # -- the store --------------------------------------------------------------------
    _s("bucket_bits", int, 0, "fingerprint sets are split into 2**bucket_bits Redis sets (8..24) in a new store "
       "(0: 8, or 10 in a store written before stores recorded it; a store keeps what it recorded)", *_ALL, flag=""),
    _s("finish_url_filter", str, "exact", "a host's finish_URL: exact, or bloom (less memory; each false positive "
       "is a URL never crawled)", LOCAL, PUSH, choices=("exact", "bloom")),
    _s("bloom_capacity", int, 10_000_000, "URLs the Bloom filter is sized for", LOCAL, PUSH, metavar="N"),
    _s("bloom_error_rate", float, 0.001, "the Bloom filter's false-positive rate at its capacity", LOCAL, PUSH,
       metavar="P"),
    # -- the protocol -----------------------------------------------------------------
    _s("set_size", int, 1000, "URLs per URL_set", LOCAL, DEMO, SIM, metavar="N"),
    _s("max_frame_size", int, 4 * 1024 * 1024, "largest frame body accepted from the network, in bytes", *_D,
       flag=""),
    _s("max_urls_per_set", int, 10_000, "largest URL_set accepted from the network", *_D, DEMO, flag=""),
    _s("max_url_length", int, 2048, "longest normalised URL admitted into a pool", *_D, flag=""),
    _s("answer_timeout", float, 2.0, "seconds to wait for the answers to a look-up before asking again", CENTER,
       SIM, metavar="S"),
    _s("max_resends", int, 2, "re-sends to silent members before concluding without them (admit) or slowing down "
       "(wait)", CENTER, metavar="N"),
    _s("partition_policy", str, None, "a silent member or a network that is down: wait (exact mode's default) or "
       "admit without it after --max-resends (paper mode's default)", CENTER, SIM, choices=("wait", "admit")),
    _s("foreign_lookup", str, None, "who answers another network's set: center (exact mode's default: its "
       "admitted record) or lan (every LAN host, the paper's §2.4; paper mode's default)", CENTER,
       choices=("center", "lan")),
    _s("local_lookup", str, None, "who answers this LAN's own sets: center (exact mode's default: its admitted "
       "record, no LAN broadcast) or lan (every other LAN host, the paper's §2.3; paper mode's default)", CENTER,
       choices=("center", "lan")),
    _s("routing", str, None, "exact mode: home (default) decides each URL at its site's home network alone; "
       "broadcast asks every peer network (every center needs the same)", CENTER, SIM,
       choices=("home", "broadcast")),
    _s("weights", list, None, "a network's share of the sites under --routing home (default 1; repeat; every "
       "center needs the same)", CENTER, SIM, flag="--weight", metavar="NET=W"),
    _s("previous_weights", list, None, "after a change of the map: the map before it, every network with its "
       "weight (repeat for older ones); a site that moved is admitted by its new home only once its earlier home "
       "has said it did not admit the URL (every center needs the same)", CENTER, metavar="NET=W,..."),
    _s("heartbeat_interval", float, 1.0, "seconds between two heartbeats", *_D, metavar="S",
       role_help={CENTER: "seconds between two heartbeats to this center's hosts and peer centers",
                  LOCAL: "seconds between two heartbeats to the center"}),
    _s("heartbeat_timeout", float, 5.0, "seconds of silence after which a member counts as gone (a host dials its "
       "center again)", *_D, metavar="S",
       role_help={CENTER: "seconds of silence after which a host or a peer network counts as gone",
                  LOCAL: "seconds of silence after which the host gives its center up and dials again (the same "
                         "on the LAN's center and hosts)"}),
    _s("reissue_after", float, 300.0, "seconds a LAN host may be silent before its unfinished tasks (its ledger) go "
       "to the LAN's live hosts, whole sites at a time, and it is no longer one of the LAN's hosts (0: never; "
       "dedupnet reassign does it at once)", CENTER, SIM, metavar="S"),
    _s("stop_grace", float, 10.0, "on SIGTERM: seconds the pages already requested get to finish (then they are "
       "handed back and fetched again elsewhere)", LOCAL, metavar="S"),
    _s("stop_timeout", float, 60.0, "on SIGTERM: seconds the whole stop (pages, URL_pool, the hand-back) may take "
       "before the host exits with what is left in its Redis", LOCAL, metavar="S"),
    _s("exit_when_complete", bool, False, "while this host is idle, ask its center whether the whole crawl is "
       "complete (the verdict of dedupnet status --cluster) and, once it is, leave as on SIGTERM and exit 0 "
       "(default: run until stopped)", LOCAL),
    _s("durable_acks", bool, True, "send acknowledgements, answers and tasks only once their writes are fsynced "
       "to Redis' AOF (when the Redis has its AOF on)", *_D, SIM,
       role_help={role: "send acknowledgements, answers and tasks without waiting for their writes to be "
                        "fsynced to Redis' AOF (default: wait, when the Redis has its AOF on)" for role in _D}),
    _s("compress", bool, True, "offer and accept compression (a deflate stream per connection, else zstd "
       "bodies; negotiated per connection)", *_D,
       role_help={role: "never offer or accept compression (default: negotiated per connection)"
                  for role in _D}),
    _s("recrawl_after", float, None, "re-crawl by age: a URL counts as crawled for S seconds only, then it is "
       "admitted again when found again, never twice within S anywhere (default: never again; every daemon the "
       "same)", *_D, PUSH, metavar="S"),
    _s("recrawl_sites", list, None, "the age of the sites matching GLOB (S seconds or 'never'); the first match "
       "wins over --recrawl-after (repeat)", *_D, PUSH, flag="--recrawl-site", metavar="GLOB=S",
       items='"GLOB=SECONDS" strings, e.g. ["news.*=3600"]'),
    # -- LAN discovery ----------------------------------------------------------------
    _s("discovery_port", int, 7799, "UDP port of LAN discovery", *_D, metavar="N",
       role_help={CENTER: "UDP port on which this center answers hosts started with --center auto",
                  LOCAL: "UDP port on which --center auto asks for the center"}),
    _s("discovery", bool, True, "a center answers LAN discovery (without it hosts need --center HOST:PORT)", CENTER,
       role_help={CENTER: "do not answer LAN discovery (hosts then need --center HOST:PORT)"}),
    _s("discovery_address", str, None, "with --center auto: send the query here (default: each interface's "
       "broadcast address)", LOCAL, metavar="IPV4"),
    _s("discovery_timeout", float, 30.0, "with --center auto: give up after this long without an answer", LOCAL,
       metavar="S"),
    # -- security ---------------------------------------------------------------------
    _s("tls_cert", str, None, "this daemon's TLS certificate (dedupnet certs makes them); a center with --tls-key "
       "and --tls-ca requires TLS of its peers", *_D, metavar="PEM", path=True, group=SECURITY,
       role_help={CENTER: "this center's TLS certificate (dedupnet certs makes them); with --tls-key and --tls-ca "
                          "the center requires TLS of its peers",
                  LOCAL: "this host's own TLS certificate, presented to its center (optional with --lan-tls)"}),
    _s("tls_key", str, None, "the private key of --tls-cert", *_D, metavar="PEM", path=True, group=SECURITY),
    _s("tls_ca", str, None, "the deployment's CA certificate: the other side's certificate must be signed by it",
       *_D, metavar="PEM", path=True, group=SECURITY),
    _s("lan_tls", bool, False, "TLS between hosts and their center: a center requires it, a host speaks it (needs "
       "--tls-ca)", *_D, group=SECURITY,
       role_help={CENTER: "require TLS of this LAN's hosts too", LOCAL: "speak TLS to the center (needs --tls-ca)"}),
    _s("insecure", bool, False, "listen beyond loopback without authentication (no LAN key; peer centers without "
       "TLS), logged as a WARNING every minute; without it such a daemon refuses to start (docs/DEPLOY.md)", *_D,
       group=SECURITY),
    _s("lan_key_file", str, None, "LAN key file ('KEY_ID HEX_SECRET [send]' lines): every message between a "
       "center and its hosts carries an HMAC tag (re-read every --key-poll-interval: rotate keys without a "
       "restart)", *_D, metavar="FILE", path=True, group=SECURITY),
    _s("peer_key_file", str, None, "key file of the peer centers, as --lan-key-file", CENTER, metavar="FILE",
       path=True, group=SECURITY),
    _s("key_poll_interval", float, 1.0, "seconds between two reads of the key files", *_D, metavar="S",
       group=SECURITY),
    _s("max_connections_per_source", int, 16, "connections one source address may hold open", CENTER, metavar="N",
       group=SECURITY),
    _s("max_bytes_per_s", float, 32 * 1024 * 1024, "bytes a second read from one connection, above which reading "
       "it is throttled", CENTER, metavar="B", group=SECURITY),
    _s("max_messages_per_s", float, 20_000, "messages a second read from one connection, above which reading it "
       "is throttled", CENTER, metavar="N", group=SECURITY),
    # -- the crawler on a host --------------------------------------------------------
    _s("crawl", bool, True, "run the crawler on this host's task_pool (off: URLs come from dedupnet push or a "
       "Scrapy spider)", LOCAL, group=CRAWLER,
       role_help={LOCAL: "run the protocol only: no crawler (URLs come from dedupnet push or a Scrapy spider)"}),
    _s("frontier", str, None, "serve the URLFrontier API (gRPC) here for crawlers in any language, on 127.0.0.1 "
       "unless HOST says otherwise (needs pip install 'dedupnet[frontier]'; docs/FRONTIER.md)", LOCAL,
       metavar="[HOST:]PORT", group=CRAWLER),
    _s("seeds", list, None, "a seed URL, sent through the protocol like any found link (repeat)", LOCAL,
       flag="--seed", metavar="URL", group=CRAWLER),
    _s("seeds_file", str, None, "seed URLs, one per line", LOCAL, metavar="FILE", path=True, group=CRAWLER),
    _s("concurrency", int, 32, "requests at once, all sites together", LOCAL, SIM, metavar="N", group=CRAWLER),
    _s("per_site_concurrency", int, 2, "requests at once to one site", LOCAL, SIM, flag="--per-site", metavar="N",
       group=CRAWLER),
    _s("per_site_delay", float, 0.25, "seconds between two requests to one site", LOCAL, SIM, metavar="S",
       group=CRAWLER),
    _s("max_depth", int, None, "do not follow the links of pages this deep (seeds: 0; default: no limit)", LOCAL,
       SIM, metavar="N", group=CRAWLER),
    _s("allowed_domains", list, None, "only follow links to this host and its subdomains (repeat; default: any)",
       LOCAL, flag="--allow-domain", metavar="DOMAIN", group=CRAWLER),
    _s("respect_robots", bool, True, "honour robots.txt", LOCAL, flag="--ignore-robots", group=CRAWLER,
       role_help={LOCAL: "fetch what robots.txt forbids (default: robots.txt is honoured)"}),
    _s("store_dir", str, None, "write fetched pages as JSON lines into DIR (default: not kept)", LOCAL,
       flag="--store", metavar="DIR", path=True, group=CRAWLER),
    _s("recrawl_interval", float, None, "offer the seeds again this often, through the protocol (with "
       "--recrawl-after; default: off)", LOCAL, metavar="S", group=CRAWLER),
)

#: Name -> setting, in the order of the reference and of ``--help``.
SETTINGS: dict[str, Setting] = {s.name: s for s in _LIST}


@dataclass(frozen=True)
class Retired:
    """A setting that was removed: an operator who still gives it (its flag, or its key
    in a config file) is told why in one line and the command exits 2, rather than
    have it ignored or refused as a typo."""

    name: str
    roles: frozenset[str]
    why: str

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def message(self) -> str:
        return f"{self.name} ({self.option}) was removed: {self.why}; leave it out"


#: Name -> removed setting.
RETIRED: dict[str, Retired] = {r.name: r for r in (
    Retired("set_linger", frozenset({LOCAL, SIM}), "a host's part-full URL_set goes when none of its messages awaits "
            "the center's ack, and gathers until the ack comes back (Nagle's rule, docs/DECISIONS.md)"),
    Retired("gather_linger", frozenset({CENTER, SIM}), "a center's sets for the peer networks go when none of "
            "its own is out with them, and gather until then (Nagle's rule, docs/DECISIONS.md)"),
)}


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1 (argparse names the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def default_of(name: str) -> Any:
    return SETTINGS[name].default_value()


def declared(name: str) -> Any:
    """A field of a role's settings object that carries setting ``name``: its default is
    the declared one, and ``dedupnet.service`` fills it from the operator's settings by
    that name (the field's own name may differ)."""
    setting = SETTINGS[name]
    meta = {"setting": name}
    if setting.type is list:
        return dataclasses.field(default_factory=setting.default_value, metadata=meta)
    return dataclasses.field(default=setting.default, metadata=meta)
