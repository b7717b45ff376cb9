"""Is the crawl complete? ``dedupnet status --cluster`` asks every center it can reach
(a center names its peers' addresses) and every host those centers know (each host's
status address is in its center's status), and judges the whole from what they say.

Work that is not finished is always somewhere a daemon can count it: a host's
``URL_pool`` (found, not yet decided: its entries stay until its center has stored
their set), a center's sets in flight and held frames, its ``task_URL`` (assigned, not
yet acknowledged by the host), a host's ``task_pool`` and the pages its crawler has in
progress, and URLs a center holds for another network's sites. A host that is down
still holds its ``task_pool``: its center knows the host (until it leaves or is
reassigned) and the size its last heartbeat gave, so such a crawl is "stuck", never
"complete". Asked one after the other the daemons are not one snapshot: a set can be
released by a host just after it was counted at a center that had not stored it yet.
So "complete" is said only when two passes a moment apart both find nothing and the
admitted counts did not move.

This module does the asking (a control connection, as ``dedupnet status``) and the
judging (plain functions over the status bodies, which the tests drive too).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import trio

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.netinfo import source_ip_towards
from dedupnet.adapters.net.transport import ConnectionClosed, connect
from dedupnet.codec import wire
from dedupnet.codec.auth import Keyring
from dedupnet.codec.messages import Error, Heartbeat, Register, Status

#: Seconds between the two passes that must agree before a crawl is called complete.
#: The gap only has to put the second pass after the first: work one pass missed (a
#: set stored by a center already asked, released by a host asked after) is, at the
#: second, in flight somewhere or admitted (and the admitted counts moved), since all
#: work is counted somewhere. So a crawler that waits on the verdict exits soon.
SETTLE = 0.25
#: Seconds one daemon may take to answer a crawler that asks (it is idle while it waits).
ASK_TIMEOUT = 2.0
#: The verdict of a crawl that has admitted nothing yet: every pool is empty because
#: the seeds are not in, which is no reason for a crawler to stop.
NOT_STARTED = "not started"


class StatusRefused(Exception):
    """The daemon answered with an error instead of its status."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


def refusal_text(error: Error, *, keyed: bool) -> str:
    """A daemon's Error as a sentence that says what to do."""
    if error.reason == "bad-tag":
        return ("it needs the LAN key and this request's tag was not made with it: give --key-file with the "
                "daemon's lan_key_file, or --config with the daemon's config file" if not keyed else
                "it did not accept this key file: give the daemon's current lan_key_file")
    return f"it refused the request ({error.reason}): {error.message}"


def control_register(address: tuple[str, int]) -> tuple[str, Register]:
    """The Register of an operator's tool (role ``control``) towards ``address``."""
    ip = source_ip_towards(address[0])
    return ip, Register(ip, 0, "control", f"{ip}:1")


async def fetch_status(address: tuple[str, int], timeout: float = 5.0, key_file: str | None = None, *,
                       keyring: Keyring | None = None) -> dict:
    """One daemon's status body, over a control connection (``dedupnet status``)."""
    from dedupnet.codec.auth import keyring_from

    ip, register = control_register(address)
    keyring = keyring if keyring is not None else keyring_from(key_file)
    with trio.fail_after(timeout):
        async with await connect(*address, register, local_ip=ip, counters=Counters(), keyring=keyring) as conn:
            conn.send_nowait(wire.encode(Status(True)))
            while True:
                reply = await conn.receive()
                if isinstance(reply, Status):
                    return reply.body or {}
                if isinstance(reply, Error):
                    raise StatusRefused(refusal_text(reply, keyed=keyring is not None), reply.reason)
                if not isinstance(reply, Heartbeat):
                    raise StatusRefused(f"it answered with a {type(reply).__name__} message, not its status")


async def ask(address: tuple[str, int], keyrings: list[Keyring | None], timeout: float) -> dict:
    """The status of the daemon at ``address``, with the first of ``keyrings`` it takes
    (one deployment's centers each have their own LAN key)."""
    last: Exception | None = None
    for keyring in keyrings or [None]:
        try:
            return await fetch_status(address, timeout, keyring=keyring)
        except StatusRefused as e:
            if e.reason != "bad-tag":
                raise
            last = e
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:  # a key it refused, said by closing
            last = e
        except ConnectionClosed as e:  # its answer tagged with a key of its own, not this one
            last = e
    raise last if isinstance(last, StatusRefused) else StatusRefused(f"it closed the connection: {last}")


def parse_address(text: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port``; None without a port (a peer that dials this
    center, not yet connected: where it listens is not known)."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", text or "")
    if m is None:
        return None
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return host, int(port)


def _why(e: BaseException, timeout: float) -> str:
    if isinstance(e, trio.TooSlowError):
        return f"no answer within {timeout:g} s"
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


async def one_pass(start: tuple[str, int], keyrings: list[Keyring | None], timeout: float = 5.0) -> dict:
    """Every center reachable from ``start`` (through the peers each names) and the
    hosts each knows: ``{"centers": {network: body}, "hosts": {ip: body},
    "unreachable": [{"what", "address", "why", "network"?, "ip"?}]}``."""
    centers: dict[int, dict] = {}
    hosts: dict[str, dict] = {}
    unreachable: list[dict] = []
    queue: list[tuple[int | None, tuple[str, int]]] = [(None, start)]
    asked: set[tuple[str, int]] = set()
    while queue:
        network, address = queue.pop(0)
        if address in asked or (network is not None and network in centers):
            continue
        asked.add(address)
        where = f"{address[0]}:{address[1]}"
        try:
            body = await ask(address, keyrings, timeout)
        except (OSError, trio.TooSlowError, StatusRefused) as e:
            unreachable.append({"what": "center", "network": network, "address": where, "why": _why(e, timeout)})
            continue
        if body.get("role") != "center":
            unreachable.append({"what": "center", "network": network, "address": where,
                                "why": f"it is a {body.get('role')}, not a center: give a center's address"})
            continue
        centers[body["network"]] = body
        for entry in body.get("liveness", []):
            if entry["kind"] != "peer":
                continue
            peer = int(entry["member"].removeprefix("net:"))
            peer_address = parse_address(entry.get("address", ""))
            if peer in centers:
                continue
            if peer_address is None:
                unreachable.append({"what": "center", "network": peer, "address": entry.get("address", ""),
                                    "why": "its address is not known here (it dials this center and is not "
                                           "connected): ask it directly"})
                continue
            queue.append((peer, peer_address))
    # A network first listed unreachable through one center may be reached through another.
    unreachable = [u for u in unreachable if u.get("network") not in centers]
    for network, body in sorted(centers.items()):
        part = await ask_hosts(body, keyrings, timeout)
        hosts.update(part["hosts"])
        unreachable += part["unreachable"]
    return {"centers": centers, "hosts": hosts, "unreachable": unreachable}


# -- judging ------------------------------------------------------------------------------
def admitted_of(center: dict) -> int:
    return sum(v for k, v in center.get("counters", {}).items() if k.split("{", 1)[0] == "urls_admitted")


def network_view(center: dict, hosts: dict[str, dict]) -> dict:
    """One network's outstanding work, from its center's status and its hosts'."""
    view_hosts = []
    for entry in center.get("liveness", []):
        if entry["kind"] != "host":
            continue
        ip = entry["member"]
        row = {"ip": ip, "state": entry["state"], "address": entry.get("address"), "task_URL": entry["task_urls"],
               "known": entry.get("known", True), "ledger": entry.get("ledger", 0)}
        body = hosts.get(ip)
        if body is not None:
            pools = body.get("pools", {})
            crawler = body.get("crawler") or {}
            row.update(task_pool=pools.get("task_pool", 0), task_pool_from="host", URL_pool=pools.get("URL_pool", 0),
                       unacked_sets=pools.get("unacked_sets", 0), in_progress=crawler.get("in_progress", 0))
        else:
            row.update(task_pool=entry.get("task_pool"), task_pool_from="heartbeat" if entry.get("task_pool") is not None
                       else None, task_pool_age=entry.get("task_pool_age"))
        view_hosts.append(row)
    return {
        "network": center.get("network"), "center": center.get("listen"), "mode": center.get("mode"),
        "admitted": admitted_of(center), "admitted_total": center.get("admitted_total"),
        "sets_in_flight": center.get("sets_in_flight", {}),
        "frames_held": center.get("frames_held", 0), "waiting_for": center.get("waiting_for", {}),
        "waiting_for_networks": center.get("waiting_for_networks", {}),
        "unassigned": center.get("task_URL_per_host", {}).get("", 0),
        "peers": {e["member"]: e["state"] for e in center.get("liveness", []) if e["kind"] == "peer"},
        "hosts": view_hosts,
    }


def judge(report: dict) -> tuple[str, list[str]]:
    """``("complete" | "in progress" | "stuck" | "not started", reasons)``. Stuck: work
    that cannot go on without an operator (a host down while counted as the LAN's, a
    daemon that does not answer, a network cut off while sets wait for it); in progress:
    work anywhere; not started: nothing anywhere and no URL ever admitted on any center's
    store (no seed got in), which is not a finished crawl."""
    stuck: list[str] = []
    busy: list[str] = []
    for u in report["unreachable"]:
        if u["what"] == "center":
            net = f"network {u['network']}" if u.get("network") is not None else "the center"
            stuck.append(f"center of {net} at {u['address']} did not answer ({u['why']}): its work is unknown")
        else:
            stuck.append(f"host {u['ip']} did not answer ({u['why']}): its task_pool is unknown")
    reachable = {v["network"] for v in report["networks"]}
    for view in report["networks"]:
        n = view["network"]
        for h in view["hosts"]:
            if h["state"] == "down" and h["ledger"] and not (h["known"] or h["task_URL"]):
                stuck.append(f"host {h['ip']} is down with {h['ledger']} URLs given to it not reported finished: "
                             f"start it again, or `dedupnet reassign --host {h['ip']}` at its center")
            elif h["state"] == "down" and (h["known"] or h["task_URL"]):
                tasks = h["task_URL"] + (h["task_pool"] or 0)
                if h["task_pool"] is None:
                    held = f"at least {h['task_URL']} tasks (task_URL; its task_pool is unknown)"
                else:
                    held = f"{tasks} tasks ({h['task_pool']} in its task_pool when last heard, {h['task_URL']} in task_URL)"
                if h["ledger"]:
                    held += f"; {h['ledger']} URLs on its center's ledger"
                stuck.append(f"host {h['ip']} is down holding {held}: start it again, or `dedupnet reassign "
                             f"--host {h['ip']}` at its center")
            elif h["state"] != "down":
                for what in ("task_URL", "task_pool", "URL_pool", "unacked_sets", "in_progress"):
                    if h.get(what):
                        busy.append(f"host {h['ip']}: {what} {h[what]}")
                if h["ledger"] and not any(h.get(w) for w in ("task_URL", "task_pool", "in_progress")):
                    busy.append(f"host {h['ip']}: {h['ledger']} URLs given to it not reported finished yet")
        if view["unassigned"]:
            live = [h for h in view["hosts"] if h["state"] != "down"]
            (busy if live else stuck).append(f"network {n}: {view['unassigned']} tasks wait in task_URL for a host"
                                             + ("" if live else " and it has no live host"))
        sets = sum(view["sets_in_flight"].values())
        if sets:
            busy.append(f"network {n}: {sets} sets in flight")
        if view["frames_held"]:
            busy.append(f"network {n}: {view['frames_held']} sets held back")
        for peer, state in sorted(view["peers"].items()):
            waiting = view["waiting_for"].get(peer, 0)
            if state == "down" and waiting:
                other = int(peer.removeprefix("net:"))
                why = "is down" if other not in reachable else "is not connected to it"
                stuck.append(f"network {other} {why}: {waiting} sets of network {n} wait for it")
    if stuck:
        return "stuck", stuck
    if busy:
        return "in progress", busy
    if not sum(ever_admitted(view) for view in report["networks"]):
        return NOT_STARTED, ["no network has ever admitted a URL: give the hosts seeds (--seed, `dedupnet push`)"]
    return "complete", []


def ever_admitted(view: dict) -> int:
    """URLs a network's center has admitted on its store in all runs (a center that does
    not report it: those since it started)."""
    total = view.get("admitted_total")
    return view["admitted"] if total is None else total


def build_report(found: dict) -> dict:
    networks = [network_view(body, found["hosts"]) for _, body in sorted(found["centers"].items())]
    report = {"networks": networks, "unreachable": found["unreachable"]}
    report["verdict"], report["reasons"] = judge(report)
    return report


async def ask_hosts(center: dict, keyrings: list[Keyring | None], timeout: float = 2.0) -> dict:
    """The live hosts of ``center``'s status asked for theirs: one network's part of
    :func:`one_pass` (and all a center's own page can ask: it holds its LAN's key, not
    the other networks')."""
    hosts: dict[str, dict] = {}
    unreachable: list[dict] = []
    for entry in center.get("liveness", []):
        address = parse_address(entry.get("address", "")) if entry["kind"] == "host" else None
        if entry["kind"] != "host" or entry["state"] == "down":
            continue
        try:
            if address is None:
                raise StatusRefused("its status address is not known to its center")
            hosts[entry["member"]] = await ask(address, keyrings, timeout)
        except (OSError, trio.TooSlowError, StatusRefused) as e:
            unreachable.append({"what": "host", "ip": entry["member"], "network": center.get("network"),
                                "address": entry.get("address", ""), "why": _why(e, timeout)})
    return {"centers": {center.get("network"): center}, "hosts": hosts, "unreachable": unreachable}


async def survey(start: tuple[str, int], keyrings: list[Keyring | None], timeout: float = 5.0,
                 settle: float = SETTLE) -> dict:
    """The report of the whole crawl (:func:`build_report`), "complete" only when a
    second pass ``settle`` seconds later agrees (the module's docstring says why)."""
    report = build_report(await one_pass(start, keyrings, timeout))
    if report["verdict"] != "complete":
        return report
    await trio.sleep(settle)
    again = build_report(await one_pass(start, keyrings, timeout))
    if again["verdict"] == "complete" and [v["admitted"] for v in again["networks"]] != [
            v["admitted"] for v in report["networks"]]:
        again["verdict"], again["reasons"] = "in progress", ["URLs were admitted between two looks"]
    return again


def format_report(report: dict) -> str:
    lines = []
    for view in report["networks"]:
        lines.append(f"network {view['network']}  center {view['center']}  {view['mode']} mode  "
                     f"admitted {view['admitted']} URLs since the center started, {ever_admitted(view)} in all")
        sets = ", ".join(f"{k} {v}" for k, v in sorted(view["sets_in_flight"].items()) if v) or "none"
        lines.append(f"  sets in flight: {sets}; held back: {view['frames_held']}; "
                     f"tasks waiting for a host: {view['unassigned']}")
        waiting = ", ".join(f"{m} {n} sets" for m, n in sorted(view["waiting_for"].items()))
        lines.append(f"  waiting for: {waiting or 'nobody'}")
        for network, urls in sorted(view["waiting_for_networks"].items()):
            lines.append(f"  waiting for network {network.removeprefix('net:')}: {urls} URLs (of its sites, held here)")
        for peer, state in sorted(view["peers"].items()):
            lines.append(f"  peer {peer}: {state}")
        lines.append("  hosts:" if view["hosts"] else "  hosts: none")
        for h in view["hosts"]:
            state = "DOWN" if h["state"] == "down" else h["state"]
            if h.get("task_pool_from") == "host":
                detail = (f"task_pool {h['task_pool']}  URL_pool {h['URL_pool']}  unacked sets {h['unacked_sets']}  "
                          f"in progress {h['in_progress']}")
            elif h["task_pool"] is not None:
                detail = f"task_pool {h['task_pool']} (its last heartbeat, {h.get('task_pool_age') or 0:.0f} s ago)"
            else:
                detail = "task_pool unknown"
            lines.append(f"    {h['ip']:<16} {state:<5} task_URL {h['task_URL']}  {detail}")
    for u in report["unreachable"]:
        lines.append(f"unreachable {u['what']} {u.get('ip') or u.get('network') or ''} {u['address']}: {u['why']}")
    why = "; ".join(report["reasons"][:5]) + (f"; and {len(report['reasons']) - 5} more" if len(report["reasons"]) > 5
                                                 else "")
    lines.append(f"verdict: {report['verdict']}" + (f" ({why})" if why else ""))
    return "\n".join(lines)



class CrawlCensus:
    """The verdict asked of one center again and again, by a crawler that stops when the
    crawl is complete (a Scrapy spider, a ``dedupnet local`` host). A center that gives
    no verdict, and one that answers again, are logged once each on ``logger``, each with
    what the crawler does meanwhile (``without``) and from then on (``with_verdict``)."""

    def __init__(self, center: tuple[str, int], keyrings: Callable[[], list[Keyring | None]], *,
                 logger: logging.Logger, setting: str, without: str, with_verdict: str,
                 timeout: float = ASK_TIMEOUT, settle: float = SETTLE):
        self.center = center
        self.keyrings = keyrings
        self.timeout = timeout
        self.settle = settle
        self.log, self.setting, self.without, self.with_verdict = logger, setting, without, with_verdict
        self._unreachable_logged = False

    async def verdict(self) -> str | None:
        """``"complete"``, ``"in progress"``, ``"stuck"``, :data:`NOT_STARTED`, or None
        when no center answered. Takes two passes (about ``settle`` seconds)."""
        try:
            report = await survey(self.center, self.keyrings() or [None], self.timeout, self.settle)
        except (OSError, trio.TooSlowError, StatusRefused) as e:
            return self._unreachable(_why(e, self.timeout))
        if not report["networks"]:
            why = report["unreachable"][0]["why"] if report["unreachable"] else "no center answered"
            return self._unreachable(why)
        if self._unreachable_logged:
            self.log.info("the center at %s answers again: %s", self.where, self.with_verdict)
            self._unreachable_logged = False
        return report["verdict"]

    def _unreachable(self, why: str) -> None:
        if not self._unreachable_logged:
            self.log.warning("the center at %s (%s) gives no verdict (%s): %s", self.where, self.setting, why,
                             self.without)
            self._unreachable_logged = True
        return None

    @property
    def where(self) -> str:
        return f"{self.center[0]}:{self.center[1]}"
