"""Whether the whole crawl is complete, asked for a Scrapy spider.

A spider cannot tell from its own host that the crawl is over: the host's pools can be
empty while another host, or another network, still holds tasks whose pages will
bring new URLs. ``dedupnet status --cluster`` can (:mod:`dedupnet.adapters.monitor.census`:
every center reachable from one, every host they know, two passes that must agree),
so the spider asks the same question of the center it is given (``DEDUPNET_CENTER``)
and closes on "complete" instead of after a fixed idle time.

The asking is blocking (its own trio loop): the scheduler runs it in a thread of its
own and hands the answer back to the reactor. No answer (no center given, or none
reachable) is ``None``, and the spider falls back to ``DEDUPNET_MAX_IDLE``.
"""

from __future__ import annotations

import logging

import trio

from dedupnet.adapters.monitor.census import NOT_STARTED, CrawlCensus as Asker, parse_address
from dedupnet.codec.auth import KeyFileError, Keyring, keyring_from

__all__ = ["CrawlCensus", "NOT_STARTED"]

log = logging.getLogger("dedupnet.scrapy")


class CrawlCensus:
    """The cluster-wide verdict, from the center at ``center`` (its control address,
    the ``--listen`` of ``dedupnet center``), with the LAN keys of ``key_files``."""

    def __init__(self, center: tuple[str, int], keyrings: list[Keyring | None], **timing: float):
        keyrings = keyrings or [None]
        self.asker = Asker(center, lambda: keyrings, logger=log, setting="DEDUPNET_CENTER",
                           without="the spider closes after DEDUPNET_MAX_IDLE instead, if set",
                           with_verdict="the spider closes when the crawl is complete", **timing)

    @classmethod
    def from_settings(cls, settings) -> "CrawlCensus | None":
        """From ``DEDUPNET_CENTER`` (``host:port``) and ``DEDUPNET_KEY_FILES``; None
        without a center. A setting that cannot be used is a ``ValueError`` that says why."""
        text = settings.get("DEDUPNET_CENTER")
        if not text:
            return None
        address = parse_address(str(text).strip())
        if address is None:
            raise ValueError(f"DEDUPNET_CENTER {text!r} is not HOST:PORT (a center's --listen address)")
        try:
            keyrings = [keyring_from(path) for path in settings.getlist("DEDUPNET_KEY_FILES")]
        except KeyFileError as e:
            raise ValueError(f"DEDUPNET_KEY_FILES: {e}") from None
        return cls(address, keyrings)

    def verdict(self) -> str | None:
        """:meth:`dedupnet.adapters.monitor.census.CrawlCensus.verdict`, blocking (its own trio loop)."""
        return trio.run(self.asker.verdict)

    @property
    def where(self) -> str:
        return self.asker.where
