"""Link resolution (local_host/crawler/links.py): the resolver's shortcuts give exactly what
``urllib.parse.urljoin`` gives, for the hrefs they take and for those they leave to it."""

import urllib.parse

import pytest
from hypothesis import given, settings, strategies as st

from local_host.crawler.links import _Joiner, extract_links

BASES = [
    "http://site.example/dir/index.html", "https://site.example/", "http://site.example",
    "http://Site.Example:8080/a/b/?q=1", "http://h/a//b/./c/../d", "http://h/../x/", "http://h/a;p",
    "http://h/a/b;p/c", "HTTP://h/x", "ftp://h/x", "http://[::1]:8/a/", "http://h?x", "mailto:a@b",
]
CASES = [
    "", "#top", "page.html", "d/x.html", "d/", "x?q=1", "x?", "x?#f", "x#f", "./x", "../x", "x/./y", "x/../y",
    "x//y", "x/.", "x/..", ".x", "..", "a:b", "x?a:b", "x;p", "x;", "/", "/a", "/a?", "/a?b", "/a#b", "/a/./b",
    "/a/../b", "/a//b", "//other.example/p", "/.well-known/x", "/a;b", "?q", "?", "http://o.example",
    "http://o.example/a?b#c", "http://o.example?x", "http://o.example/a?", "http://o.example/a;", "HTTP://O.example/A",
    "https://o.example/a", "Https://o.example/a?", "http:relative", "http:/x", "http:///x", "http://[::1]/x",
    "http://[bad/x", "http://h]/x", "http://é.example/x", "http://user:pw@o.example:81/a", "\x00x", "-x", "_x",
    "~x", "0x", "x y", "/ä/ö", "http://o.example/ä", "javascript:void(0)", "mailto:a@b", "\\x\\y", "http:\\\\h\\x",
]


def urljoin(base, href):
    try:
        return urllib.parse.urljoin(base, href).split("#", 1)[0]
    except ValueError:
        return ValueError


def joined(base, href):
    try:
        return _Joiner(base)(href)
    except ValueError:
        return ValueError


@pytest.mark.parametrize("base", BASES)
def test_every_case_resolves_as_urljoin_does(base):
    assert [joined(base, h) for h in CASES] == [urljoin(base, h) for h in CASES]


PIECES = st.sampled_from(["a", "B", "0", "/", ".", "..", "./", "../", "//", "?", "#", ";", ":", "@", "%", "%41",
                          "=", "&", "-", "_", "~", " ", "é", "[", "]", "\\", "http://", "HTTP://", "https://",
                          "h.example", ":80", "x.html"])


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(BASES), st.lists(PIECES, max_size=8).map("".join))
def test_any_href_resolves_as_urljoin_does(base, href):
    assert joined(base, href) == urljoin(base, href)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(["http://", "https://", "HTTP://"]), st.sampled_from(["h.example", "H:8080", "[::1]", ""]),
       st.lists(PIECES, max_size=8).map("".join))
def test_a_pages_directory_is_the_one_urljoin_gives(scheme, host, rest):
    base = scheme + host + rest
    try:
        want = urllib.parse.urljoin(base, "x")[:-1]
    except ValueError:
        want = ValueError
    try:
        joiner = _Joiner(base)
        got = joiner.directory if joiner.directory is not None else want
    except ValueError:
        got = ValueError
    assert got == want


def test_extract_links_keeps_page_order_drops_fragments_and_the_page_itself():
    html = ('<a href="b.html#x">1</a><a href="/c">2</a><a href="#top">3</a><a href="HTTP://o.example/d">4</a>'
            '<a href="mailto:a@b">5</a><a href="b.html">6</a><a href="http://[bad/">7</a>')
    links = extract_links(html, "http://site.example/dir/a.html")
    assert links.urls == ["http://site.example/dir/b.html", "http://site.example/c", "http://o.example/d"]
    assert links.found == 7 and links.dropped == {"fragment": 1, "scheme": 1, "unparsable": 1}


@pytest.mark.parametrize("tag", ['<base href="http://other.example/b/">', '<BaSe HREF="http://other.example/b/">'])
def test_a_base_href_in_any_case_is_what_links_resolve_against(tag):
    links = extract_links(f"<html><head>{tag}</head><body><a href='x'>1</a><a href=''>2</a></body></html>",
                          "http://site.example/dir/a.html")
    assert links.urls == ["http://other.example/b/x", "http://other.example/b/"]
