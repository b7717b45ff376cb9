"""The canonical form of a URL by cases: raw URLs and the form ``dedupnet.codec.urls.normalize``
gives them, and URLs it refuses with the reason it gives. Our tests hold the normaliser to
them, and bench/compare_url_libs.py holds URL libraries to the same cases."""

from __future__ import annotations

__all__ = ["NORMALISED", "REJECTED"]

#: (raw, canonical form).
NORMALISED = [
    # scheme and host case
    ("HTTP://EXAMPLE.COM/", "http://example.com/"),
    ("HtTpS://Example.Com/Path/Is/Kept", "https://example.com/Path/Is/Kept"),
    # default ports go, other ports stay (without leading zeros); an empty port goes
    ("http://example.com:80/", "http://example.com/"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("http://example.com:443/", "http://example.com:443/"),
    ("https://example.com:80/", "https://example.com:80/"),
    ("http://example.com:8080/", "http://example.com:8080/"),
    ("http://example.com:0080/", "http://example.com/"),
    ("http://example.com:/", "http://example.com/"),
    # fragments are dropped
    ("http://example.com/a#frag", "http://example.com/a"),
    ("http://example.com/a?b=1#frag?x", "http://example.com/a?b=1"),
    ("http://example.com#", "http://example.com/"),
    # dot segments
    ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ("http://example.com/a/b/c/./../../g", "http://example.com/a/g"),
    ("http://example.com/../../a", "http://example.com/a"),
    ("http://example.com/a/..", "http://example.com/"),
    ("http://example.com/a/.", "http://example.com/a/"),
    ("http://example.com/a/..?q", "http://example.com/?q"),
    ("http://example.com/a/.b/..c/...", "http://example.com/a/.b/..c/..."),
    ("http://example.com/a/%2E%2E/b", "http://example.com/b"),  # decoded first, then removed
    # empty path
    ("http://example.com", "http://example.com/"),
    ("http://example.com?q=1", "http://example.com/?q=1"),
    # percent-encoding
    ("http://example.com/%7e", "http://example.com/~"),
    ("http://example.com/%7Euser/%41%62%2D%2e%5F", "http://example.com/~user/Ab-._"),
    ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
    ("http://example.com/%3f%23%25", "http://example.com/%3F%23%25"),
    ("http://example.com/a b", "http://example.com/a%20b"),
    ("http://example.com/ä", "http://example.com/%C3%A4"),
    ("http://example.com/€?q=€", "http://example.com/%E2%82%AC?q=%E2%82%AC"),
    ("http://example.com/100%", "http://example.com/100%25"),
    ("http://example.com/%zz%4", "http://example.com/%25zz%254"),
    ("http://example.com/a\\b{c}|\"<>^`", "http://example.com/a%5Cb%7Bc%7D%7C%22%3C%3E%5E%60"),
    # reserved characters are kept as they are
    ("http://example.com/a:b@c;d=e,f+g!$&'()*[]", "http://example.com/a:b@c;d=e,f+g!$&'()*[]"),
    ("http://example.com/?a=1&b=/c?d:e@f", "http://example.com/?a=1&b=/c?d:e@f"),
    # the query keeps its order; an empty query goes
    ("http://example.com/?b=2&a=1&b=1", "http://example.com/?b=2&a=1&b=1"),
    ("http://example.com/?", "http://example.com/"),
    ("http://example.com/p?%7e=%7E&x=%2f", "http://example.com/p?~=~&x=%2F"),
    # IDNA
    ("http://bücher.example/", "http://xn--bcher-kva.example/"),
    ("http://BÜCHER.Example/", "http://xn--bcher-kva.example/"),
    ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
    ("http://例え.テスト/", "http://xn--r8jz45g.xn--zckzah/"),
    # trailing dot(s) on the host
    ("http://example.com./", "http://example.com/"),
    ("http://example.com.:80/a", "http://example.com/a"),
    ("http://bücher.example./", "http://xn--bcher-kva.example/"),
    # IP hosts
    ("http://[::1]:80/", "http://[::1]/"),
    ("http://[::1]:8080", "http://[::1]:8080/"),
    ("http://[0:0:0:0:0:0:0:1]/", "http://[::1]/"),
    ("http://[2001:DB8:0:0:1:0:0:1]/", "http://[2001:db8::1:0:0:1]/"),
    ("http://[2001:db8:0:1:1:1:1:1]/", "http://[2001:db8:0:1:1:1:1:1]/"),
    ("http://[::ffff:1.2.3.4]/", "http://[::ffff:1.2.3.4]/"),
    ("http://192.168.0.1:80/", "http://192.168.0.1/"),
    # userinfo is kept verbatim (no case change, no re-encoding); an empty one goes
    ("http://User:PaSS@Example.com/", "http://User:PaSS@example.com/"),
    ("http://u%7e:p@example.com:80/", "http://u%7e:p@example.com/"),
    ("http://a@b@example.com/", "http://a@b@example.com/"),
    ("http://@example.com/", "http://example.com/"),
    # surrounding C0 controls and spaces are stripped
    ("  http://example.com/a \n", "http://example.com/a"),
    ("\x00\thttp://example.com/", "http://example.com/"),
    # already normalised URLs come back unchanged (the fast path)
    ("http://site12.example/a/b/page-3456.html?x=1",
     "http://site12.example/a/b/page-3456.html?x=1"),
    ("https://a.b_c-d.example:8443/x/.well-known/%2F?q=%20",
     "https://a.b_c-d.example:8443/x/.well-known/%2F?q=%20"),
]

#: (raw, the reason of its BadURL).
REJECTED = [
    ("ftp://example.com/", "scheme"),
    ("mailto:someone@example.com", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("//example.com/a", "scheme"),
    ("example.com/a", "scheme"),
    ("", "scheme"),
    ("http:", "no-host"),
    ("http:/a", "no-host"),
    ("http:///a", "no-host"),
    ("http://:80/", "no-host"),
    ("http://user@/", "no-host"),
    ("http://./", "no-host"),
    ("http://../", "no-host"),
    ("http://exa\tmple.com/", "unparsable"),
    ("http://example.com/a\nb", "unparsable"),
    ("http://example.com/a\rb", "unparsable"),
    ("http://example.com/a\x00b", "unparsable"),
    ("http://example.com/a\x7fb", "unparsable"),
    ("http://example.com/a\x85b", "unparsable"),
    ("http://example.com/a\u00a0b", "unparsable"),
    ("http://example.com/a\u2028b", "unparsable"),
    ("http://example.com:abc/", "unparsable"),
    ("http://example.com:65536/", "unparsable"),
    ("http://example.com:-1/", "unparsable"),
    ("http://example.com:8:8/", "unparsable"),
    ("http://example.com:١٢/", "unparsable"),  # non-ASCII digits
    ("http://[::1/", "unparsable"),
    ("http://::1]/", "unparsable"),
    ("http://[::1]x/", "unparsable"),
    ("http://[1.2.3.4]/", "unparsable"),
    ("http://[::g]/", "unparsable"),
    ("http://a b.example/", "bad-host"),
    ("http://exa%6dple.com/", "bad-host"),
    ("http://exa<mple.com/", "bad-host"),
    ("http://xn--ü.example/", "bad-host"),  # ACE prefix on a non-ASCII label
    ("http://ü" + "a" * 70 + ".example/", "bad-host"),  # label too long for IDNA
    ("http://a..ü/", "bad-host"),  # empty label
    ("http://ａ＜b.example/", "bad-host"),  # fullwidth "<" becomes "<" under IDNA
    ("http://ａ／b.example/", "unparsable"),  # urllib's NFKC check: it would become "/"
]
