"""docs/PROTOCOL.md §6.1 is the one list of error reasons: every reason the code can
give (a ProtocolError, a refused handshake or register, a core's rejection, a counter's
reason label for bad input) is named there, so a third party implementing a peer learns
of each from the spec. Discovery's datagram reasons are listed in its own section."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from dedupnet.codec import messages

ROOT = Path(__file__).parent.parent
SOURCES = [*ROOT.glob("dedupnet/codec/*.py"), *ROOT.glob("dedupnet/adapters/*.py"), *ROOT.glob("center_host/*.py"),
           *ROOT.glob("local_host/*.py")]
NOT_THE_WIRE = {"discovery.py"}  # UDP datagrams: docs/PROTOCOL.md "LAN discovery"
PATTERNS = [
    r'Rejected\(\s*"([a-z0-9-]+)"',  # a core's rejection
    r'inc\(\s*"(?:rejected|handshake_failed|bad_input)",[^)]*?reason="([a-z0-9-]+)"',  # counted
    r'close_with_error\(\s*"([a-z0-9-]+)"',  # refused with an error message
    r'reason, text = "([a-z0-9-]+)"',  # the handshake's refusals
    r'ProtocolError\(\s*(?:f?"(?:[^"\\]|\\.)*"\s*)+,\s*"([a-z0-9-]+)"',  # the codec's
    r'_fail\([^\n]*?,\s*"([a-z0-9-]+)"\)',
    r'\n\s*"([a-z0-9-]+)"\)',  # the reason on a continuation line
    r'TLSRefused\(\s*"([a-z0-9-]+)"',
    r'return "([a-z-]+)", f?"',  # tls.check's (reason, text)
]


def reasons_in_code() -> dict[str, str]:
    found = {}
    for path in SOURCES:
        if path.name in NOT_THE_WIRE:
            continue
        text = path.read_text()
        for pattern in PATTERNS:
            for m in re.finditer(pattern, text):
                found.setdefault(m.group(1), str(path.relative_to(ROOT)))
    found.update({r: "dedupnet/codec/messages.py" for r in messages._FIELD_REASONS.values()})
    found[inspect.signature(messages._fail).parameters["reason"].default] = "dedupnet/codec/messages.py"
    return found


def section_6() -> str:
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text()
    return doc[doc.index("## 6. Protocol errors"):doc.index("## 7. The `number`")]


def test_every_reason_the_code_gives_is_in_the_spec():
    found = reasons_in_code()
    assert len(found) > 30, found  # the patterns still find the code's reasons
    spec = section_6()
    missing = {r: where for r, where in found.items() if f"`{r}`" not in spec and f'"{r}"' not in spec}
    assert missing == {}, f"reasons not in docs/PROTOCOL.md section 6: {missing}"


def test_the_kind_range_is_the_codes():
    kinds = [k.value for k in messages.Kind]
    assert f"(1–{max(kinds)}, section 4)" in section_6() and kinds == list(range(1, max(kinds) + 1))
