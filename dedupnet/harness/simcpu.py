"""What a simulation's processes spent in CPU, by role, and per page fetched.

Every process of the run is counted, from seeding to quiescence: the Redis server
(``INFO cpu``: its own user + system seconds, every node of a cluster), and either

* one process (``dedupnet sim``): the centers' work (timed inside, :class:`CpuMeter`
  of dedupnet/harness/sim.py), the synthetic web's connections (timed the same way),
  and the rest of the process — the hosts' daemons and crawlers, and the harness's
  polling — as the process's CPU time less those two; or
* ``--processes``: each center's and host's process (/proc/<pid>/stat, over every
  life) and the harness's own process, which serves the synthetic web.

The roles add up to the total by construction. "Per page" divides by the requests the
web answered (the report's "requests to the web"), so a figure is comparable across
layouts and checkouts.
"""

from __future__ import annotations

from dedupnet.adapters.redis_cluster import merged_info

__all__ = ["cpu_figures", "cpu_lines", "redis_cpu"]


def redis_cpu(server) -> float | None:
    """CPU seconds (user + system) the server has used since it started, every node of
    a cluster added up; None if it does not say."""
    try:
        info = merged_info(server, "cpu")
    except Exception:  # noqa: BLE001 - a figure of the report, never the run's failure
        return None
    if "used_cpu_user" not in info:
        return None
    return float(info["used_cpu_user"]) + float(info.get("used_cpu_sys", 0.0))


def cpu_figures(roles: dict[str, float | None], pages: int) -> dict:
    """The report's CPU fields from each role's CPU seconds (roles without a figure are
    left out): seconds and milliseconds per page, by role and in all."""
    known = {role: max(s, 0.0) for role, s in roles.items() if s is not None}
    total = sum(known.values())
    return dict(
        cpu_s={role: round(s, 3) for role, s in known.items()},
        cpu_total_s=round(total, 3) if known else None,
        cpu_ms_per_page={role: round(s * 1000 / pages, 3) for role, s in known.items()} if pages else {},
        cpu_total_ms_per_page=round(total * 1000 / pages, 3) if known and pages else None,
    )


def cpu_lines(r) -> str:
    """The report's lines on CPU (empty if the run measured none)."""
    if r.cpu_total_s is None:
        return ""
    roles = "   ".join(f"{role} {r.cpu_ms_per_page.get(role, 0.0):.3f}" for role in r.cpu_s)
    per_page = "n/a" if r.cpu_total_ms_per_page is None else f"{r.cpu_total_ms_per_page:.3f} ms"
    return (f"\n  CPU per page                {per_page:>10}   ({r.cpu_total_s:,.1f} s over {r.requests:,} requests"
            f", every process of the run)"
            f"\n    by role, ms per page      {roles}")
