"""The messages dedupnet puts on the wire: the paper's frame and the kinds it does not define.

The paper (§2.1) has exactly one frame, ``<URL_set, IP, number, flag>``, whose ``flag``
says what the frame is (1, 2 or 3). Everything else dedupnet needs — registration,
heartbeats, acks, task assignment, status, errors — is a separate message :class:`Kind`,
never a new ``flag`` value, so a flag always means exactly what the paper says.

Each kind has a JSON Schema in ``schemas/<kind>.schema.json`` (draft-07, installed as
``dedupnet.schemas``). They are compiled with fastjsonschema at import time and are the
single source of truth for what a valid body is; :func:`from_json` runs them and then a
few checks JSON Schema cannot express:

* integers are checked strictly: JSON Schema counts ``1.0`` as an integer, we do not;
* ``IP`` is parsed with :mod:`ipaddress` and normalised to its canonical text form
  (``str(ipaddress.ip_address(IP))``) so hosts can compare identities as strings;
* the URL limit per set is configurable (``max_urls``); the schemas' 10000 is the
  default ceiling, a higher limit recompiles the schema with the ceiling raised;
* ``listen`` and ``CIDR`` of a registration are parsed strictly.

Errors are :class:`~dedupnet.codec.errors.ProtocolError` with ``reason`` one of
``"schema"`` (generic), ``"bad-flag"``, ``"bad-ip"`` or ``"too-many-urls"``, and a
message naming the kind, the field and what was wrong with it.

This module does no I/O; :mod:`dedupnet.codec.wire` frames these messages on a stream.
"""

from __future__ import annotations

import copy
import enum
import functools
import importlib.resources
import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import fastjsonschema

from dedupnet.codec.errors import ProtocolError

__all__ = [
    "FLAG_NEW_SET",
    "FLAG_LOOKUP",
    "FLAG_ANSWER",
    "FLAGS",
    "MAX_URLS",
    "MAX_URL_LENGTH",
    "MAX_NUMBER",
    "Kind",
    "Frame",
    "Register",
    "Heartbeat",
    "Ack",
    "Task",
    "Status",
    "Error",
    "Welcome",
    "Done",
    "COMPRESSIONS",
    "Message",
    "MESSAGE_TYPES",
    "SCHEMAS",
    "VALIDATORS",
    "load_schema",
    "validator",
    "from_json",
    "normalize_ip",
]

# --- the paper's flags, named by their role: a new set, a look-up, its answer -------
FLAG_NEW_SET = 1  # §2.2: a host sends a new URL_set (values all 0) to its center to de-dup.
FLAG_LOOKUP = 2  # §2.3/§2.4: a center broadcasts a set to LAN hosts / other networks to look up.
FLAG_ANSWER = 3  # §2.3/§2.4: the look-up answer; URLs found in finish_URL carry value 1.
FLAGS = frozenset((FLAG_NEW_SET, FLAG_LOOKUP, FLAG_ANSWER))

# --- limits (mirrored in the schema files; tests check they agree) -------------------
MAX_URLS = 10_000  # default/ceiling URLs per URL_set (frame) or URLs list (task)
MAX_URL_LENGTH = 8192  # characters (code points) per URL
MAX_NUMBER = 2**63 - 1  # `number` is a non-negative signed 64-bit integer
#: Compressions this codec speaks (Register.compress, Welcome), in this side's order of
#: preference: ``deflate-stream`` (each direction of the connection one deflate stream,
#: docs/PROTOCOL.md section 5), then ``zstd`` (each large body on its own).
COMPRESSIONS = ("deflate-stream", "zstd")
STREAM_COMPRESSION = "deflate-stream"


class Kind(enum.IntEnum):
    """Message kind: the ``kind`` byte of the wire header."""

    FRAME = 1
    REGISTER = 2
    HEARTBEAT = 3
    ACK = 4
    TASK = 5
    STATUS = 6
    ERROR = 7
    WELCOME = 8
    DONE = 9

    @property
    def schema_file(self) -> str:
        return f"{self.name.lower()}.schema.json"


# --- message classes -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    """The paper's frame ``<URL_set, IP, number, flag>`` (§2.1).

    ``URL_set`` maps URL -> 0 (not seen) / 1 (seen). The dataclass is frozen but the dict
    is not copied on construction; treat a frame you have sent or stored as read-only and
    use :meth:`with_flag` (which copies ``URL_set``) to derive the next stage's frame.
    """

    URL_set: dict[str, int]
    IP: str
    number: int
    flag: int

    KIND: ClassVar[Kind] = Kind.FRAME

    def with_flag(self, flag: int) -> Frame:
        """The same set as a new frame with ``flag`` (and its own copy of ``URL_set``)."""
        if type(flag) is not int or flag not in FLAGS:
            raise ValueError(f"flag must be 1, 2 or 3, got {flag!r}")
        return Frame(dict(self.URL_set), self.IP, self.number, flag)

    def to_json(self) -> dict[str, Any]:
        """The JSON body (shares ``URL_set`` with the frame; no copy)."""
        return {"URL_set": self.URL_set, "IP": self.IP, "number": self.number, "flag": self.flag}


@dataclass(frozen=True, slots=True)
class Register:
    """A host or center announces itself (not in the paper)."""

    IP: str
    network: int
    role: str  # "host" | "center" | "control" (status and operator tools)
    listen: str  # "host:port", IPv6 as "[addr]:port"
    CIDR: str | None = None  # the sender's LAN, e.g. "127.0.1.0/24"
    #: Body compressions offered (e.g. ("zstd",)); None: no offer (and no Welcome back).
    compress: tuple[str, ...] | None = None
    #: A center's home map (``HomeMap.describe()``); None: it broadcasts.
    homes: str | None = None

    KIND: ClassVar[Kind] = Kind.REGISTER

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"IP": self.IP, "network": self.network, "role": self.role, "listen": self.listen}
        if self.CIDR is not None:
            obj["CIDR"] = self.CIDR
        if self.compress is not None:
            obj["compress"] = list(self.compress)
        if self.homes is not None:
            obj["homes"] = self.homes
        return obj


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Liveness: sender's IP and its clock in seconds since the epoch (not in the paper)."""

    IP: str
    time: float
    #: A host's task_pool size when last read (None: not said): what it holds if it goes down.
    tasks: int | None = None
    #: The sender's store watermark ``(incarnation, step)``: its last step known to be on
    #: disk. A receiver that heard a higher step of the same store (or another store)
    #: knows that store came back behind (docs/PROTOCOL.md section 7). None: not said.
    store: tuple[str, int] | None = None

    KIND: ClassVar[Kind] = Kind.HEARTBEAT

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"IP": self.IP, "time": self.time}
        if self.tasks is not None:
            obj["tasks"] = self.tasks
        if self.store is not None:
            obj["store"] = {"id": self.store[0], "step": self.store[1]}
        return obj


@dataclass(frozen=True, slots=True)
class Ack:
    """Receiver's answer to the frame with ``number`` (not in the paper)."""

    number: int
    status: str  # "stored" | "duplicate" | "rejected"
    reason: str | None = None
    #: With reason "number-reused": the lowest sequence the sender may number its sets
    #: from (its store lost the counter; docs/PROTOCOL.md §7).
    sequence: int | None = None

    KIND: ClassVar[Kind] = Kind.ACK

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"number": self.number, "status": self.status}
        if self.reason is not None:
            obj["reason"] = self.reason
        if self.sequence is not None:
            obj["sequence"] = self.sequence
        return obj


@dataclass(frozen=True, slots=True)
class Task:
    """Task assignment: de-duplicated URLs from a center's task_URL for a host's task_pool;
    from a host, its tasks handed back; from an operator (``IP`` set), a gone host's tasks
    to move to the LAN's live hosts."""

    number: int
    URLs: tuple[str, ...]
    #: Only from a control connection: the host whose tasks move (``dedupnet reassign``).
    IP: str | None = None

    KIND: ClassVar[Kind] = Kind.TASK

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"number": self.number, "URLs": list(self.URLs)}
        if self.IP is not None:
            obj["IP"] = self.IP
        return obj


@dataclass(frozen=True, slots=True)
class Done:
    """A host's report that these tasks of its own are finished (they left its
    ``task_pool``): its center takes them off its ledger (docs/PROTOCOL.md section 12)."""

    number: int
    URLs: tuple[str, ...]

    KIND: ClassVar[Kind] = Kind.DONE

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "URLs": list(self.URLs)}


@dataclass(frozen=True, slots=True)
class Status:
    """Status request (``request=True``) or response (``request=False`` with ``body``)."""

    request: bool
    body: dict[str, Any] | None = None

    KIND: ClassVar[Kind] = Kind.STATUS

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"request": self.request}
        if self.body is not None:
            obj["body"] = self.body
        return obj


@dataclass(frozen=True, slots=True)
class Error:
    """Sent before closing a connection that broke the protocol."""

    reason: str
    message: str

    KIND: ClassVar[Kind] = Kind.ERROR

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message}


@dataclass(frozen=True, slots=True)
class Welcome:
    """A server's answer to a Register that offered compression: the one it accepts
    (empty: none). Only ever sent to a peer that offered; the transport consumes it."""

    compress: tuple[str, ...] = ()

    KIND: ClassVar[Kind] = Kind.WELCOME

    def to_json(self) -> dict[str, Any]:
        return {"compress": list(self.compress)}


Message: TypeAlias = Frame | Register | Heartbeat | Ack | Task | Status | Error | Welcome | Done

MESSAGE_TYPES: dict[Kind, type] = {
    Kind.FRAME: Frame,
    Kind.REGISTER: Register,
    Kind.HEARTBEAT: Heartbeat,
    Kind.ACK: Ack,
    Kind.TASK: Task,
    Kind.DONE: Done,
    Kind.STATUS: Status,
    Kind.ERROR: Error,
    Kind.WELCOME: Welcome,
}

# --- schemas and validators ------------------------------------------------------------


def _is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _is_ipv6(value: str) -> bool:
    # Same rule as jsonschema's format checker: a scoped address (fe80::1%eth0) is not valid.
    try:
        address = ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return not address.scope_id


# fastjsonschema's built-in ipv4/ipv6 formats are regexes; use ipaddress like jsonschema does.
_FORMATS = {"ipv4": _is_ipv4, "ipv6": _is_ipv6}


def load_schema(kind: Kind | int) -> dict[str, Any]:
    """The parsed JSON Schema of ``kind`` from the ``dedupnet.schemas`` package."""
    text = importlib.resources.files("dedupnet.schemas").joinpath(Kind(kind).schema_file).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


SCHEMAS: dict[Kind, dict[str, Any]] = {kind: load_schema(kind) for kind in Kind}
VALIDATORS: dict[Kind, Callable[[Any], Any]] = {
    kind: fastjsonschema.compile(schema, formats=_FORMATS) for kind, schema in SCHEMAS.items()
}


@functools.lru_cache(maxsize=16)
def _raised_validator(kind: Kind, max_urls: int) -> Callable[[Any], Any]:
    """Validator for ``kind`` with the URL ceiling raised above the schema's default."""
    schema = copy.deepcopy(SCHEMAS[kind])
    if kind is Kind.FRAME:
        schema["properties"]["URL_set"]["maxProperties"] = max_urls
    elif kind in (Kind.TASK, Kind.DONE):
        schema["properties"]["URLs"]["maxItems"] = max_urls
    return fastjsonschema.compile(schema, formats=_FORMATS)


def _url_set_fast_check() -> tuple[Callable[[Any], bool], Callable[[Any], Any]] | None:
    """A vectorised accept-only check of a frame's URL_set, derived from frame.schema.json.

    The generic validator fastjsonschema generates for ``URL_set`` costs about 0.5 us per
    URL, most of a frame's decode time. This check accepts a URL_set only if it certainly
    satisfies the schema's URL_set subschema (and the strict-integer rule); the rest of
    the frame is then checked by a validator compiled from the same schema with URL_set
    reduced to ``{"type": "object"}`` (the URL count is checked in from_json). Anything the
    check does not accept goes through the full validator, which gives the precise error.
    Returns None (no fast path) if the subschema has a shape this check does not mirror.
    """
    schema = SCHEMAS[Kind.FRAME]
    sub = schema["properties"]["URL_set"]
    names = sub.get("propertyNames", {})
    values = sub.get("additionalProperties", {})
    if (
        set(sub) - {"type", "maxProperties", "propertyNames", "additionalProperties", "description"}
        or sub.get("type") != "object"
        or set(names) - {"type", "minLength", "maxLength"}
        or names.get("type", "string") != "string"
        or set(values) != {"type", "enum"}
        or values["type"] != "integer"
        or not all(type(v) is int for v in values["enum"])
    ):
        return None
    min_len = names.get("minLength", 0)
    max_len = names.get("maxLength", 2**63)
    allowed = frozenset(values["enum"])
    only_int = {int}

    def check(url_set: Any) -> bool:
        if type(url_set) is not dict:
            return False
        if not url_set:
            return True
        try:
            lengths = list(map(str.__len__, url_set))  # one pass: type check (TypeError) and length
        except TypeError:
            return False
        return (
            min(lengths) >= min_len
            and max(lengths) <= max_len
            and set(map(type, url_set.values())) == only_int
            and set(url_set.values()) <= allowed
        )

    rest = copy.deepcopy(schema)
    rest["properties"]["URL_set"] = {"type": "object"}
    return check, fastjsonschema.compile(rest, formats=_FORMATS)


_FAST_FRAME = _url_set_fast_check()


def validator(kind: Kind | int, max_urls: int = MAX_URLS) -> Callable[[Any], Any]:
    """The compiled schema validator of ``kind`` (URL ceiling raised if ``max_urls`` > 10000)."""
    kind = Kind(kind)
    if max_urls > MAX_URLS and kind in (Kind.FRAME, Kind.TASK, Kind.DONE):
        return _raised_validator(kind, max_urls)
    return VALIDATORS[kind]


# --- from_json ------------------------------------------------------------------------

_FIELD_REASONS = {"flag": "bad-flag", "IP": "bad-ip"}
_URL_FIELDS = {Kind.FRAME: ("URL_set", dict), Kind.TASK: ("URLs", list), Kind.DONE: ("URLs", list)}


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(kind: Kind, message: str, reason: str = "schema") -> ProtocolError:
    return ProtocolError(f"{kind.name.lower()} message: {message}", reason)


def _translate(kind: Kind, obj: dict[str, Any], exc: fastjsonschema.JsonSchemaValueException) -> ProtocolError:
    """A ProtocolError saying which field was wrong and why, from fastjsonschema's error."""
    path = exc.path or ["data"]
    schema = SCHEMAS[kind]
    if len(path) <= 1:
        if exc.rule == "required":
            missing = [f for f in schema["required"] if f not in obj]
            return _fail(kind, f"missing required field(s) {', '.join(map(repr, missing))}")
        if exc.rule == "additionalProperties":
            extra = sorted(k for k in obj if k not in schema["properties"])
            return _fail(kind, f"unexpected field(s) {_short(extra, 200)}")
        return _fail(kind, f"body {exc.message.removeprefix('data ')}")
    field = path[1]
    reason = _FIELD_REASONS.get(field, "schema")
    if exc.rule in ("maxProperties", "maxItems") and field == _URL_FIELDS.get(kind, ("",))[0]:
        return _fail(kind, f"field {field!r} holds more than the schema's {MAX_URLS} URLs", "too-many-urls")
    if exc.rule == "propertyNames":
        bad = next((k for k in exc.value if not 1 <= len(k) <= MAX_URL_LENGTH), "?")
        return _fail(kind, f"field {field!r}: URL of length {len(bad)} (must be 1..{MAX_URL_LENGTH})", reason)
    if field == "IP" and exc.rule in ("anyOf", "format"):
        return _fail(kind, f"field 'IP' is not an IPv4 or IPv6 address (got {_short(exc.value)})", reason)
    where = ".".join(str(p) for p in path[1:])
    what = exc.message.removeprefix(exc.name or "data").strip()
    return _fail(kind, f"field {_short(where)} {what} (got {_short(exc.value)})", reason)


def _strict_int(kind: Kind, obj: dict[str, Any], field: str) -> None:
    value = obj[field]
    if type(value) is not int:
        raise _fail(kind, f"field {field!r} must be an integer without fraction or exponent, got {_short(value)}",
                    _FIELD_REASONS.get(field, "schema"))


def normalize_ip(text: str) -> str:
    """Canonical text form of an IP address (``ipaddress``'s); raises ValueError if invalid."""
    return str(ipaddress.ip_address(text))


def _ip(kind: Kind, text: str) -> str:
    try:
        return normalize_ip(text)
    except ValueError:  # unreachable after the schema's format check; kept as a safety net
        raise _fail(kind, f"field 'IP' is not an IP address (got {_short(text)})", "bad-ip") from None


_LISTEN = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([^\s:\[\]/]+)):([0-9]{1,5})")
_REASON = re.compile(r"[a-z0-9][a-z0-9-]*")


def _frame(obj: dict[str, Any], values_checked: bool = False) -> Frame:
    _strict_int(Kind.FRAME, obj, "number")
    _strict_int(Kind.FRAME, obj, "flag")
    url_set = obj["URL_set"]
    if not values_checked:
        for url, value in url_set.items():
            if type(value) is not int:
                raise _fail(Kind.FRAME, f"field 'URL_set': value of {_short(url)} must be the integer 0 or 1, "
                                        f"got {_short(value)}")
    return Frame(url_set, _ip(Kind.FRAME, obj["IP"]), obj["number"], obj["flag"])


def _register(obj: dict[str, Any]) -> Register:
    _strict_int(Kind.REGISTER, obj, "network")
    listen = obj["listen"]
    m = _LISTEN.fullmatch(listen)
    port = int(m.group(3)) if m else 0
    if not m or not 1 <= port <= 65535 or (m.group(1) is not None and not _is_ipv6(m.group(1))):
        raise _fail(Kind.REGISTER, f"field 'listen' must be host:port with port 1..65535 "
                                   f"(IPv6 as [addr]:port), got {_short(listen)}")
    cidr = obj.get("CIDR")
    if cidr is not None:
        try:
            cidr = str(ipaddress.ip_network(cidr, strict=False))
        except ValueError as exc:
            raise _fail(Kind.REGISTER, f"field 'CIDR' is not a network ({exc})") from None
    compress = obj.get("compress")
    return Register(_ip(Kind.REGISTER, obj["IP"]), obj["network"], obj["role"], listen, cidr,
                    None if compress is None else tuple(compress), obj.get("homes"))


def _heartbeat(obj: dict[str, Any]) -> Heartbeat:
    if "tasks" in obj:
        _strict_int(Kind.HEARTBEAT, obj, "tasks")
    store = obj.get("store")
    if store is not None:
        _strict_int(Kind.HEARTBEAT, store, "step")
        store = (store["id"], store["step"])
    return Heartbeat(_ip(Kind.HEARTBEAT, obj["IP"]), obj["time"], obj.get("tasks"), store)


def _ack(obj: dict[str, Any]) -> Ack:
    _strict_int(Kind.ACK, obj, "number")
    if "sequence" in obj:
        _strict_int(Kind.ACK, obj, "sequence")
    return Ack(obj["number"], obj["status"], obj.get("reason"), obj.get("sequence"))


def _task(obj: dict[str, Any]) -> Task:
    _strict_int(Kind.TASK, obj, "number")
    ip = obj.get("IP")
    return Task(obj["number"], tuple(obj["URLs"]), None if ip is None else _ip(Kind.TASK, ip))


def _done(obj: dict[str, Any]) -> Done:
    _strict_int(Kind.DONE, obj, "number")
    return Done(obj["number"], tuple(obj["URLs"]))


def _status(obj: dict[str, Any]) -> Status:
    return Status(obj["request"], obj.get("body"))


def _error(obj: dict[str, Any]) -> Error:
    if not _REASON.fullmatch(obj["reason"]):
        raise _fail(Kind.ERROR, f"field 'reason' must match [a-z0-9][a-z0-9-]*, got {_short(obj['reason'])}")
    return Error(obj["reason"], obj["message"])


def _welcome(obj: dict[str, Any]) -> Welcome:
    return Welcome(tuple(obj["compress"]))


_BUILDERS: dict[Kind, Callable[[dict[str, Any]], Message]] = {
    Kind.FRAME: _frame,
    Kind.REGISTER: _register,
    Kind.HEARTBEAT: _heartbeat,
    Kind.ACK: _ack,
    Kind.TASK: _task,
    Kind.STATUS: _status,
    Kind.ERROR: _error,
    Kind.WELCOME: _welcome,
    Kind.DONE: _done,
}


def from_json(kind: Kind | int, obj: Any, *, max_urls: int = MAX_URLS) -> Message:
    """Validate a decoded JSON body of ``kind`` and build its message.

    ``max_urls`` limits the URLs of a frame's ``URL_set`` or a task's ``URLs`` (default:
    the schemas' 10000). Raises :class:`ProtocolError` (reasons: ``schema``, ``bad-flag``,
    ``bad-ip``, ``too-many-urls``). ``obj`` is not copied: the message may share its
    containers (the frame's ``URL_set`` is ``obj["URL_set"]``).
    """
    try:
        kind = Kind(kind)
    except ValueError:
        raise ProtocolError(f"unknown message kind {kind!r}", "bad-kind") from None
    if type(obj) is not dict:
        raise _fail(kind, f"body must be a JSON object, got {type(obj).__name__}")
    if kind in _URL_FIELDS:
        url_field, container = _URL_FIELDS[kind]
        urls = obj.get(url_field)
        if type(urls) is container and len(urls) > max_urls:
            raise _fail(kind, f"field {url_field!r} holds {len(urls)} URLs, more than the limit of {max_urls}",
                        "too-many-urls")
    fast = kind is Kind.FRAME and _FAST_FRAME is not None and _FAST_FRAME[0](obj.get("URL_set"))
    try:
        (_FAST_FRAME[1] if fast else validator(kind, max_urls))(obj)  # type: ignore[index]
    except fastjsonschema.JsonSchemaValueException as exc:
        raise _translate(kind, obj, exc) from None
    except fastjsonschema.JsonSchemaException as exc:  # not expected from compiled validators
        raise _fail(kind, str(exc)) from None
    if fast:
        return _frame(obj, values_checked=True)
    return _BUILDERS[kind](obj)
