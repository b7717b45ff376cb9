"""What a page links to: its text decoded, its ``<a href>`` links resolved, and the
allowed-domains scope they are held to.

* :func:`decode_html` — the page as text, from the header's charset, a ``<meta charset>``
  or UTF-8.
* :func:`extract_links` — ``<a href>`` links of an HTML page with ``selectolax``
  (lexbor), resolved against ``<base href>`` or the page URL, fragments stripped,
  non-http(s) schemes dropped.
* :func:`in_scope` — the allowed-domains scope.
"""

from __future__ import annotations

import collections
import re
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

__all__ = ["Links", "decode_html", "extract_links", "in_scope"]


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.IGNORECASE)


def decode_html(body: bytes, charset: str | None) -> str:
    """The page as text: the header's charset, else a ``<meta charset>`` in the first
    KiB, else UTF-8; undecodable bytes are replaced (links are mostly ASCII)."""
    for candidate in (charset, _sniff_charset(body), "utf-8"):
        if not candidate:
            continue
        try:
            return body.decode(candidate, errors="replace")
        except LookupError:
            continue
    return body.decode("utf-8", errors="replace")  # pragma: no cover


def _sniff_charset(body: bytes) -> str | None:
    m = _META_CHARSET.search(body[:1024])
    return m.group(1).decode("ascii") if m else None


# Removed anywhere in a URL by the WHATWG URL parser (and by browsers).
_TAB_NEWLINE = re.compile(r"[\t\n\r]")
_STRIP = " \t\n\r\f"


@dataclass
class Links:
    """What :func:`extract_links` found: absolute http(s) URLs (fragment-free, in page
    order, duplicates removed), how many ``<a href>`` there were, and why the others
    were dropped."""

    urls: list[str]
    found: int
    dropped: collections.Counter


def extract_links(html: str, page_url: str) -> Links:
    """``<a href>`` links of a page, resolved against ``<base href>`` (itself resolved
    against the page URL) if the page has one, else against ``page_url``.

    Dropped (reason in ``dropped``): empty and fragment-only hrefs that name the page
    itself (``fragment``; with a ``<base href>`` elsewhere they name the base document),
    schemes other than http/https (``scheme``: javascript:, mailto:, data:, tel: …),
    unparsable hrefs (``unparsable``). Fragments are stripped from the rest.
    """
    tree = LexborHTMLParser(html)
    base = page_url
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        href = _TAB_NEWLINE.sub("", (base_node.attributes.get("href") or "").strip(_STRIP))
        if href:
            try:
                base = urllib.parse.urljoin(page_url, href)
            except ValueError:
                pass
    dropped: collections.Counter = collections.Counter()
    seen: dict[str, None] = {}
    found = 0
    for node in tree.css("a[href]"):
        found += 1
        href = _TAB_NEWLINE.sub("", (node.attributes.get("href") or "").strip(_STRIP))
        if (not href or href.startswith("#")) and base == page_url:
            # The page itself (RFC 3986: "" and "#x" resolve to the base); under a
            # <base href> elsewhere they name that other document, and are kept.
            dropped["fragment"] += 1
            continue
        try:
            url = urllib.parse.urljoin(base, href)
        except ValueError:
            dropped["unparsable"] += 1
            continue
        scheme = url.split(":", 1)[0].lower()
        if scheme not in ("http", "https"):
            dropped["scheme"] += 1
            continue
        url = url.split("#", 1)[0]
        seen.setdefault(url, None)
    return Links(list(seen), found, dropped)


_IPV4 = re.compile(r"[0-9.]+")


def in_scope(host: str, allowed: Collection[str]) -> bool:
    """Whether ``host`` is one of ``allowed`` or a subdomain of one (empty: all are).
    Entries are lowercase hosts; a leading dot is ignored (``.example.org`` and
    ``example.org`` both admit ``example.org`` and ``www.example.org``)."""
    if not allowed:
        return True
    host = host.lower()
    if host.startswith("[") or _IPV4.fullmatch(host):
        return host in allowed  # an address has no subdomains
    while True:
        if host in allowed:
            return True
        dot = host.find(".")
        if dot < 0:
            return False
        host = host[dot + 1 :]
