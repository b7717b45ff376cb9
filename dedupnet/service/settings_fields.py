"""Every setting as a field a reader, an editor and a type checker can see.

:class:`~dedupnet.service.config.Settings` is built at run time from the declarations
in dedupnet/codec/settings.py, so that a setting is declared once and reaches the file,
the flags, the help and the reference by itself; a class made that way has no fields
a type checker can read. This module is its written-out twin, generated from the same
declarations: ``tests/test_settings.py`` fails when it differs from them, and
``python -m dedupnet.service.settings_fields`` writes it again.
"""

from __future__ import annotations

from pathlib import Path


class SettingsFields:
    """The fields of :class:`~dedupnet.service.config.Settings`, with their defaults."""

    # -- generated: python -m dedupnet.service.settings_fields --
    network: int | None  # default None
    listen: str | None  # default None
    center: str | None  # default None
    redis_url: str | None  # default None
    redis_maxmemory: str | None  # default None
    prefix: str | None  # default None
    ip: str | None  # default None
    lan: str | None  # default None
    mode: str  # default 'exact'
    log_level: str  # default 'INFO'
    data_dir: str | None  # default None
    http: str | None  # default None
    peers: list[str]  # default []
    bucket_bits: int  # default 0
    finish_url_filter: str  # default 'exact'
    bloom_capacity: int  # default 10000000
    bloom_error_rate: float  # default 0.001
    set_size: int  # default 1000
    max_frame_size: int  # default 4194304
    max_urls_per_set: int  # default 10000
    max_url_length: int  # default 2048
    answer_timeout: float  # default 2.0
    max_resends: int  # default 2
    partition_policy: str | None  # default None
    foreign_lookup: str | None  # default None
    local_lookup: str | None  # default None
    routing: str | None  # default None
    weights: list[str]  # default []
    previous_weights: list[str]  # default []
    heartbeat_interval: float  # default 1.0
    heartbeat_timeout: float  # default 5.0
    reissue_after: float  # default 300.0
    stop_grace: float  # default 10.0
    stop_timeout: float  # default 60.0
    exit_when_complete: bool  # default False
    durable_acks: bool  # default True
    compress: bool  # default True
    recrawl_after: float | None  # default None
    recrawl_sites: list[str]  # default []
    discovery_port: int  # default 7799
    discovery: bool  # default True
    discovery_address: str | None  # default None
    discovery_timeout: float  # default 30.0
    tls_cert: str | None  # default None
    tls_key: str | None  # default None
    tls_ca: str | None  # default None
    lan_tls: bool  # default False
    insecure: bool  # default False
    lan_key_file: str | None  # default None
    peer_key_file: str | None  # default None
    key_poll_interval: float  # default 1.0
    max_connections_per_source: int  # default 16
    max_bytes_per_s: float  # default 33554432
    max_messages_per_s: float  # default 20000
    crawl: bool  # default True
    frontier: str | None  # default None
    seeds: list[str]  # default []
    seeds_file: str | None  # default None
    concurrency: int  # default 32
    per_site_concurrency: int  # default 2
    per_site_delay: float  # default 0.25
    max_depth: int | None  # default None
    allowed_domains: list[str]  # default []
    respect_robots: bool  # default True
    store_dir: str | None  # default None
    recrawl_interval: float | None  # default None
    # -- end of generated --


_BEGIN = "    # -- generated: python -m dedupnet.service.settings_fields --\n"
_END = "    # -- end of generated --\n"


def render() -> str:
    """The generated lines: one per declared setting, its type and its default."""
    from dedupnet.codec.settings import SETTINGS, default_of

    def kind(annotation: object) -> str:
        return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")

    return "".join(f"    {s.name}: {kind(s.annotation)}  # default {default_of(s.name)!r}\n" for s in SETTINGS.values())


def current(path: Path = Path(__file__)) -> str:
    """The generated lines as this file holds them."""
    text = path.read_text()
    return text[text.index(_BEGIN) + len(_BEGIN):text.index(_END)]


def write(path: Path = Path(__file__)) -> None:
    text = path.read_text()
    head, tail = text[:text.index(_BEGIN) + len(_BEGIN)], text[text.index(_END):]
    path.write_text(head + render() + tail)


if __name__ == "__main__":
    write()
