"""The example project's spider: links are followed out of HTML pages only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("scrapy")

from scrapy.http import Request  # noqa: E402
from scrapy.responsetypes import responsetypes  # noqa: E402

from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "scrapy"))
from synthweb.spiders.follow import FollowSpider  # noqa: E402


def _response(web: SyntheticWeb, url: str):
    """The response Scrapy builds for what the synthetic web answers for ``url``."""
    status, headers, body = web.expected_response(url)
    cls = responsetypes.from_args(headers={k.decode(): v for k, v in headers}, url=url, body=body)
    return cls(url, status=status, headers={k.decode(): v for k, v in headers}, body=body,
               request=Request(url))


def test_no_link_is_followed_out_of_a_pdf_whatever_response_class_scrapy_picks():
    web = SyntheticWeb(WebSpec(pages=100, sites=3, seed=1), port=8077)
    spider = FollowSpider(start_urls="")
    out = list(spider.parse(_response(web, web.examples()["pdf"])))
    assert out == []


def test_links_of_an_html_page_are_followed():
    web = SyntheticWeb(WebSpec(pages=100, sites=3, seed=1), port=8077)
    spider = FollowSpider(start_urls="")
    out = list(spider.parse(_response(web, web.examples()["home"])))
    assert any(isinstance(x, Request) for x in out) and isinstance(out[0], dict)
