"""Who a center talks to, and the events and actions of its sans-I/O core
(center_host/protocol.py): what an adapter feeds it and what it carries out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


# -- who sent / receives a message ---------------------------------------------------
@dataclass(frozen=True)
class Host:
    ip: str

    def __str__(self) -> str:
        return self.ip


@dataclass(frozen=True)
class Peer:
    network: int

    def __str__(self) -> str:
        return f"net:{self.network}"


Member = Union[Host, Peer]


@dataclass(frozen=True)
class Operator:
    """A control connection (``dedupnet reassign``): not a member, only answered."""

    address: str

    def __str__(self) -> str:
        return f"control:{self.address}"


def member_from_str(text: str) -> Member:
    return Peer(int(text[4:])) if text.startswith("net:") else Host(text)


# -- events -----------------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    sender: Member
    message: object


@dataclass(frozen=True)
class Joined:
    member: Member
    #: A host's status address (its Register's ``listen``): where ``dedupnet status
    #: --cluster`` asks it; "" when not known.
    address: str = ""


@dataclass(frozen=True)
class Left:
    member: Member


@dataclass(frozen=True)
class TimerFired:
    number: int


@dataclass(frozen=True)
class Reassign:
    """An operator says LAN host ``host`` is gone: its unacknowledged tasks (task_URL)
    and ``urls`` (what its own task_pool held, taken from it by the operator's tool)
    go to the live hosts, and it is no longer counted as one of the LAN's hosts.
    Answered to ``reply_to`` with an Ack of ``number``."""

    host: str
    number: int
    urls: tuple[str, ...]
    reply_to: Operator


@dataclass(frozen=True)
class Reoffer:
    """LAN host ``host`` came back with a store behind what it had acknowledged: the
    tasks last assigned to it (number -> URLs, from the adapter's log) are its again,
    stored and sent; what it still holds it drops on arrival (docs/PROTOCOL.md section 7)."""

    host: str
    tasks: dict[int, tuple[str, ...]]


@dataclass(frozen=True)
class LookupDone:
    """Answers to a :class:`Lookup`, index-aligned with its ``urls``."""

    number: int
    concluded: bool  # the number was concluded before (a repeated frame)
    admitted: list[bool]  # URL is in this center's admitted record
    #: The concluded set's :func:`~dedupnet.codec.urls.set_digest` (0: not recorded).
    digest: int = 0


@dataclass(frozen=True)
class Resume:
    """After a restart: the stored records of every pool (see :meth:`SetRecord.dump`)."""

    sets: list[bytes]
    tasks: dict[str, list[str]]  # task key "number:host" -> URLs
    sequences: dict[str, int] = field(default_factory=dict)  # host IP -> highest sequence stored
    hosts: dict[str, str] = field(default_factory=dict)  # host IP -> status address (known hosts)
    #: host IP -> block id -> (its text, its bits; None: all on the ledger): center_host/ledger.py
    ledger: dict[str, dict[int, tuple[bytes, bytes | None]]] = field(default_factory=dict)
    moved: dict[str, list[str]] = field(default_factory=dict)  # re-issued host IP -> what moved from it


# -- actions ----------------------------------------------------------------------
@dataclass(frozen=True)
class Send:
    to: tuple[Member | Operator, ...]  # an Operator only for the answer to its request
    data: bytes  # encoded once, the same bytes for every receiver


@dataclass(frozen=True)
class Save:
    pool: str
    number: int
    record: bytes


@dataclass(frozen=True)
class Drop:
    pool: str
    number: int


@dataclass(frozen=True)
class SetTimer:
    number: int
    delay: float


@dataclass(frozen=True)
class CancelTimer:
    number: int


@dataclass(frozen=True)
class Lookup:
    """Look up ``urls`` in the admitted record, and whether ``number`` was concluded;
    answer with :class:`LookupDone` before any other event."""

    number: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Admit:
    """These URLs are admitted: record them (never admit again) and mark ``number`` concluded."""

    number: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Conclude:
    """``number`` is finished here; remember it (and its set's digest, 0 if none) so a
    repeated frame is recognised and a reused number told from it."""

    number: int
    complete: bool
    digest: int = 0


@dataclass(frozen=True)
class NoteSequence:
    """The highest sequence stored from ``host``: what a host that lost its store is
    told to number from."""

    host: str
    sequence: int


@dataclass(frozen=True)
class NoteHost:
    """``host`` is one of the LAN's hosts (its status address): until it leaves or is
    reassigned, a crawl is not complete while it is down."""

    host: str
    address: str


@dataclass(frozen=True)
class ForgetHost:
    host: str


@dataclass(frozen=True)
class SaveTask:
    key: str  # "number:host"
    urls: tuple[str, ...]


@dataclass(frozen=True)
class DropTask:
    key: str


@dataclass(frozen=True)
class Ledger:
    """These URLs were given to ``host``: on its ledger until it reports them finished
    or they move (docs/PROTOCOL.md section 12). Block ``block`` of the host's ledger
    holds them (and any re-deflated into it with them), as ``data``, every one of its
    URLs on the ledger (center_host/ledger.py)."""

    host: str
    urls: tuple[str, ...]
    block: int
    data: bytes


@dataclass(frozen=True)
class Unledger:
    """These URLs leave ``host``'s ledger: reported finished, or moved to other hosts;
    the blocks ``drop`` hold nothing on it any more, and ``bits`` are the new bits of
    the others they left (block id, which of its URLs are still on it:
    center_host/ledger.py)."""

    host: str
    urls: tuple[str, ...]
    drop: tuple[int, ...] = ()
    bits: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True)
class NoteMoved:
    """``host`` was re-issued: these URLs of its own moved to other hosts, which it must
    drop from its task_pool when it comes back."""

    host: str
    urls: tuple[str, ...]


@dataclass(frozen=True)
class ForgetMoved:
    """``host`` came back and has dropped these URLs that moved from it."""

    host: str
    urls: tuple[str, ...]


Action = Union[Send, Save, Drop, SetTimer, CancelTimer, Lookup, Admit, Conclude, NoteSequence, NoteHost, ForgetHost,
               SaveTask, DropTask, Ledger, Unledger, NoteMoved, ForgetMoved]


#: Every event the core takes (:meth:`~center_host.protocol.CenterProtocol.handle`).
Event = Union[Received, Joined, Left, TimerFired, Reassign, Reoffer, LookupDone, Resume]
