"""Follows every link of every HTML page: the crawl dedupnet's own crawler does."""

import scrapy
from scrapy.http import TextResponse


class FollowSpider(scrapy.Spider):
    name = "follow"

    def __init__(self, start_urls: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Start URLs are seeds: the scheduler sends them through the protocol, like
        # `dedupnet local --seed`. Without them the spider crawls what its host is given.
        self.start_urls = [u for u in start_urls.split(",") if u]

    def parse(self, response):
        if not isinstance(response, TextResponse):  # a PDF, an image: no links followed
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
