"""What the synthetic web's pages say: the bytes of every page (HTML with its links
spelled in many ways, broken markup, the odd, huge and PDF pages), robots.txt, and
the answer to a request for any URL once its flaky 503s are over."""

from __future__ import annotations

from dedupnet.codec.urls import normalize
from dedupnet.harness.webgraph import ABS, ABS_UPPER, BROKEN, FRAGMENT, HUGE, ODD, PDF, REL, ROOT, WORDS, WebGraph

__all__ = ["WebPages"]


def _relative(base_dir: str, path: str) -> str:
    """A relative href from directory ``base_dir`` (ends in "/") to absolute ``path``."""
    b = base_dir.split("/")[1:-1]
    d, _, name = path.rpartition("/")
    t = d.split("/")[1:]
    common = 0
    while common < len(b) and common < len(t) and b[common] == t[common]:
        common += 1
    href = "../" * (len(b) - common) + "".join(s + "/" for s in t[common:]) + name
    return href or "./"


class WebPages(WebGraph):
    """The graph's pages as bytes, rendered on demand and cached (up to 50,000 pages; the
    huge page once)."""

    def _forget_bodies(self) -> None:
        self._cache: dict[int, bytes] = {}
        self._huge: bytes | None = None

    def robots_txt(self, site: int) -> bytes:
        return (f"# synthetic web, site {site}\n"
                "User-agent: BadBot\nDisallow: /\n\n"
                "User-agent: *\nDisallow: /private/\n").encode()

    def _href(self, t: int, form: int, base_site: int, base_dir: str, k: int) -> str:
        if t >= 0:
            ts, tp = self.site[t], self.paths[t]
        else:
            ts, tp = self.missing_site[-t - 1], self.missing_path[-t - 1]
        style = form & 7
        if ts != base_site or style == ABS:
            href = self.origins[ts] + tp
        elif style == ABS_UPPER:
            href = "HTTP://" + self.origins[ts][7:] + tp
        elif style == ROOT:
            href = tp
        elif style == REL:
            href = _relative(base_dir, tp)
        else:  # ODD_SPELL: a dot segment or an escaped unreserved character
            href = tp.replace("/p", "/%70", 1) if "/p" in tp else "/." + tp
        if form & FRAGMENT:
            href += f"#s{k}"
        return href

    def _html(self, i: int) -> bytes:
        s, path = self.site[i], self.paths[i]
        opt = self.base_opt[i]
        base_tag = ""
        base_site, base_dir = s, path[: path.rfind("/") + 1]
        if opt == 1:
            base_tag = f'<base href="{self.origins[s]}{base_dir}">'
        elif opt == 2:
            base_tag, base_dir = '<base href="/">', "/"
        elif opt == 3:
            base_site, base_dir = (s + 1) % self.spec.sites, "/d1/"
            base_tag = f'<base href="{self.origins[base_site]}/d1/">'
        forms = self.forms[i]
        items = "".join(
            f'<li><a href="{self._href(t, forms[k], base_site, base_dir, k)}">link {k}</a></li>\n'
            for k, t in enumerate(self.links[i]))
        return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Page {i}</title>{base_tag}'
                f"</head>\n<body><h1>Page {i} of site {s}</h1>\n<p>{self._filler[i % 4]}</p>\n"
                f"<ul>\n{items}</ul>\n</body></html>\n").encode()

    def _broken_html(self, i: int) -> bytes:
        """Broken markup whose links are still unambiguous (quoted, unquoted, uppercase,
        attributes spread over lines, unclosed tags), plus bytes that are not UTF-8."""
        # Broken, but not so broken that a browser would see no links: an unclosed
        # <title> would swallow the whole document as its text (HTML5 RCDATA).
        parts = ['<html><head><title>broken</title><body><p>a < b && c > d</div></span>\n']
        for k, t in enumerate(self.links[i]):
            tp = self._target_url(t) if k % 2 else self._href(t, ROOT, self.site[i], "/", k)
            parts.append((f"<a href={tp}>unquoted {k}</a>", f"<A HREF='{tp}'>UPPER {k}",
                          f'<a\nclass="c{k}"\n   href = "{tp}"\n>spread</a>',
                          f'<p><b><i><a href="{tp}">unclosed {k}</b></i>')[k % 4] + "\n")
        parts.append("<table><tr><td>cell<td>cell</table")
        return "".join(parts).encode() + b"\n\xff\xfe not utf-8 \xc3\n<p>end"

    def _odd_html(self) -> bytes:
        base, hrefs = self._odd_hrefs()
        links = "".join(f'<a href="{h}">odd {k}</a>\n' for k, h in enumerate(hrefs))
        return (f'<html><head><title>Odd links</title><base href="{base}"></head>\n'
                f"<body>\n{links}</body></html>\n").encode()

    def _huge_html(self) -> bytes:
        if self._huge is None:
            line = b"<p>" + " ".join(WORDS).encode() + b"</p>\n"
            head = b"<!DOCTYPE html>\n<html><head><title>Huge</title></head><body>\n"
            n = self.spec.huge_size // len(line) + 1
            self._huge = head + line * n + b"</body></html>\n"
        return self._huge

    def _pdf(self) -> bytes:
        trap = self.origins[0] + "/trap/pdf-link.html"
        return (b"%PDF-1.4\n% synthetic\n1 0 obj << /Type /Catalog >> endobj\n"
                b"2 0 obj << /URI (" + trap.encode() + b") >> endobj\n"
                b'<a href="' + trap.encode() + b'">not a link: this is a PDF</a>\n%%EOF\n')

    def _body(self, i: int) -> bytes:
        k = self.kind[i]
        if k == HUGE:
            return self._huge_html()
        body = self._cache.get(i)
        if body is None:
            body = (self._pdf() if k == PDF else self._broken_html(i) if k == BROKEN
                    else self._odd_html() if k == ODD else self._html(i))
            if len(self._cache) < 50_000:
                self._cache[i] = body
        return body

    def expected_response(self, url: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``(status, headers, body)`` the server answers for ``url`` once any flaky 503s
        are over. Pure: counts nothing."""
        i = self.lookup(normalize(url))
        if i is None:
            return 404, [(b"content-type", b"text/html; charset=utf-8")], b"<html><body>Not Found</body></html>\n"
        if i in self.redirect_to:
            t, status = self.redirect_to[i]
            # Same-site redirects use a root-relative Location (RFC 9110 allows it).
            loc = self.paths[t] if self.site[t] == self.site[i] and t % 2 else self.url(t)
            return status, [(b"content-type", b"text/html; charset=utf-8"), (b"location", loc.encode())], \
                b"<html><body>Moved</body></html>\n"
        ctype = b"application/pdf" if self.kind[i] == PDF else b"text/html; charset=utf-8"
        return 200, [(b"content-type", ctype)], self._body(i)
