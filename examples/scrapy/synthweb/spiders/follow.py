"""Follows every link of every HTML page: the crawl dedupnet's own crawler does."""

import scrapy

#: Media types links are followed out of. The response class is no guide: Scrapy makes a
#: TextResponse of some non-HTML types (application/pdf among them).
HTML_TYPES = (b"text/html", b"application/xhtml+xml")


class FollowSpider(scrapy.Spider):
    name = "follow"

    def __init__(self, start_urls: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Start URLs are seeds: the scheduler sends them through the protocol, like
        # `dedupnet local --seed`. Without them the spider crawls what its host is given.
        self.start_urls = [u for u in start_urls.split(",") if u]

    def parse(self, response):
        ctype = response.headers.get(b"Content-Type", b"").split(b";")[0].strip().lower()
        if ctype not in HTML_TYPES or not hasattr(response, "xpath"):  # a PDF, an image: no links followed
            return
        yield {"url": response.url, "status": response.status,
               "title": response.css("title::text").get()}
        for href in response.xpath("//a/@href").getall():
            try:
                # urljoin honours <base href>; a link that is not a URL at all is skipped,
                # the rest (javascript:, mailto:, ...) the scheduler counts and drops.
                yield scrapy.Request(response.urljoin(href.strip()))
            except ValueError:
                self.crawler.stats.inc_value("follow/unusable_href")
