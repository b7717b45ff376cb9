"""Settings of the example project: a plain Scrapy project plus the dedupnet lines.

Run next to a dedupnet host daemon started without its own crawler, e.g.

    dedupnet local --network 1 --ip 127.0.1.10 --center 127.0.1.1:7700 \
        --listen 127.0.1.10:7701 --no-crawl
    scrapy crawl follow -s DEDUPNET_HOST_IP=127.0.1.10 \
        -s DEDUPNET_DATA_DIR=dedupnet-data/host-127.0.1.10 -a start_urls=http://127.77.0.1:8077/

(any setting below can be given with -s NAME=VALUE instead).
"""

BOT_NAME = "synthweb"
SPIDER_MODULES = ["synthweb.spiders"]
NEWSPIDER_MODULE = "synthweb.spiders"

# -- dedupnet: the two lines a scrapy-redis user changes ---------------------------------
SCHEDULER = "dedupnet.scrapy.Scheduler"
DUPEFILTER_CLASS = "dedupnet.scrapy.DupeFilter"
# -- and where the host's pools are -------------------------------------------------------
# The host daemon's Redis: its --redis URL, or its --data-dir (its embedded Redis writes
# its URL to <data-dir>/redis.url).
# DEDUPNET_REDIS_URL = "redis://localhost:6379/0"
# DEDUPNET_DATA_DIR = "dedupnet-data/host-127.0.1.10"
# The host daemon's key prefix: its --prefix, or its --ip (prefix dedupnet:host:<ip>).
# DEDUPNET_PREFIX = "dedupnet:host:127.0.1.10"
# DEDUPNET_HOST_IP = "127.0.1.10"
# Close when the whole crawl is complete: a center's --listen address (and, with LAN
# keys, every network's key file), asked as `dedupnet status --cluster` asks it.
# DEDUPNET_CENTER = "127.0.1.1:7700"
# DEDUPNET_KEY_FILES = ["lan-1.key", "lan-2.key"]
# Without a center (or while none answers): close after this many seconds with nothing
# to do (0: stay open for new tasks).
DEDUPNET_MAX_IDLE = 0

# -- ordinary Scrapy settings ---------------------------------------------------------------
ROBOTSTXT_OBEY = True
USER_AGENT = "dedupnet-scrapy-example (+https://example.invalid/)"
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 4
DOWNLOAD_TIMEOUT = 15
# The synthetic web has pages that answer 503 twice before 200.
RETRY_TIMES = 3
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
