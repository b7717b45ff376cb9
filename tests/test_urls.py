"""Tests for dedupnet.codec.urls: normalisation rules, rejection reasons, fingerprints, URLGate."""

from __future__ import annotations

import logging
import urllib.parse

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dedupnet.codec import urls
from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import URLGate, fingerprint, fingerprint_many, normalize, site_of
from dedupnet.harness.url_cases import NORMALISED, REJECTED

# ---------------------------------------------------------------------------------------
# Table-driven rules (dedupnet/harness/url_cases.py)


@pytest.mark.parametrize("raw, expected", NORMALISED)
def test_normalize(raw, expected):
    assert normalize(raw) == expected
    assert normalize(raw.encode("utf-8")) == expected


@pytest.mark.parametrize("raw, expected", NORMALISED)
def test_table_outputs_are_fixed_points(raw, expected):
    assert normalize(expected) == expected


@pytest.mark.parametrize("raw, reason", REJECTED)
def test_rejection_reasons(raw, reason):
    with pytest.raises(BadURL) as info:
        normalize(raw)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    "raw", [b"http://example.com/\xff", b"\xc3(", b"http://ex\xe4mple.com/"]
)
def test_undecodable_bytes(raw):
    with pytest.raises(BadURL) as info:
        normalize(raw)
    assert info.value.reason == "undecodable"


def test_lone_surrogate_is_undecodable():
    with pytest.raises(BadURL) as info:
        normalize("http://example.com/\ud800")
    assert info.value.reason == "undecodable"


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError):
        normalize(None)  # type: ignore[arg-type]


def test_length_limit_applies_to_normalised_url():
    base = "http://example.com/"
    exact = base + "a" * (100 - len(base))
    assert normalize(exact, max_length=100) == exact
    with pytest.raises(BadURL) as info:
        normalize(exact + "a", max_length=100)
    assert info.value.reason == "too-long"
    # Shrinks under normalisation: accepted although the raw input is longer than the limit.
    shrinking = base + "./" * 100 + "a"
    assert normalize(shrinking, max_length=100) == base + "a"
    # Grows under normalisation: rejected although the raw input is within the limit.
    growing = base + "ä" * 30
    assert len(growing) < 100
    with pytest.raises(BadURL) as info:
        normalize(growing, max_length=100)
    assert info.value.reason == "too-long"


@pytest.mark.parametrize("as_bytes", [False, True])
def test_raw_input_longer_than_four_times_the_limit_is_rejected_early(as_bytes):
    base = "http://example.com/"
    raw = base + "./" * ((400 - len(base)) // 2 + 1)
    assert len(raw) > 400
    with pytest.raises(BadURL) as info:
        normalize(raw.encode() if as_bytes else raw, max_length=100)
    assert info.value.reason == "too-long"
    # one character less is fine, it normalises to "http://example.com/"
    assert normalize(raw[:400], max_length=100) == base


def test_default_max_length_is_2048():
    base = "http://example.com/"
    assert normalize(base + "a" * (2048 - len(base))).endswith("a")
    with pytest.raises(BadURL):
        normalize(base + "a" * (2049 - len(base)))


def test_typical_url_takes_the_fast_path():
    # Guards the fast path: if its regex stopped matching, the equivalence property below
    # would be testing the full path against itself.
    for u in ["http://site12.example/a/b/page-3456.html?x=1", "https://example.com",
              "http://example.com:8080/a?b=%20"]:
        assert urls._FAST.match(u) is not None


# ---------------------------------------------------------------------------------------
# Properties

_HOSTS = st.sampled_from([
    "example.com", "EXAMPLE.com", "example.com.", "a-b.c_d.example", "site12.example",
    "bücher.example", "xn--bcher-kva.example", "[::1]", "[2001:DB8::0:1]", "127.0.0.1",
    "", ".", "a..b", "-", "ex%41mple.com", "exa mple", "[::1", "例え.テスト",
])
_PORTS = st.one_of(
    st.just(""),
    st.sampled_from([":", ":80", ":443", ":8080", ":080", ":0", ":65535", ":65536", ":x"]),
    st.integers(0, 70000).map(lambda p: f":{p}"),
)
_PIECES = st.sampled_from([
    "a", "B", "page-3456.html", ".", "..", "...", ".a", "%7e", "%7E", "%2f", "%2F", "%41",
    "%e2%82%ac", "%", "%2", "%zz", " ", "ä", "~", "_", "!", "$", "&", "'", "(", ")", "*",
    "+", ",", ";", "=", ":", "@", "[", "]", "\\", "{", "|", "^", "`", '"', "<", ">", "%25",
    "%2E", "%2e%2E", "€",
])
_SEGMENT = st.lists(_PIECES, max_size=4).map("".join)
_PATH = st.lists(_SEGMENT, max_size=5).map(lambda segs: "".join("/" + s for s in segs))
_QUERY = st.one_of(
    st.just(""),
    st.lists(st.one_of(_PIECES, st.sampled_from(["/", "?", "=", "&", "x=1"])), max_size=6)
    .map(lambda p: "?" + "".join(p)),
)
_FRAGMENT = st.one_of(st.just(""), _SEGMENT.map(lambda s: "#" + s))
_SCHEME = st.sampled_from(["http", "https", "HTTP", "Https", "ftp"])
_USERINFO = st.sampled_from(["", "", "", "user@", "U:P@", "@", "a%7e@"])

URL_LIKE = st.builds(
    lambda scheme, userinfo, host, port, path, query, fragment: (
        f"{scheme}://{userinfo}{host}{port}{path}{query}{fragment}"
    ),
    _SCHEME, _USERINFO, _HOSTS, _PORTS, _PATH, _QUERY, _FRAGMENT,
)
# Mostly clean URLs, which exercise the fast path.
_ESCAPES = st.sampled_from(["%2F", "%20", "%E2%82%AC", "%FF", "%3A", "%25"])
_CLEAN_TEXT = st.lists(
    st.one_of(st.from_regex(r"[A-Za-z0-9._~!$&'()*+,;=:@-]{1,6}", fullmatch=True), _ESCAPES),
    max_size=3,
).map("".join)
CLEAN_URL = st.builds(
    lambda scheme, host, port, path, query: f"{scheme}://{host}{port}{path}{query}",
    st.sampled_from(["http", "https"]),
    st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True),
    st.sampled_from(["", ":80", ":443", ":8080", ":1", ":99999"]),
    st.lists(st.one_of(_CLEAN_TEXT, st.sampled_from([".", "..", ".a", "..."])), max_size=4)
    .map(lambda segs: "".join("/" + s for s in segs)),
    st.one_of(st.just(""), st.lists(st.one_of(_CLEAN_TEXT, st.sampled_from(["/", "?", "&"])),
                                     max_size=4).map(lambda p: "?" + "".join(p))),
)

# A clean URL with one token inserted after the host, which may or may not push it off the
# fast path: these probe the edge of the fast path's regex.
_TWEAK = st.sampled_from([
    "%7E", "%7e", "%e2%82%ac", "%8a", "%Fa", "%2f", "%2E", "%41", "%5F", "%", "%4",
    ".", "..", "/.", "/..", "/./", "/../", "?", "#", ":", "A", "@", " ", "ä", "[",
])


def _insert_after_host(url: str, i: int, token: str) -> str:
    start = url.index("/", 8) if "/" in url[8:] else len(url)
    at = start + i % (len(url) - start + 1)
    return url[:at] + token + url[at:]


NEAR_CLEAN_URL = st.builds(_insert_after_host, CLEAN_URL, st.integers(0, 200), _TWEAK)
ANY_URL = st.one_of(URL_LIKE, CLEAN_URL, NEAR_CLEAN_URL)


def _outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except BadURL as e:
        return ("bad", e.reason)


@given(ANY_URL)
@example("http://example.com/a/%2e%2E/b")
@example("http://example.com/%%41")
def test_idempotent(url):
    kind, value = _outcome(normalize, url)
    if kind == "ok":
        assert normalize(value) == value


@given(st.text(max_size=80))
def test_idempotent_on_arbitrary_text(text):
    kind, value = _outcome(normalize, "http://example.com/" + text)
    if kind == "ok":
        assert normalize(value) == value


def _full(url: str) -> str:
    """The full path alone, after the stripping that ``normalize`` does first."""
    return urls._normalize_full(url.strip(urls._C0_OR_SPACE))


@given(ANY_URL)
@example("http://example.com/a/..?q=1")
@example("http://example.com/.")
@example("http://example.com:80?q")
@example("http://example.com:99999/")
@example("http://example.com/%7E")
@example("http://example.com/%e2%82%ac")
@example("http://example.com/%8a")
def test_fast_path_equals_full_path(url):
    assert _outcome(normalize, url, max_length=10**6) == _outcome(_full, url)


@given(NEAR_CLEAN_URL)
def test_fast_path_equals_full_path_near_clean(url):
    assert _outcome(normalize, url, max_length=10**6) == _outcome(_full, url)


@given(st.one_of(CLEAN_URL, NEAR_CLEAN_URL))
def test_output_uses_only_allowed_characters(url):
    kind, value = _outcome(normalize, url)
    if kind == "ok":
        assert value.isascii()
        assert value.startswith(("http://", "https://"))
        parts = urllib.parse.urlsplit(value)
        assert "#" not in value
        assert parts.query or "?" not in value
        assert parts.path.startswith("/")
        assert parts.hostname == parts.hostname.lower()


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200),
                 st.text(max_size=100).map(lambda t: "http://" + t),
                 st.binary(max_size=100).map(lambda b: b"https://" + b)))
def test_arbitrary_input_raises_only_badurl(raw):
    try:
        result = normalize(raw)
    except BadURL as e:
        assert e.reason in {"scheme", "no-host", "undecodable", "unparsable", "bad-host",
                            "too-long"}
    else:
        assert normalize(result) == result


def _rfc3986_remove_dot_segments(path: str) -> str:
    """The §5.2.4 algorithm, literally, as a reference."""
    inp, out = path, ""
    while inp:
        if inp.startswith("../"):
            inp = inp[3:]
        elif inp.startswith("./"):
            inp = inp[2:]
        elif inp.startswith("/./"):
            inp = inp[2:]
        elif inp == "/.":
            inp = "/"
        elif inp.startswith("/../"):
            inp = inp[3:]
            out = out[: max(out.rfind("/"), 0)]
        elif inp == "/..":
            inp = "/"
            out = out[: max(out.rfind("/"), 0)]
        elif inp in (".", ".."):
            inp = ""
        else:
            start = 1 if inp.startswith("/") else 0
            end = inp.find("/", start)
            end = len(inp) if end < 0 else end
            out, inp = out + inp[:end], inp[end:]
    return out


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "...", ".x"]), max_size=8))
@example(["a", "", "..", "b"])
def test_remove_dot_segments_matches_rfc(segments):
    path = "".join("/" + s for s in segments) or "/"
    assert urls._remove_dot_segments(path) == _rfc3986_remove_dot_segments(path)


# ---------------------------------------------------------------------------------------
# Fingerprints and sites

def test_fingerprint_is_xxh3_64():
    # XXH3_64bits("") with seed 0: pins the algorithm every host must agree on.
    assert fingerprint("") == 0x2D06800538D394C2


@given(ANY_URL)
def test_fingerprint_deterministic_and_64_bit(url):
    kind, value = _outcome(normalize, url)
    s = value if kind == "ok" else url
    fp = fingerprint(s)
    assert isinstance(fp, int)
    assert 0 <= fp < 2**64
    assert fingerprint(str(s)) == fp


def test_fingerprint_separates_different_urls():
    fps = {fingerprint(f"http://example.com/{i}") for i in range(10_000)}
    assert len(fps) == 10_000


@given(st.lists(st.text(max_size=30), max_size=20))
def test_fingerprint_many_equals_fingerprint(strings):
    arr = fingerprint_many(strings)
    assert isinstance(arr, np.ndarray)
    assert arr.dtype == np.uint64
    assert arr.shape == (len(strings),)
    assert [int(x) for x in arr] == [fingerprint(s) for s in strings]


def test_fingerprint_many_keeps_high_bit_values():
    strings = [f"http://example.com/{i}" for i in range(200)]
    high = [s for s in strings if fingerprint(s) >= 2**63]
    assert high, "expected some fingerprints above 2**63"
    assert [int(x) for x in fingerprint_many(high)] == [fingerprint(s) for s in high]
    assert fingerprint_many(tuple(high)).dtype == np.uint64


@pytest.mark.parametrize("url, site", [
    ("http://example.com/", "example.com"),
    ("https://example.com:8443/a?b=c", "example.com"),
    ("http://user:pw@example.com:81/", "example.com"),
    ("http://a@b@example.com/x@y", "example.com"),
    ("http://[::1]:8080/", "[::1]"),
    ("http://[2001:db8::1]/", "[2001:db8::1]"),
    ("http://xn--bcher-kva.example/", "xn--bcher-kva.example"),
    ("HTTP://EXAMPLE.COM", "example.com"),
    ("http://example.com?x=http://other/", "example.com"),
])
def test_site_of(url, site):
    assert site_of(url) == site


@pytest.mark.parametrize("bad", ["", "example.com", "/a/b", "mailto:x@y"])
def test_site_of_rejects_non_urls(bad):
    with pytest.raises(ValueError):
        site_of(bad)


@given(ANY_URL)
def test_site_of_agrees_with_urllib(url):
    kind, value = _outcome(normalize, url)
    if kind == "ok":
        host = urllib.parse.urlsplit(value).hostname
        expected = f"[{host}]" if ":" in host else host
        assert site_of(value) == expected


# ---------------------------------------------------------------------------------------
# URLGate

def test_gate_counts_and_keeps_order_and_duplicates():
    gate = URLGate()
    out = gate.accept([
        "http://B.example/", b"http://a.example:80/x", "ftp://x/", "http://B.example",
        b"\xff", "http:///", "mailto:a@b",
    ])
    assert out == ["http://b.example/", "http://a.example/x", "http://b.example/"]
    assert gate.accepted == 3
    assert gate.rejected == {"scheme": 2, "undecodable": 1, "no-host": 1}
    out2 = gate.accept(iter(["http://c.example/", "http://[::1/"]))
    assert out2 == ["http://c.example/"]
    assert gate.accepted == 4
    assert gate.rejected == {"scheme": 2, "undecodable": 1, "no-host": 1, "unparsable": 1}


def test_gate_uses_its_max_length():
    gate = URLGate(max_length=30)
    ok = "http://example.com/abc"
    long = "http://example.com/" + "a" * 20
    assert gate.accept([ok, long]) == [ok]
    assert gate.rejected == {"too-long": 1}
    assert gate.accepted == 1


def test_gate_logs_rejections_at_debug(caplog):
    gate = URLGate()
    long_bad = "ftp://example.com/" + "x" * 1000
    with caplog.at_level(logging.DEBUG, logger="dedupnet.codec.urls"):
        gate.accept(["http://ok.example/", long_bad, b"\xfe"])
    records = [r for r in caplog.records if r.name == "dedupnet.codec.urls"]
    assert len(records) == 2
    assert all(r.levelno == logging.DEBUG for r in records)
    first, second = (r.getMessage() for r in records)
    assert "scheme" in first and "ftp://example.com/" in first
    assert "undecodable" in second and "\\xfe" in second
    for r in records:
        shown = r.args[-1]
        assert len(shown) <= 200
    assert len(records[0].args[-1]) == 200
    assert "\n" not in first


def test_gate_does_not_log_acceptances(caplog):
    with caplog.at_level(logging.DEBUG, logger="dedupnet.codec.urls"):
        URLGate().accept(["http://ok.example/"] * 3)
    assert [r for r in caplog.records if r.name == "dedupnet.codec.urls"] == []
