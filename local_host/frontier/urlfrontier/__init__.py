"""The URLFrontier API's service definition (urlfrontier.proto), as a package so that
an installed dedupnet carries it; local_host/frontier/service.py compiles and serves it."""
