"""Every metric a daemon shows on ``/metrics``, declared once: its name as the code
counts it, its type, the labels it carries and the help text Prometheus shows.

The exposition (:func:`dedupnet.adapters.monitor.metrics.render_prometheus`) takes the
``# HELP`` lines from here, docs/METRICS.md's reference is generated from here
(``python -m dedupnet.adapters.monitor.metric_catalog``), and tests/test_metric_catalog.py
fails when the code counts a name that is not declared here or the reference has
drifted: a metric an operator alerts on cannot be renamed or dropped by accident.

Names follow Prometheus' conventions: a counter is exposed as
``dedupnet_<name>_total``, a gauge as ``dedupnet_<name>``; a unit is the last word of the
name (``_bytes``, ``_seconds``), before ``_total``. Levels (pool sizes, members,
sets in flight) are gauges read from the daemon's status when ``/metrics`` is scraped
(dedupnet/adapters/monitor/levels.py); counters count from the daemon's start.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Metric", "METRICS", "PREFIX", "exposed_name", "reference_markdown"]

PREFIX = "dedupnet_"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "counter" or "gauge"
    help: str
    labels: tuple[str, ...] = ()
    #: Which daemons show it: "center", "host" or "both" (for the reference).
    role: str = "both"

    @property
    def exposed(self) -> str:
        return exposed_name(self.name, self.kind)


def exposed_name(name: str, kind: str, prefix: str = PREFIX) -> str:
    """The name Prometheus sees: counters end in ``_total``."""
    full = prefix + name
    return full + "_total" if kind == "counter" and not full.endswith("_total") else full


def _c(name: str, help: str, *labels: str, role: str = "both") -> Metric:
    return Metric(name, "counter", help, labels, role)


def _g(name: str, help: str, *labels: str, role: str = "both") -> Metric:
    return Metric(name, "gauge", help, labels, role)


_ALL = (
    # -- levels, read from the daemon's status at each scrape (dedupnet/adapters/monitor/levels.py) --
    _g("info", "Always 1; its labels say what this daemon is (role, network).", "role", "network"),
    _g("store_up", "1 if this scrape read the daemon's Redis (its pool sizes), 0 if that failed or took too "
                   "long: the levels below are then missing."),
    _g("pool_entries", "Entries in one of this daemon's Redis pools: a center's local_reduce_pool and "
                       "dist_reduce_pool (sets) and task_URL (tasks); a host's URL_pool (found URLs), task_pool "
                       "(tasks to crawl) and unacked_sets.", "pool"),
    _g("members", "Members of a center by kind (host, peer) and state (live, late: silent past two "
                  "heartbeat intervals, down: not connected).", "kind", "state", role="center"),
    _g("member_up", "1 while a host or peer network is connected to this center (live or late), 0 when "
                    "down.", "member", "kind", role="center"),
    _g("member_silent_seconds", "Seconds since this center last heard from a connected member.",
       "member", "kind", role="center"),
    _g("sets_in_flight", "Sets in flight by stage (a center: lan, dist, home, check; a host: unacked, "
                         "sent and not yet acknowledged by its center).", "stage"),
    _g("sets_oldest_age_seconds", "Age of the oldest set in flight at a stage, since this center stored "
                                  "it (0: none).", "stage", role="center"),
    _g("sets_held_back", "Sets held back by a center that had no room for them (acknowledged when room "
                         "frees).", role="center"),
    _g("sets_waiting", "Sets in flight that wait for this member's answer (a host, or net:N for a peer "
                       "network).", "member", role="center"),
    _g("urls_waiting", "URLs this center holds for a home network that has not taken them yet (home "
                       "routing).", "network", role="center"),
    _g("task_urls", "URLs assigned to a host and not yet acknowledged by it (task_URL); host=\"none\": "
                    "admitted while no host was there.", "host", role="center"),
    _g("reported_task_pool", "A host's task_pool size as its last heartbeat gave it (kept while it is "
                             "down: what it holds).", "host", role="center"),
    _g("crawl_verdict", "This network's crawl as its center judges it, asking its live hosts: 1 for the "
                        "current verdict (complete, in progress, stuck, not started, unknown: not judged "
                        "in time).",
       "verdict", role="center"),
    _g("center_connected", "1 while this host is connected to its center.", role="host"),
    _g("pages_in_progress", "Pages this host's crawler is fetching or writing.", role="host"),
    _g("fetch_slots_in_use", "Requests this host's crawler has on the wire (of its concurrency).", role="host"),
    _g("frontier_sites", "Sites with tasks queued in this host's frontier; state=\"waiting\": those whose "
                         "politeness allows none now.", "state", role="host"),
    _g("frontier_ready_wait_seconds", "How long the site of this host's frontier that has been ready "
                                      "longest has waited for a fetch slot (0: none ready).", role="host"),
    _g("durable_acks", "1 if this daemon's Redis confirms writes on disk before a dependent message goes "
                       "(WAITAOF), 0 if it cannot."),
    _g("store_memory_full", "1 while this daemon's Redis is past its maxmemory and refuses writes: the daemon "
                            "takes no new work until it has room again (nothing acknowledged is lost)."),
    # -- transport (dedupnet/adapters/net/transport/, tls.py) --
    _c("frames_received", "Messages decoded, by kind (flag only for kind frame).", "kind", "flag"),
    _c("frames_sent", "Messages written, by kind.", "kind"),
    _c("received_bytes", "Bytes read from sockets."),
    _c("sent_bytes", "Bytes of messages written (compressed where negotiated)."),
    _c("sent_kind_bytes", "Bytes of messages written, by kind.", "kind"),
    _c("compressed_sent", "Messages sent with a compressed body."),
    _c("compressed_received", "Messages received with a compressed body."),
    _c("urgent_replaced", "Unsent urgent messages (heartbeats) replaced by a newer one."),
    _c("bad_input", "Input refused as malformed or unauthentic, by reason (bad-magic, too-large, bad-tag, "
                    "bad-url, ...).", "reason"),
    _c("send_overflow", "Sends that found a connection's queue full (the peer is gone or stuck)."),
    _c("send_timeout", "Sends that waited past the send timeout."),
    _c("writer_error", "Connection writers that failed (the connection is closed)."),
    _c("connections_accepted", "TCP connections accepted."),
    _c("handshake_failed", "Connections refused during their handshake, by reason (timeout, tls, "
                           "wrong-network, bad-tag, too-many, ...).", "reason"),
    _c("throttled", "Receives that waited for a rate limit (bytes, messages).", "what"),
    _c("key_reloads", "Key files re-read after they changed."),
    _c("key_reload_failed", "Key files that changed and could not be read (the old keys stay)."),
    _c("handler_error", "Connection handlers that raised (logged with a traceback)."),
    _c("connected", "Outgoing connections made."),
    _c("connect_failed", "Outgoing connection attempts that failed."),
    _c("session_error", "Outgoing sessions that raised (logged)."),
    _c("heartbeat_missed", "Members or servers that went silent past the heartbeat timeout (closed)."),
    _c("tls_handshakes", "TLS handshakes completed."),
    _c("tls_sent_bytes", "TCP bytes sent on TLS connections (records, handshakes, alerts)."),
    _c("tls_received_bytes", "TCP bytes received on TLS connections."),
    _c("tls_payload_sent_bytes", "The part of sent_bytes that went inside TLS."),
    _c("log_suppressed", "Log lines about a connection not written, its source over its budget."),
    _c("send_skipped", "Messages not sent because their member was not connected (re-sent later)."),
    _c("leave_failed", "Leaves at shutdown that did not complete (timeout, error).", "reason"),
    # -- discovery (dedupnet/adapters/net/discovery.py) --
    _c("discovery_answered", "Discovery requests answered.", role="center"),
    _c("discovery_ignored", "Discovery requests ignored, by reason.", "reason", role="center"),
    _c("discovery_rejected", "Discovery messages refused, by reason.", "reason"),
    _c("discovery_failed", "Discovery socket operations that failed (bind, receive, send, address).",
       "reason"),
    # -- Redis and the HTTP endpoint --
    _c("store_errors", "Redis calls that failed and are retried until Redis answers."),
    _c("redis_restarts", "Times the embedded Redis died and was restarted."),
    _c("http_errors", "HTTP requests answered with another status than 200.", "status"),
    _c("status_errors", "Parts of the status page that could not be measured.", "part"),
    # -- the protocol (center_host/protocol.py, local_host/protocol.py) --
    _c("rejected", "Messages or sets refused, by reason (number-reused, unexpected-message, map-mismatch, "
                   "...).", "reason"),
    _c("frames_in", "Frames a center handled, by stage (lan, dist) and flag.", "stage", "flag", role="center"),
    _c("urls_in", "URLs in frames a center handled, by stage (lan, routed, foreign, check).", "stage",
       role="center"),
    _c("urls_admitted", "URLs admitted: unseen everywhere, assigned as tasks to this network's hosts.",
       role="center"),
    _c("urls_dropped", "URLs dropped as duplicates, by the stage that found them.", "stage"),
    _c("urls_routed", "URLs sent to their home network to decide.", role="center"),
    _c("urls_checked", "URLs whose earlier home network was asked after the map moved their site here.",
       role="center"),
    _c("sets_rerouted", "Sets found at a restart routed under an earlier map, routed again by the current one.",
       role="center"),
    _c("routed_refused", "Sets a home network refused, by reason.", "reason", role="center"),
    _c("repeated_frames", "Frames received again (answered from what is stored).", role="center"),
    _c("repeated_answers", "Answers received again or for a set no longer in flight.", role="center"),
    _c("repeated_acks", "Acknowledgements received again or for nothing in flight."),
    _c("frames_held", "Sets held back because the center had no room for them.", role="center"),
    _c("peers_missing", "Peer networks not connected when a set was concluded without waiting for them.",
       role="center"),
    _c("sets_gathered", "Sets merged into an earlier one that claimed the same URLs.", role="center"),
    _c("sets_concluded", "Sets concluded; complete=\"false\": some member's answer was given up on.",
       "complete", role="center"),
    _c("resends", "Requests sent again for lack of an answer, by stage.", "stage", role="center"),
    _c("concluded_incomplete", "Sets concluded without an answer from a member, by stage.", "stage",
       role="center"),
    _c("tasks_reassigned", "Task URLs handed from a gone host to the LAN's other hosts.", role="center"),
    _c("tasks_handed_back", "Task URLs a leaving host handed back to its center.", role="center"),
    _c("tasks_reported", "Finished tasks reported: sent by a host, taken off its ledger by its center."),
    _c("reports_unknown", "Reported finished tasks that were not on the host's ledger (moved meanwhile).",
       role="center"),
    _c("hosts_reissued", "LAN hosts silent for reissue_after whose unfinished tasks went to the live hosts.",
       role="center"),
    _c("tasks_reissued", "Task URLs of hosts silent for reissue_after given to the LAN's live hosts.", role="center"),
    _c("tasks_dropped_moved", "Tasks this host dropped on its return: its center had given them to other hosts.",
       role="host"),
    _c("ledger_moved", "URLs on a gone host's ledger beyond its task_pool (fetched and not reported, or lost "
                       "with its disk) given to the LAN's other hosts.", role="center"),
    _c("stores_behind", "A member's Redis came back behind what it had reported (a lower step, or "
                        "another store id): noticed from its heartbeats, by member.", "member"),
    _c("rewind_unrepaired", "A member's store came back behind and not all it lost can be offered again "
                            "(no log of it here, or one too short), by member.", "member"),
    _c("tasks_reoffered", "Task URLs assigned again to a host whose store came back behind.", role="center"),
    _c("sets_reoffered", "Acknowledged sets a host sent again to a center whose store came back behind.",
       role="host"),
    _c("sets_sent", "Sets a host sent to its center.", role="host"),
    _c("sets_renumbered", "Sets a host sent again under a new number (the center had the old one).",
       role="host"),
    _c("sets_rejected", "Sets a host's center refused, by reason.", "reason", role="host"),
    _c("frames_resent", "Unacknowledged sets a host sent again after reconnecting.", role="host"),
    _c("own_requests_dropped", "Requests a host made itself, not answered.", role="host"),
    _c("answers_sent", "Answers a host gave to its center's requests.", role="host"),
    _c("tasks_received", "Task URLs a host received.", role="host"),
    # -- the crawler (local_host/crawler/crawl.py, local_host/daemon.py) --
    _c("pages_fetched", "HTTP responses received, by status.", "status", role="host"),
    _c("pages_done", "Tasks finished, by outcome.", "outcome", role="host"),
    _c("fetch_errors", "Fetches that failed, by kind.", "kind", role="host"),
    _c("fetches_held", "Fetches held while the host's Redis did not answer.", role="host"),
    _c("fetched_bytes", "Bytes of pages and robots.txt downloaded.", role="host"),
    _c("retries", "Fetches tried again.", role="host"),
    _c("redirects", "Redirects followed.", role="host"),
    _c("too_large", "Pages cut off at the size limit.", role="host"),
    _c("not_html", "Pages that were not HTML (no links taken).", role="host"),
    _c("links_found", "Links found in pages.", role="host"),
    _c("links_pushed", "Links pushed to URL_pool.", role="host"),
    _c("links_dropped", "Links dropped before URL_pool, by reason (out_of_scope, self, depth, ...).",
       "reason", role="host"),
    _c("robots_fetched", "robots.txt responses received, by status.", "status", role="host"),
    _c("robots_skipped", "URLs not fetched because robots.txt disallows them.", role="host"),
    _c("tasks_resumed", "Tasks this crawler had leased before a restart and took again.", role="host"),
    _c("tasks_given_up", "Tasks put back in task_pool before their request went out.", role="host"),
    _c("pages_cut_off", "Pages still on the wire when a leaving host's grace time ran out.", role="host"),
    _c("recrawls", "Re-crawls of the seeds started.", role="host"),
    _c("recrawl_urls", "Seed URLs queued again by re-crawls.", role="host"),
    # -- the URLFrontier service (local_host/frontier/service.py) --
    _c("frontier_urls_out", "URLs handed to URLFrontier clients (GetURLs).", role="host"),
    _c("frontier_bad_input", "URLFrontier items refused (FAIL), by reason.", "reason", role="host"),
    _c("frontier_streams_broken", "URLFrontier GetURLs streams that ended with an error.", role="host"),
    _c("frontier_discovered", "Discovered URLs a URLFrontier client put, pushed to URL_pool.", role="host"),
    _c("frontier_skipped", "Discovered URLs a URLFrontier client put that this host knew already (SKIPPED).",
       role="host"),
    _c("frontier_known", "Fetches a URLFrontier client recorded (known items: finish_URL).", role="host"),
    _c("frontier_known_unleased", "Known items recorded for URLs that were not leased to a client.",
       role="host"),
)

METRICS: dict[str, Metric] = {m.name: m for m in _ALL}
assert len(METRICS) == len(_ALL), "a metric is declared twice"

_ROLES = {"both": "center, host", "center": "center", "host": "host"}


def reference_markdown() -> str:
    """docs/METRICS.md's reference table (its text between the markers)."""
    rows = ["| metric | type | labels | on | meaning |", "| --- | --- | --- | --- | --- |"]
    for m in sorted(_ALL, key=lambda m: (m.kind != "gauge", m.exposed)):
        labels = ", ".join(f"`{label}`" for label in m.labels)
        rows.append(f"| `{m.exposed}` | {m.kind} | {labels} | {_ROLES[m.role]} | {m.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
