"""The lines a simulation report begins and ends with: what the run ran with (so that a
figure is never read without its politeness, durable acknowledgements and web), and one
verdict line that says whether the product's promise held, which ``dedupnet sim``'s exit
status follows."""

from __future__ import annotations

from dedupnet.codec.settings import SETTINGS

__all__ = ["runs_with", "verdict"]


def runs_with(c: dict) -> str:
    """The header's line of what the run ran with: politeness, durable acks, the web's shape."""
    from dedupnet.harness.webgraph import SHAPES, WebSpec

    deployed = all(c.get(k) == SETTINGS[k].default for k in ("concurrency", "per_site_concurrency", "per_site_delay"))
    whose = "the daemons' defaults" if deployed else "not the daemons' defaults"
    shape = c.get("web_shape", "classic")
    spec = WebSpec(**SHAPES.get(shape, {}))
    return (f"  runs with: politeness {c.get('per_site_concurrency')} per site, {c.get('per_site_delay'):g} s "
            f"between requests to a site, {c.get('concurrency')} per host ({whose}); durable acks "
            f"{'on' if c.get('durable_acks') else 'off'}; web {shape}: {1 - spec.cross_site_share:.0%} of links "
            f"on their site, site sizes ~ 1/(k+1)^{spec.site_skew:g}")


def verdict(r) -> tuple[str, bool]:
    """The report's last line, and whether the run kept the promise: every URL of the
    ground truth fetched, none twice (pages a killed host had in flight aside: they are
    fetched again by that host, docs/DECISIONS.md), nothing the invariant check refuses,
    and the run quiescent. In paper mode duplicates are what the mode measures: they are
    said, not failed."""
    dups = r.duplicate_fetches - r.refetched_after_kill
    paper = r.config.get("mode") == "paper"
    ok = not r.timed_out and r.lost_urls == 0 and r.fetched_urls == r.reachable_urls and (
        paper or (dups == 0 and r.invariant_violations == 0))
    figures = f"{dups:,} duplicates, {r.lost_urls:,} lost, {r.fetched_urls:,} of {r.reachable_urls:,} URLs"
    if r.refetched_after_kill:
        figures += f" ({r.refetched_after_kill:,} re-fetched after a kill: pages in flight on the killed or gone host)"
    if ok and dups == 0:
        return f"exact: {figures}", True
    if ok:
        return f"paper: {figures} (the paper's look-ups do not promise none twice)", True
    why = "TIMED OUT, " if r.timed_out else ""
    if r.invariant_violations and not paper:
        figures += f", {r.invariant_violations:,} invariant violations"
    return f"NOT EXACT: {why}{figures}", False
