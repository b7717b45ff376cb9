"""The checker: what a simulated history must show (Jepsen's lost / duplicated /
unexpected, for a de-dup protocol).

* **admitted twice** (exact mode): a URL admitted by two sets, at one center or two —
  unless a fault took the first admission out of a center's record (a power loss before
  fsync, a network given up), which the protocol does not promise to survive;
* **lost**: a URL the web's ground truth says a crawl reaches, found by some crawler and
  never fetched — unless every record of it was destroyed (a wiped or power-lost
  Redis) or is held by a daemon gone for good (stranded);
* **unreached**: reachable URLs never even found, with nothing lost, destroyed or
  stranded to explain them;
* **unexpected**: a fetch of a URL the ground truth does not reach;
* **stall**: no quiescence within ``stall_after`` virtual seconds of the last heal
  without progress; **set held**: a set still in a center's pools at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .world import World


@dataclass
class Violation:
    kind: str
    detail: str
    urls: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class Outcome:
    violations: list[Violation]
    reachable: int
    fetched: int
    refetched: int  # URLs fetched more than once (crashed in progress, a power loss)
    lost_excused: int  # destroyed or stranded by a fault
    admitted: int


def check(world: World) -> Outcome:
    v: list[Violation] = []
    exact = world.cfg.mode == "exact"
    reach = world.reach.fetched
    answered = world.web.answered
    excused = world.destroyed | world.stranded()
    if exact:
        twice = sorted(u for u, nets in world.admits.items() if len(nets) > 1 and u not in world.forgotten_admissions)
        if twice:
            detail = ", ".join(f"{u} by networks {world.admits[u]}" for u in twice[:3])
            v.append(Violation("admitted twice", f"{len(twice)} URLs, e.g. {detail}", twice))
    missing = sorted(reach - answered.keys() - world.web.skipped)
    lost = [u for u in missing if u in world.discovered and u not in excused]
    if lost:
        v.append(Violation("lost", f"{len(lost)} URLs found and never fetched, e.g. {lost[:3]}", lost))
    unreached = [u for u in missing if u not in world.discovered]
    if unreached and not excused and not lost:
        v.append(Violation("unreached", f"{len(unreached)} reachable URLs never found, with nothing destroyed "
                                        f"or stranded, e.g. {unreached[:3]}", unreached))
    unexpected = sorted(set(answered) - reach)
    if unexpected:
        v.append(Violation("unexpected", f"{len(unexpected)} URLs fetched that no crawl reaches, e.g. "
                                         f"{unexpected[:3]}", unexpected))
    if world.stalled:
        v.append(Violation("stall", f"not quiescent at {world.sched.now:.0f} s virtual (last fault healed at "
                                    f"{world.last_heal:.0f} s): " + "; ".join(world.busy()[:6])))
    for c in world.centers.values():
        if world.gone(c) or c.state != "up":
            continue
        if c.core.stages.sets:
            numbers = sorted(c.core.stages.sets)[:5]
            v.append(Violation("set held", f"{c.name} still holds {len(c.core.stages.sets)} sets, e.g. {numbers} "
                                           f"awaiting {[sorted(c.core.stages.sets[n].awaiting) for n in numbers]}"))
    return Outcome(v, len(reach), len(answered), sum(1 for h in answered.values() if len(h) > 1),
                   len([u for u in missing if u in excused]), len(world.admits))
