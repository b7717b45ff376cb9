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


_BASE_TAG = re.compile(r"<base", re.IGNORECASE)

# Removed anywhere in a URL by the WHATWG URL parser (and by browsers).
_TAB_NEWLINE = re.compile(r"[\t\n\r]")
_STRIP = " \t\n\r\f"


def _clean(href: str) -> str:
    href = href.strip(_STRIP)
    if "\t" in href or "\n" in href or "\r" in href:
        href = _TAB_NEWLINE.sub("", href)
    return href


# The hrefs _Joiner resolves itself, up to their fragment: an absolute http(s) URL
# with an ASCII authority and no brackets; a path from the root; a relative path
# starting with a letter or digit and without ":". None has ";" (urljoin drops an
# empty parameter) or ends in "?" (it drops an empty query); the paths have no "/."
# or "//" (dot segments, and the empty segments urljoin drops: see _dotted).
_FAST_ABS = re.compile(r"([Hh][Tt][Tt][Pp][Ss]?)://([!$&'()*+,=:@A-Za-z0-9._~%-]+)((?:[/?][^;#]*)?)(?:#|\Z)")
_FAST_ROOT = re.compile(r"/(?!/)[^;#?]*(?:\?[^;#]*)?(?:#|\Z)")
_FAST_REL = re.compile(r"[A-Za-z0-9_~-][^;#?:]*(?:\?[^;#]*)?(?:#|\Z)")


class _Joiner:
    """``urllib.parse.urljoin(base, href)`` up to its fragment, exactly, for many hrefs
    against one base: the common ones (``_FAST_*``) by string concatenation, the rest by
    urljoin. urljoin re-parses the base for every link and costs more than everything
    else the crawler does with a link; tests/test_links.py holds the two to the same
    answers (on the running Python's urljoin)."""

    def __init__(self, base: str):
        self.base = base
        self.scheme = self.origin = self.directory = None
        try:
            parts = urllib.parse.urlsplit(base)
            if parts.scheme in ("http", "https") and parts.netloc:
                self.scheme = parts.scheme
                self.origin = f"{parts.scheme}://{parts.netloc}"
                path = parts.path
                if "/." in path or "//" in path:  # urljoin would rewrite these segments
                    self.directory = urllib.parse.urljoin(base, "x")[:-1]
                else:
                    self.directory = self.origin + path[: path.rfind("/") + 1] if path else self.origin + "/"
        except ValueError:
            pass

    def __call__(self, href: str) -> str:
        """The href resolved, without its fragment."""
        if self.scheme is not None:
            head = href[:1]
            if head == "/":
                m = _FAST_ROOT.match(href)
                if m is not None and not _dotted(m.group()):
                    return self.origin + href.split("#", 1)[0]
            elif head in "hH" and (m := _FAST_ABS.match(href)) is not None:
                rest = m.group(3)
                if m.group(1).lower() != self.scheme:
                    return href.split("#", 1)[0]  # another scheme: urljoin gives the href as it is
                if not rest.endswith("?"):  # urljoin rebuilds it: the scheme lowercased
                    return f"{self.scheme}://{m.group(2)}{rest}"
            elif (m := _FAST_REL.match(href)) is not None and not _dotted(m.group()):
                return self.directory + href.split("#", 1)[0]
        return urllib.parse.urljoin(self.base, href).split("#", 1)[0]


def _dotted(before_fragment: str) -> bool:
    """A dot segment, an empty segment or an empty query: urljoin changes those."""
    path, question, query = before_fragment.rstrip("#").partition("?")
    return "/." in path or path.startswith(".") or "//" in path or (question and not query)


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
    # A CSS query costs more than the page's parse: only when the text has a <base.
    base_node = tree.css_first("base[href]") if _BASE_TAG.search(html) else None
    if base_node is not None:
        href = _clean(base_node.attributes.get("href") or "")
        if href:
            try:
                base = urllib.parse.urljoin(page_url, href)
            except ValueError:
                pass
    join = _Joiner(base)
    dropped: collections.Counter = collections.Counter()
    seen: dict[str, None] = {}
    found = 0
    for node in tree.css("a[href]"):
        found += 1
        href = _clean(node.attributes.get("href") or "")
        if (not href or href.startswith("#")) and base == page_url:
            # The page itself (RFC 3986: "" and "#x" resolve to the base); under a
            # <base href> elsewhere they name that other document, and are kept.
            dropped["fragment"] += 1
            continue
        try:
            url = join(href)
        except ValueError:
            dropped["unparsable"] += 1
            continue
        scheme = url.split(":", 1)[0].lower()
        if scheme not in ("http", "https"):
            dropped["scheme"] += 1
            continue
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
