"""Whether the whole crawl is complete, asked for a Scrapy spider.

A spider cannot tell from its own host that the crawl is over: the host's pools can be
empty while another host, or another network, still holds tasks whose pages will
bring new URLs. ``dedupnet status --cluster`` can (:mod:`dedupnet.adapters.census`:
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

from dedupnet.adapters.census import SETTLE, StatusRefused, parse_address, survey
from dedupnet.codec.auth import KeyFileError, Keyring, keyring_from

log = logging.getLogger("dedupnet.scrapy")

#: Seconds one daemon may take to answer (the spider is idle while it waits).
ASK_TIMEOUT = 2.0

#: The verdict of a crawl that has admitted nothing yet: every pool is empty because
#: the seeds are not in, which is no reason to close.
NOT_STARTED = "not started"


class CrawlCensus:
    """The cluster-wide verdict, from the center at ``center`` (its control address,
    the ``--listen`` of ``dedupnet center``), with the LAN keys of ``key_files``."""

    def __init__(self, center: tuple[str, int], keyrings: list[Keyring | None], *, timeout: float = ASK_TIMEOUT,
                 settle: float = SETTLE):
        self.center = center
        self.keyrings = keyrings or [None]
        self.timeout = timeout
        self.settle = settle
        self._unreachable_logged = False

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
        """``"complete"``, ``"in progress"``, ``"stuck"``, :data:`NOT_STARTED`, or None
        when no center answered. Blocks for two passes (about ``settle`` seconds)."""
        try:
            report = trio.run(survey, self.center, self.keyrings, self.timeout, self.settle)
        except (OSError, trio.TooSlowError, StatusRefused) as e:
            return self._unreachable(str(e))
        if not report["networks"]:
            why = report["unreachable"][0]["why"] if report["unreachable"] else "no center answered"
            return self._unreachable(why)
        if self._unreachable_logged:
            log.info("dedupnet: the center at %s answers again: the spider closes when the crawl is complete",
                     self.where)
            self._unreachable_logged = False
        if report["verdict"] == "complete" and not sum(view["admitted"] for view in report["networks"]):
            return NOT_STARTED
        return report["verdict"]

    def _unreachable(self, why: str) -> None:
        if not self._unreachable_logged:
            log.warning("dedupnet: the center at %s (DEDUPNET_CENTER) gives no verdict (%s): the spider closes "
                        "after DEDUPNET_MAX_IDLE instead, if set", self.where, why)
            self._unreachable_logged = True
        return None

    @property
    def where(self) -> str:
        return f"{self.center[0]}:{self.center[1]}"
