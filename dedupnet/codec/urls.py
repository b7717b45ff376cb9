"""URL normalisation and fingerprints.

Crawlers discover the same page under many spellings (``HTTP://Example.com:80/a/./b#top``
and ``http://example.com/a/b``). De-duplication works on fingerprints, so every URL is first
brought to one canonical string (RFC 3986 §6.2.2 syntax-based normalisation plus the
http(s) scheme rules of §6.2.3); a URL that cannot be normalised raises ``BadURL`` whose
``reason`` is a counter label. Ordinary clean URLs take a regex fast path that returns
exactly what the full path would.

Not a library's: w3lib, ada-url and url-normalize each give other canonical forms (so
other fingerprints) for 6-32 of the 59 cases of ``tests/test_urls.py`` and accept 15-28
of its 39 refusals; ada, the only faster one (1.35×), keeps ``%70`` apart from ``p``
(13 % of the synthetic web's links). ``bench/compare_url_libs.py``, docs/DECISIONS.md.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import re
import urllib.parse
from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

from dedupnet.codec.errors import BadURL

__all__ = ["normalize", "fingerprint", "fingerprint_many", "site_of", "canonical_set", "set_digest", "URLGate"]

log = logging.getLogger("dedupnet.codec.urls")

_DEFAULT_PORT = {"http": "80", "https": "443"}

# Stripped from both ends, as the WHATWG URL parser does (C0 controls and space).
_C0_OR_SPACE = "".join(map(chr, range(0x21)))

# Inside the URL: any control character (C0, DEL, C1) or whitespace other than the plain
# space (which is percent-encoded). urllib would silently delete tab/CR/LF instead.
_BAD_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f]|[^\S ]")

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

# "%XX" -> replacement, for every pair of hex digits in any case: unreserved characters are
# decoded, everything else gets uppercase hex digits.
_ESCAPE: dict[str, str] = {}
for _i in range(256):
    _hi, _lo = f"{_i:02x}"[0], f"{_i:02x}"[1]
    for _a in {_hi, _hi.upper()}:
        for _b in {_lo, _lo.upper()}:
            _ESCAPE[f"%{_a}{_b}"] = chr(_i) if chr(_i) in _UNRESERVED else f"%{_i:02X}"
del _i, _hi, _lo, _a, _b

# Characters allowed verbatim: RFC 3986 pchar ("/" for paths, "/" and "?" for queries),
# plus "[" and "]" which are reserved (gen-delims) and therefore kept as they are.
_PCHAR = r"A-Za-z0-9\-._~!$&'()*+,;=:@/\[\]"
_PATH_FIX = re.compile(r"%[0-9A-Fa-f]{2}|[^" + _PCHAR + r"]")
_QUERY_FIX = re.compile(r"%[0-9A-Fa-f]{2}|[^" + _PCHAR + r"?]")


def _fix_escape(m: re.Match[str]) -> str:
    t = m.group()
    if len(t) == 3:  # a valid %XX escape
        return _ESCAPE[t]
    if t == "%":  # a "%" that does not start an escape
        return "%25"
    return "".join([f"%{b:02X}" for b in t.encode("utf-8")])


# A host as RFC 3986 reg-name without percent-escapes (unreserved / sub-delims).
_HOST_OK = re.compile(r"[a-z0-9\-._~!$&'()*+,;=]+\Z")

# Fast path: already-canonical URLs. Escapes are only those that stay as they are (uppercase
# hex, not an unreserved character); no dot segment; host lowercase without trailing dot.
_KEEP_ESC = r"%(?:[01][0-9A-F]|2[0-9A-CF]|3[A-F]|40|5[B-E]|60|7[B-DF]|[89A-F][0-9A-F])"
_FAST = re.compile(
    r"(https?)://"
    r"([a-z0-9._-]*[a-z0-9_-])"
    r"(?::([1-9][0-9]{0,4}))?"
    r"((?:/(?!\.\.?(?:[/?]|\Z))(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|" + _KEEP_ESC + r")*)*)"
    r"(?:\?((?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|" + _KEEP_ESC + r")+))?"
    r"\Z"
)


def normalize(url: str | bytes, *, max_length: int = 2048) -> str:
    """Return the canonical form of an http(s) URL, or raise ``BadURL``.

    Rules: lowercase scheme and host; IDNA host to punycode; no trailing dot on the host;
    no default port; no fragment; userinfo kept verbatim (an empty one is dropped); dot
    segments removed; empty path -> "/"; escapes normalised (uppercase hex, unreserved
    characters decoded, disallowed characters encoded as UTF-8); the query keeps its
    parameter order (servers may depend on it) and an empty "?" is dropped.
    Leading/trailing C0 controls and spaces are stripped. Idempotent.
    """
    if isinstance(url, str):
        if len(url) > 4 * max_length:
            raise BadURL(f"URL longer than {4 * max_length} characters", "too-long")
        s = url
    elif isinstance(url, (bytes, bytearray)):
        if len(url) > 4 * max_length:
            raise BadURL(f"URL longer than {4 * max_length} bytes", "too-long")
        try:
            s = url.decode("utf-8")
        except UnicodeDecodeError:
            raise BadURL("URL is not valid UTF-8", "undecodable") from None
    else:
        raise TypeError(f"URL must be str or bytes, not {type(url).__name__}")
    s = s.strip(_C0_OR_SPACE)

    m = _FAST.match(s)
    if m is not None:
        scheme, host, port, path, query = m.groups()
        if port is None:
            if path:
                out = s
            else:
                out = f"{scheme}://{host}/?{query}" if query else s + "/"
        elif int(port) > 65535:
            out = _normalize_full(s)  # raises
        else:
            if port == _DEFAULT_PORT[scheme]:
                out = f"{scheme}://{host}{path or '/'}"
            else:
                out = f"{scheme}://{host}:{port}{path or '/'}"
            if query:
                out = f"{out}?{query}"
    else:
        out = _normalize_full(s)
    if len(out) > max_length:
        raise BadURL(f"normalised URL longer than {max_length} characters", "too-long")
    return out


def _normalize_full(s: str) -> str:
    """The general path of ``normalize`` (input already decoded and stripped)."""
    if _BAD_CHAR.search(s):
        raise BadURL("URL contains control or whitespace characters", "unparsable")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            raise BadURL("URL is not encodable as UTF-8", "undecodable") from None
    try:
        parts = urllib.parse.urlsplit(s)
    except ValueError as e:
        raise BadURL(f"URL cannot be parsed: {e}", "unparsable") from None
    scheme = parts.scheme
    if scheme not in _DEFAULT_PORT:
        raise BadURL(f"scheme {scheme!r} is not http or https", "scheme")

    userinfo, at, hostport = parts.netloc.rpartition("@")
    if hostport.startswith("["):
        close = hostport.find("]")
        rest = hostport[close + 1 :]
        if close < 0 or (rest and rest[0] != ":"):
            raise BadURL("bad IPv6 host", "unparsable")
        host = "[" + _ipv6_text(hostport[1:close]) + "]"
        port = rest[1:]
    else:
        host, _, port = hostport.partition(":")
    if port:
        if not (port.isascii() and port.isdigit()) or int(port) > 65535:
            raise BadURL(f"bad port {port!r}", "unparsable")
        port = str(int(port))
        if port == _DEFAULT_PORT[scheme]:
            port = ""

    if not host.startswith("["):
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except (UnicodeError, ValueError):
                raise BadURL("host cannot be IDNA-encoded", "bad-host") from None
        host = host.lower().rstrip(".")
        if not host:
            raise BadURL("URL has no host", "no-host")
        if not _HOST_OK.match(host):
            raise BadURL(f"invalid host {host!r}", "bad-host")

    path = _PATH_FIX.sub(_fix_escape, parts.path)
    path = _remove_dot_segments(path) if path else "/"
    query = _QUERY_FIX.sub(_fix_escape, parts.query)

    out = [scheme, "://"]
    if at and userinfo:
        out += [userinfo, "@"]
    out.append(host)
    if port:
        out += [":", port]
    out.append(path)
    if query:
        out += ["?", query]
    return "".join(out)


def _ipv6_text(text: str) -> str:
    """RFC 5952 text of an IPv6 literal (own code: ``ipaddress``'s str varies by version)."""
    if "%" in text or text[:1] in ("v", "V"):
        raise BadURL("IPv6 zone IDs and IPvFuture hosts are not supported", "bad-host")
    try:
        n = int(ipaddress.IPv6Address(text))
    except ValueError:
        raise BadURL(f"bad IPv6 address {text!r}", "unparsable") from None
    groups = [(n >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    best_start, best_len, i = -1, 1, 0
    while i < 8:  # longest run (>= 2) of zero groups, the first one on a tie
        if groups[i] == 0:
            j = i
            while j < 8 and groups[j] == 0:
                j += 1
            if j - i > best_len:
                best_start, best_len = i, j - i
            i = j
        else:
            i += 1
    if groups[:6] == [0, 0, 0, 0, 0, 0xFFFF]:  # IPv4-mapped: dotted quad (§5)
        return "::ffff:" + ".".join(str((n >> k) & 0xFF) for k in (24, 16, 8, 0))
    hexes = [f"{g:x}" for g in groups]
    if best_start < 0:
        return ":".join(hexes)
    return ":".join(hexes[:best_start]) + "::" + ":".join(hexes[best_start + best_len :])


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 for an absolute path (one that starts with "/")."""
    if "/." not in path:
        return path
    segments = path.split("/")[1:]
    out: list[str] = []
    for seg in segments:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def fingerprint(normalized: str) -> int:
    """64-bit unsigned xxh3 fingerprint of an *already normalised* URL (see ``normalize``).

    It does not normalise: two spellings of one URL only collide if normalised first.
    """
    return xxhash.xxh3_64_intdigest(normalized.encode("utf-8"))


def fingerprint_many(normalized: Sequence[str]) -> np.ndarray:
    """``fingerprint`` of each already normalised URL, as a uint64 array."""
    h = xxhash.xxh3_64_intdigest
    return np.fromiter((h(u.encode("utf-8")) for u in normalized), dtype=np.uint64,
                       count=len(normalized))


def canonical_set(url_set: dict[str, int], max_length: int = 2048) -> tuple[dict[str, int], int]:
    """A received ``URL_set`` in canonical form, and how many of its URLs were refused.

    A daemon trusts no peer's spelling: every URL is normalised with the rules a host
    applies before it stores anything (two spellings of one page are one URL; a URL a
    pool may not hold never reaches one). Spellings that meet keep the highest value
    (seen wins)."""
    out: dict[str, int] = {}
    bad = 0
    for url, value in url_set.items():
        try:
            key = normalize(url, max_length=max_length)
        except BadURL:
            bad += 1
            continue
        if value > out.get(key, -1):
            out[key] = value
    return out, bad


def set_digest(urls: Iterable[str]) -> int:
    """A set's content as one non-zero 64-bit number (order does not matter): tells a
    frame sent again from a different set that reuses its number."""
    h = xxhash.xxh3_64_intdigest
    return (sum(h(u.encode("utf-8")) for u in urls) & 0xFFFF_FFFF_FFFF_FFFF) or 1


_SITE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#]*@)?(\[[^\]/?#@]*\]|[^:/?#@]*)")


def site_of(normalized: str) -> str:
    """The site of a normalised URL: its lowercased host, without port or userinfo.

    IPv6 hosts keep their brackets (``"[::1]"``). Raises ``ValueError`` on a string that
    is not an absolute URL with an authority.
    """
    m = _SITE.match(normalized)
    if m is None:
        raise ValueError(f"not a normalised URL: {normalized[:200]!r}")
    return m.group(1).lower()


class URLGate:
    """Normalises a stream of incoming URLs, counting acceptances and rejections per reason."""

    def __init__(self, max_length: int = 2048):
        self.max_length = max_length
        self.accepted: int = 0
        self.rejected: collections.Counter[str] = collections.Counter()

    def accept(self, urls: Iterable[str | bytes]) -> list[str]:
        """Normalised form of each acceptable URL, in input order (duplicates kept)."""
        out: list[str] = []
        max_length = self.max_length
        for url in urls:
            try:
                out.append(normalize(url, max_length=max_length))
            except BadURL as e:
                self.rejected[e.reason] += 1
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("rejected URL (%s): %s", e.reason, repr(url)[:200])
        self.accepted += len(out)
        return out
