"""Nothing a peer sends ends a daemon: bench/fuzz_daemons.py's storm, in the suite.

A live center and a live host (real daemons, real TCP, the session's Redis) take
20,000 hostile messages between them — valid-shaped ones with hostile contents from
registered hosts, a registered peer center, control clients and a hostile center, and
mutated inputs that break the decoder — and then must still serve: the center admits
a well-behaved host's new URLs into its task_pool, and the fuzzed host queues a task
and sends its new URLs. The long runs (10 million messages) are bench/fuzz_daemons.py's.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("fuzz_daemons", Path(__file__).parent.parent / "bench" / "fuzz_daemons.py")
fuzz_daemons = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_daemons"] = fuzz_daemons  # its dataclasses look their module up
_spec.loader.exec_module(fuzz_daemons)

FRAMES = 20_000


async def test_a_storm_of_hostile_frames_ends_neither_daemon(redis_url, prefix, caplog):
    # The refusals are logged per message (a warning each): counted, not printed, here.
    caplog.set_level(logging.ERROR, logger="dedupnet")
    logging.getLogger("dedupnet").setLevel(logging.ERROR)
    try:
        figures, report = await fuzz_daemons.run(redis_url, FRAMES, seed=11, prefix=prefix)
    finally:
        logging.getLogger("dedupnet").setLevel(logging.NOTSET)
    text = fuzz_daemons.summary(figures, report)
    print(text)
    assert report["ok"], text
    assert report["center_frames"] + report["host_frames"] >= FRAMES, text
    # Every way in was taken: registered hosts, the peer, control clients, failed
    # handshakes, both kinds of input at the host; and the decoder refused some.
    for kind in ("host", "peer", "control", "handshake", "host-control"):
        assert figures.connections[kind] > 0, (kind, text)
    assert figures.sent["to-host"] > 0 and figures.sent["mutated"] > 0, text
    center = report["center_counters"]
    assert any(k.startswith("bad_input") for k in center), text
    for reason in ("ip-mismatch", "unknown-number", "flag2-from-lan", "not-a-peer", "unexpected-message"):
        assert center.get(f'rejected{{reason="{reason}"}}', 0) > 0, (reason, text)
