"""Wire format and message validation: round trips, chunked streams, hostile input, schemas."""

from __future__ import annotations

import importlib.resources
import ipaddress
import json
import struct
import tracemalloc
import zlib

import jsonschema
import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dedupnet.codec import messages

from dedupnet.codec import wire
from dedupnet.codec.errors import ProtocolError
from dedupnet.codec.messages import (
    FLAG_ANSWER,
    FLAG_LOOKUP,
    FLAG_NEW_SET,
    MAX_NUMBER,
    MAX_URLS,
    Done,
    Ack,
    Error,
    Frame,
    Heartbeat,
    Kind,
    Register,
    Status,
    Task,
    Welcome,
)
from dedupnet.codec.wire import (
    COMPRESS_MIN_BODY,
    FLAG_ZSTD,
    HEADER_SIZE,
    MAX_TAG,
    NEED_DATA,
    Decoder,
    Deflater,
    compressed,
    decode_one,
    encode,
    encode_frame,
    is_compressed,
    pack,
    uncompressed,
)

# Modest settings: the build machine has 2 cores shared with other work. Local settings
# objects (not a global profile) so other test modules are unaffected.
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KNOWN_REASONS = {
    "bad-magic", "bad-version", "bad-kind", "bad-header", "too-large", "bad-json", "schema",
    "bad-flag", "bad-ip", "too-many-urls", "truncated", "trailing-data", "bad-compression",
}  # fmt: skip

# --- strategies -------------------------------------------------------------------------

hosts = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}\.){0,3}[a-z]{2,6}", fullmatch=True)
urls = st.one_of(
    st.builds(lambda h, p: f"https://{h}/{p}", hosts, st.text(max_size=40)),
    st.text(min_size=1, max_size=40),  # any non-empty string is a valid key on the wire
)
ips = st.ip_addresses().map(str)  # str() of an ip_address object is the canonical form
numbers = st.integers(0, MAX_NUMBER)
flags = st.sampled_from([FLAG_NEW_SET, FLAG_LOOKUP, FLAG_ANSWER])
url_sets = st.dictionaries(urls, st.sampled_from([0, 1]), max_size=25)
codecs = st.from_regex(r"[a-z0-9][a-z0-9-]{0,15}", fullmatch=True)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # orjson's integer range
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20,
)


listens = st.one_of(
    st.builds(lambda host, port: f"{host}:{port}", hosts, st.integers(1, 65535)),
    st.builds(lambda ip, port: f"[{ip}]:{port}", st.ip_addresses(v=6).map(str), st.integers(1, 65535)),
)
cidrs = st.builds(
    lambda ip, data: str(ipaddress.ip_network(f"{ip}/{data % (ip.max_prefixlen + 1)}", strict=False)),
    st.ip_addresses(),
    st.integers(0, 128),
)

STRATEGIES = {
    Kind.FRAME: st.builds(Frame, url_sets, ips, numbers, flags),
    Kind.REGISTER: st.builds(
        Register, ips, st.integers(1, 65535), st.sampled_from(["host", "center"]), listens, st.none() | cidrs,
        st.none() | st.lists(codecs, max_size=8, unique=True).map(tuple),
    ),
    Kind.HEARTBEAT: st.builds(
        Heartbeat, ips, st.floats(min_value=0, allow_nan=False, allow_infinity=False) | st.integers(0, 2**63)
    ),
    Kind.ACK: st.builds(Ack, numbers, st.sampled_from(["stored", "duplicate", "rejected"]), st.none() | st.text()),
    Kind.TASK: st.builds(Task, numbers, st.lists(urls, max_size=25).map(tuple)),
    Kind.STATUS: st.builds(Status, st.booleans(), st.none() | st.dictionaries(st.text(max_size=10), json_values)),
    Kind.ERROR: st.builds(Error, st.from_regex(r"[a-z0-9][a-z0-9-]{0,30}", fullmatch=True), st.text(max_size=200)),
    Kind.WELCOME: st.builds(Welcome, st.lists(codecs, max_size=1).map(tuple)),
    Kind.DONE: st.builds(Done, numbers, st.lists(urls, max_size=25).map(tuple)),
}
any_message = st.one_of(*STRATEGIES.values())
tags = st.binary(max_size=MAX_TAG)


def frame_bytes(body: bytes, kind: int = 1, *, version: int = 1, magic: bytes = b"DN", tag_len: int = 0,
                reserved: bytes = bytes(7), body_len: int | None = None) -> bytes:
    """A header built by hand (independently of wire.header) followed by ``body``."""
    length = len(body) if body_len is None else body_len
    return magic + bytes([version, kind]) + struct.pack(">I", length) + bytes([tag_len]) + reserved + body


def frame_json(**changes) -> dict:
    obj = {"URL_set": {"http://a.example/": 0, "http://b.example/": 1}, "IP": "127.0.1.10", "number": 7, "flag": 1}
    obj.update(changes)
    return {k: v for k, v in obj.items() if v is not DROP}


DROP = object()


def reason_of(data: bytes, **decoder_args) -> str:
    with pytest.raises(ProtocolError) as info:
        decode_one(data, **decoder_args)
    return info.value.reason


# --- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name.lower())
@FEW
@given(data=st.data())
def test_round_trip_every_kind(kind, data):
    msg = data.draw(STRATEGIES[kind])
    tag = data.draw(tags)
    encoded = encode(msg, tag=tag)
    assert encoded[:2] == b"DN" and encoded[2] == 1 and encoded[3] == kind
    assert struct.unpack(">I", encoded[4:8])[0] == len(encoded) - HEADER_SIZE - len(tag)
    assert encoded[8] == len(tag) and encoded[9:16] == bytes(7)
    decoder = Decoder()
    decoder.feed(encoded)
    assert decoder.next_message() == msg
    assert decoder.last_tag == tag
    assert decoder.next_message() is NEED_DATA
    assert decoder.pending == 0
    if kind is Kind.FRAME:
        assert encode_frame(msg, tag=tag) == encoded


@SOME
@given(msgs=st.lists(st.tuples(any_message, tags), max_size=15), data=st.data())
def test_stream_in_random_chunks(msgs, data):
    stream = b"".join(encode(m, tag=t) for m, t in msgs)
    decoder = Decoder()
    got = []
    pos = 0
    while pos < len(stream):
        size = data.draw(st.integers(1, max(1, len(stream) - pos)) | st.integers(1, 20))
        chunk = stream[pos : pos + size]
        pos += size
        decoder.feed(data.draw(st.sampled_from([bytes, bytearray, memoryview]))(chunk))
        while (msg := decoder.next_message()) is not NEED_DATA:
            got.append((msg, decoder.last_tag))
            assert decoder.buffered <= decoder.max_buffer
        assert decoder.buffered <= decoder.max_buffer
    assert got == msgs
    assert decoder.pending == 0
    decoder.eof()  # clean end of stream


def test_iteration_yields_all_complete_messages():
    msgs = [Ack(i, "stored") for i in range(5)]
    stream = b"".join(map(encode, msgs))
    decoder = Decoder()
    decoder.feed(stream[:-3])
    assert list(decoder) == msgs[:4]
    assert decoder.next_message() is NEED_DATA
    decoder.feed(stream[-3:])
    assert list(decoder.events()) == msgs[4:]
    assert decoder.messages == 5


def test_fed_bytearray_is_copied():
    encoded = encode(Ack(1, "stored"))
    buf = bytearray(encoded)
    decoder = Decoder()
    decoder.feed(buf)
    buf[:] = bytes(len(buf))  # the caller reuses its receive buffer
    assert decoder.next_message() == Ack(1, "stored")


# --- hostile input ----------------------------------------------------------------------

valid_prefixes = st.sampled_from([b"", b"D", b"DN", b"DN\x01", b"DN\x01\x01", b"DN\x01\x05"])


@st.composite
def hostile_streams(draw):
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:  # a plausible header start, then anything
        return draw(valid_prefixes) + draw(st.binary(max_size=300))
    if kind == 2:  # a valid message with some bytes flipped
        encoded = bytearray(encode(draw(any_message), tag=draw(st.binary(max_size=8))))
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(encoded) - 1))
            encoded[i] = draw(st.integers(0, 255))
        return bytes(encoded)
    if kind == 3:  # valid header with an arbitrary length, then garbage
        body = draw(st.binary(max_size=600))  # more than max_buffer: the limit must bite
        return frame_bytes(body, draw(st.integers(1, 8)), body_len=draw(st.integers(0, 2**32 - 1)))
    return draw(hostile_compressed())


@st.composite
def hostile_compressed(draw):
    """The compressed path: flag bit 0 set over garbage, a real zstd frame of anything, a
    compressed message with bytes flipped, a zstd frame with a lying or missing size."""
    way = draw(st.integers(0, 4))
    kind = draw(st.integers(1, 8))
    if way == 0:
        return frame_bytes(draw(st.binary(max_size=200)), kind, reserved=b"\1" + bytes(6))
    if way == 1:
        plain = draw(st.binary(max_size=400) | st.builds(lambda m: orjson.dumps(m.to_json()), any_message))
        level = draw(st.integers(1, 5))
        sized = draw(st.booleans())
        body = zstandard.ZstdCompressor(level=level, write_content_size=sized).compress(plain)
        return frame_bytes(body, kind, reserved=b"\1" + bytes(6))
    if way == 2:
        encoded = bytearray(compressed(encode(draw(any_message))))
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(encoded) - 1))
            encoded[i] = draw(st.integers(0, 255))
        return bytes(encoded)
    if way == 3:  # a valid zstd frame with its declared content size changed
        plain = draw(st.builds(lambda m: orjson.dumps(m.to_json()), any_message))
        body = bytearray(zstandard.ZstdCompressor().compress(plain))
        i = draw(st.integers(4, min(len(body) - 1, 12)))
        body[i] = draw(st.integers(0, 255))
        return frame_bytes(bytes(body), kind, reserved=b"\1" + bytes(6))
    # a zstd frame followed by extra bytes (a second frame or junk)
    plain = draw(st.builds(lambda m: orjson.dumps(m.to_json()), any_message))
    body = zstandard.ZstdCompressor().compress(plain) + draw(st.binary(min_size=1, max_size=20))
    return frame_bytes(body, kind, reserved=b"\1" + bytes(6))


@MANY
@given(stream=hostile_streams() | hostile_compressed(), max_frame_size=st.integers(1, 256), data=st.data())
def test_arbitrary_bytes_only_raise_protocol_error(stream, max_frame_size, data):
    decoder = Decoder(max_frame_size=max_frame_size, max_urls=data.draw(st.integers(0, 30)),
                      allow_compressed=data.draw(st.booleans()))
    pos = 0
    try:
        while pos < len(stream):
            size = data.draw(st.integers(1, 64))
            decoder.feed(stream[pos : pos + size])
            pos += size
            for _ in decoder:
                assert decoder.buffered <= decoder.max_buffer
            assert decoder.buffered <= HEADER_SIZE + max_frame_size + MAX_TAG
        decoder.eof()
    except ProtocolError as exc:
        assert exc.reason in KNOWN_REASONS
        # Poisoned: every later call raises the same error.
        for call in (decoder.next_message, lambda: decoder.feed(b"DN"), decoder.eof):
            with pytest.raises(ProtocolError) as again:
                call()
            assert again.value is exc
        assert decoder.buffered == 0


@st.composite
def frame_like_bodies(draw):
    """Objects with (some of) a message's field names and arbitrary JSON values."""
    kind = draw(st.sampled_from(list(Kind)))
    fields = list(messages.SCHEMAS[kind]["properties"])
    obj = draw(st.dictionaries(st.sampled_from(fields + ["extra"]), json_values, max_size=len(fields) + 1))
    if kind is Kind.FRAME and draw(st.booleans()):
        obj["URL_set"] = draw(st.dictionaries(st.text(max_size=5), json_values, max_size=5))
    return kind, obj


@MANY
@given(
    body=st.one_of(
        st.tuples(st.sampled_from(list(Kind)), json_values),
        frame_like_bodies(),
        st.tuples(st.sampled_from(list(Kind)), st.builds(lambda m: m.to_json(), any_message)),
    )
)
def test_arbitrary_json_bodies_only_raise_protocol_error(body):
    kind, value = body
    encoded = frame_bytes(json.dumps(value).encode(), kind)  # stdlib json: big ints too
    try:
        msg = decode_one(encoded)
    except ProtocolError as exc:
        assert exc.reason in KNOWN_REASONS
        assert str(exc)
    else:
        assert msg.KIND is kind
        # Whatever was accepted is valid by the independent jsonschema implementation.
        assert _jsonschema_valid(kind, value)


# --- named errors -----------------------------------------------------------------------

GOOD = orjson.dumps(frame_json())


def test_truncated_header_needs_data():
    encoded = frame_bytes(GOOD)
    decoder = Decoder()
    for i in range(HEADER_SIZE - 1):
        decoder.feed(encoded[i : i + 1])
        assert decoder.next_message() is NEED_DATA
    with pytest.raises(ProtocolError) as info:
        decoder.eof()
    assert info.value.reason == "truncated"


def test_truncated_body_needs_data():
    decoder = Decoder()
    decoder.feed(frame_bytes(GOOD)[:-1])
    assert decoder.next_message() is NEED_DATA
    assert reason_of(frame_bytes(GOOD)[:-1]) == "truncated"
    assert reason_of(frame_bytes(GOOD) + b"D") == "trailing-data"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (frame_bytes(GOOD, magic=b"XN"), "bad-magic"),
        (frame_bytes(GOOD, magic=b"DX"), "bad-magic"),
        (b"GET / HTTP/1.1\r\n\r\n", "bad-magic"),
        (frame_bytes(GOOD, version=0), "bad-version"),
        (frame_bytes(GOOD, version=2), "bad-version"),
        (frame_bytes(GOOD, kind=0), "bad-kind"),
        (frame_bytes(GOOD, kind=10), "bad-kind"),
        (frame_bytes(GOOD, kind=255), "bad-kind"),
        (frame_bytes(GOOD, reserved=b"\0\0\0\0\0\0\1"), "bad-header"),
        (frame_bytes(b""), "bad-json"),
        (frame_bytes(b"{"), "bad-json"),
        (frame_bytes(b'{"URL_set": {}, "IP": "1.2.3.4", "number": NaN, "flag": 1}'), "bad-json"),
        (frame_bytes(b'"\\ud800"'), "bad-json"),
        (frame_bytes(b"\xff\xfe"), "bad-json"),
        (frame_bytes(b"[1, 2]"), "schema"),
        (frame_bytes(b"null"), "schema"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_header_and_json_errors(data, reason):
    assert reason_of(data) == reason


def test_bad_magic_detected_from_first_byte():
    decoder = Decoder()
    decoder.feed(b"X")
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.reason == "bad-magic"


def test_length_over_limit_detected_with_only_the_header():
    decoder = Decoder(max_frame_size=1000)
    decoder.feed(frame_bytes(b"", body_len=1001))  # the 16-byte header alone
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.reason == "too-large"
    assert decoder.buffered == 0
    ok = Decoder(max_frame_size=1000)
    ok.feed(frame_bytes(b"", body_len=1000))
    assert ok.next_message() is NEED_DATA
    assert ok.buffered == HEADER_SIZE  # nothing but the header is held


def test_huge_declared_length_with_default_limit():
    assert reason_of(frame_bytes(b"", body_len=2**32 - 1)) == "too-large"


@pytest.mark.parametrize(
    ("obj", "reason", "mentions"),
    [
        (frame_json(flag=0), "bad-flag", "flag"),
        (frame_json(flag=4), "bad-flag", "flag"),
        (frame_json(flag="1"), "bad-flag", "flag"),
        (frame_json(flag=True), "bad-flag", "flag"),
        (frame_json(flag=1.0), "bad-flag", "flag"),
        (frame_json(flag=None), "bad-flag", "flag"),
        (frame_json(URL_set={"http://a/": 2}), "schema", "URL_set"),
        (frame_json(URL_set={"http://a/": True}), "schema", "URL_set"),
        (frame_json(URL_set={"http://a/": False}), "schema", "URL_set"),
        (frame_json(URL_set={"http://a/": -1}), "schema", "URL_set"),
        (frame_json(URL_set={"http://a/": 1.0}), "schema", "URL_set"),
        (frame_json(URL_set={"http://a/": "0"}), "schema", "URL_set"),
        (frame_json(URL_set={"": 0}), "schema", "URL_set"),
        (frame_json(URL_set={"x" * 8193: 0}), "schema", "URL_set"),
        (frame_json(URL_set=["http://a/"]), "schema", "URL_set"),
        (frame_json(IP="999.1.1.1"), "bad-ip", "IP"),
        (frame_json(IP="1.2.3"), "bad-ip", "IP"),
        (frame_json(IP="fe80::1%eth0"), "bad-ip", "IP"),
        (frame_json(IP="localhost"), "bad-ip", "IP"),
        (frame_json(IP="1.2.3.4\n"), "bad-ip", "IP"),
        (frame_json(IP=16909060), "bad-ip", "IP"),
        (frame_json(number=-1), "schema", "number"),
        (frame_json(number=2**63), "schema", "number"),
        (frame_json(number=2**64), "schema", "number"),  # orjson reads it as a float
        (frame_json(number=7.0), "schema", "number"),
        (frame_json(number="7"), "schema", "number"),
        (frame_json(number=DROP), "schema", "number"),
        (frame_json(IP=DROP, flag=DROP), "schema", "IP"),
        (frame_json(hops=1), "schema", "hops"),
    ],
)
def test_frame_content_errors(obj, reason, mentions):
    with pytest.raises(ProtocolError) as info:
        decode_one(frame_bytes(json.dumps(obj).encode()))
    assert info.value.reason == reason
    assert mentions in str(info.value) and str(info.value).startswith("frame message: ")
    if _strict_ints(obj):  # else only our strict-integer rule rejects it (JSON Schema takes 1.0)
        assert not _jsonschema_valid(Kind.FRAME, obj)


def test_too_many_urls_with_configured_limit():
    obj = frame_json(URL_set={f"http://a/{i}": 0 for i in range(4)})
    encoded = frame_bytes(orjson.dumps(obj))
    assert reason_of(encoded, max_urls=3) == "too-many-urls"
    assert decode_one(encoded, max_urls=4).URL_set == obj["URL_set"]
    task = frame_bytes(orjson.dumps({"number": 1, "URLs": ["a", "b", "c", "d"]}), Kind.TASK)
    assert reason_of(task, max_urls=3) == "too-many-urls"
    assert decode_one(task, max_urls=4) == Task(1, ("a", "b", "c", "d"))


def test_schema_ceiling_and_raised_limit():
    url_set = {f"http://a/{i}": i % 2 for i in range(MAX_URLS + 1)}
    encoded = encode(Frame(url_set, "127.0.0.1", 1, 1))
    assert reason_of(encoded) == "too-many-urls"
    assert decode_one(encoded, max_urls=MAX_URLS + 1).URL_set == url_set
    # Beyond the ceiling the full (raised) schema still applies to each value.
    url_set["http://a/0"] = 2
    assert reason_of(encode(Frame(url_set, "127.0.0.1", 1, 1)), max_urls=MAX_URLS + 1) == "schema"
    urls = tuple(url_set)
    assert reason_of(encode(Task(1, urls))) == "too-many-urls"
    assert decode_one(encode(Task(1, urls)), max_urls=MAX_URLS + 1).URLs == urls


def test_ip_is_normalised():
    obj = frame_json(IP="2001:DB8:0:0:0:0:0:1")
    assert decode_one(frame_bytes(orjson.dumps(obj))).IP == "2001:db8::1"


@pytest.mark.parametrize(
    ("kind", "obj", "reason"),
    [
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "h:1", "CIDR": "10.0.0.0/8"}, None),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "h:0"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "h:65536"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "h:80\n"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "[zz::1]:80"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "h"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 65536, "role": "host", "listen": "h:1"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 0, "role": "host", "listen": "h:1"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 0, "role": "center", "listen": "h:1"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 0, "role": "control", "listen": "h:1"}, None),  # no network
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1.0, "role": "host", "listen": "h:1"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "peer", "listen": "h:1"}, "schema"),
        (Kind.REGISTER, {"IP": "1.2.3.4", "network": 1, "role": "host", "listen": "h:1", "CIDR": "1.2.3.4/33"},
         "schema"),
        (Kind.REGISTER, {"IP": "1.2.3", "network": 1, "role": "host", "listen": "h:1"}, "bad-ip"),
        (Kind.HEARTBEAT, {"IP": "::1", "time": 0}, None),
        (Kind.HEARTBEAT, {"IP": "::1", "time": -1}, "schema"),
        (Kind.HEARTBEAT, {"IP": "::1", "time": True}, "schema"),
        (Kind.HEARTBEAT, {"IP": "::1"}, "schema"),
        (Kind.ACK, {"number": 1, "status": "stored", "reason": "x"}, None),
        (Kind.ACK, {"number": 1, "status": "lost"}, "schema"),
        (Kind.ACK, {"number": 1.5, "status": "stored"}, "schema"),
        (Kind.TASK, {"number": 1, "URLs": [""]}, "schema"),
        (Kind.TASK, {"number": 1, "URLs": "http://a/"}, "schema"),
        (Kind.TASK, {"number": 1, "URLs": [1]}, "schema"),
        (Kind.STATUS, {"request": True}, None),
        (Kind.STATUS, {"request": 1}, "schema"),
        (Kind.STATUS, {"request": False, "body": []}, "schema"),
        (Kind.ERROR, {"reason": "bad-json", "message": ""}, None),
        (Kind.ERROR, {"reason": "Bad", "message": ""}, "schema"),
        (Kind.ERROR, {"reason": "bad\n", "message": ""}, "schema"),
        (Kind.ERROR, {"reason": "", "message": ""}, "schema"),
        (Kind.ERROR, {"reason": "x", "message": "", "extra": 1}, "schema"),
    ],
)
def test_other_kinds_content(kind, obj, reason):
    encoded = frame_bytes(json.dumps(obj).encode(), kind)
    if reason is None:
        assert decode_one(encoded).KIND is kind
    else:
        assert reason_of(encoded) == reason


# --- decoder behaviour ------------------------------------------------------------------


def test_poisoned_decoder_raises_same_error():
    decoder = Decoder()
    decoder.feed(frame_bytes(b"{") + encode(Ack(1, "stored")))
    with pytest.raises(ProtocolError) as first:
        decoder.next_message()
    for call in (decoder.next_message, lambda: decoder.feed(b"x"), decoder.eof, lambda: list(decoder)):
        with pytest.raises(ProtocolError) as again:
            call()
        assert again.value is first.value
    assert decoder.error is first.value and decoder.pending == 0


def test_error_after_good_messages_keeps_them():
    decoder = Decoder()
    decoder.feed(encode(Ack(1, "stored")) + encode(Ack(2, "stored")) + b"XX" + bytes(14))
    assert decoder.next_message() == Ack(1, "stored")
    assert decoder.next_message() == Ack(2, "stored")
    with pytest.raises(ProtocolError):
        decoder.next_message()


def test_verify_tag_hook():
    seen = []

    def verify(signed: bytes, tag: bytes) -> None:
        seen.append((signed, tag))
        if tag != b"ok":
            raise ProtocolError("bad tag", "bad-tag")

    msg = Heartbeat("127.0.0.1", 12.5)
    good = encode(msg, tag=b"ok")
    decoder = Decoder(verify_tag=verify)
    decoder.feed(good)
    assert decoder.next_message() == msg and decoder.last_tag == b"ok"
    assert seen == [(good[:-2], b"ok")]
    assert good[:-2] == wire.header(Kind.HEARTBEAT, len(good) - HEADER_SIZE - 2, 2) + good[HEADER_SIZE:-2]
    decoder.feed(encode(msg, tag=b"no"))
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.reason == "bad-tag"


def test_encode_limits_and_types():
    with pytest.raises(ValueError):
        encode(Ack(1, "stored"), tag=bytes(256))
    with pytest.raises(ValueError):
        encode_frame(Frame({}, "::1", 1, 1), tag=bytes(256))
    with pytest.raises(TypeError):
        encode({"number": 1})  # type: ignore[arg-type]
    assert pack(Kind.ACK, b'{"number":1,"status":"stored"}') == encode(Ack(1, "stored"))
    with pytest.raises(ValueError):
        Decoder(max_frame_size=0)


def test_frame_helpers():
    frame = Frame({"http://a/": 0}, "127.0.1.10", 9, FLAG_NEW_SET)
    broadcast = frame.with_flag(FLAG_LOOKUP)
    assert broadcast == Frame({"http://a/": 0}, "127.0.1.10", 9, 2)
    assert broadcast.URL_set is not frame.URL_set  # the next stage edits its own copy
    assert frame.to_json() == {"URL_set": {"http://a/": 0}, "IP": "127.0.1.10", "number": 9, "flag": 1}
    for bad in (0, 4, True, "3"):
        with pytest.raises(ValueError):
            frame.with_flag(bad)
    with pytest.raises(AttributeError):
        frame.flag = 3  # type: ignore[misc]
    assert [int(k) for k in Kind] == list(range(1, 10))
    assert (FLAG_NEW_SET, FLAG_LOOKUP, FLAG_ANSWER) == (1, 2, 3)


# --- schemas: well-formed, and the two validators agree ------------------------------------

SCHEMA_DIR = importlib.resources.files("dedupnet.schemas")
V7 = jsonschema.Draft7Validator
JSONSCHEMA = {k: V7(s, format_checker=V7.FORMAT_CHECKER) for k, s in messages.SCHEMAS.items()}


def _jsonschema_valid(kind: Kind, obj) -> bool:
    return JSONSCHEMA[kind].is_valid(obj)


def _fast_valid(kind: Kind, obj) -> bool:
    try:
        messages.VALIDATORS[kind](obj)
    except messages.fastjsonschema.JsonSchemaValueException:
        return False
    return True


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name.lower())
def test_schema_files_are_valid_schemas(kind):
    schema = json.loads(SCHEMA_DIR.joinpath(kind.schema_file).read_text("utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    V7.check_schema(schema)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    assert schema == messages.SCHEMAS[kind]


def test_no_stray_schema_files():
    files = {p.name for p in SCHEMA_DIR.iterdir() if p.name.endswith(".json")}
    assert files == {k.schema_file for k in Kind}


def test_limits_match_schemas():
    frame = messages.SCHEMAS[Kind.FRAME]["properties"]
    assert frame["URL_set"]["maxProperties"] == MAX_URLS
    assert frame["URL_set"]["propertyNames"]["maxLength"] == messages.MAX_URL_LENGTH
    assert frame["number"]["maximum"] == MAX_NUMBER
    assert frame["flag"]["enum"] == [FLAG_NEW_SET, FLAG_LOOKUP, FLAG_ANSWER]
    assert messages.SCHEMAS[Kind.TASK]["properties"]["URLs"]["maxItems"] == MAX_URLS
    assert messages._FAST_FRAME is not None  # the frame fast path is active


@st.composite
def valid_and_invalid_objects(draw):
    kind = draw(st.sampled_from(list(Kind)))
    obj = draw(STRATEGIES[kind]).to_json()
    obj = orjson.loads(orjson.dumps(obj))  # as it arrives: lists, not tuples
    for _ in range(draw(st.integers(0, 2))):
        props = list(messages.SCHEMAS[kind]["properties"])
        action = draw(st.sampled_from(["drop", "extra", "replace", "url-value", "url-key"]))
        if action == "drop" and obj:
            obj.pop(draw(st.sampled_from(sorted(obj))))
        elif action == "extra":
            obj[draw(st.text(max_size=8))] = draw(json_values)
        elif action == "replace":
            obj[draw(st.sampled_from(props))] = draw(json_values | st.sampled_from([0, 1, 2, -1, True, 1.0, "1"]))
        elif action == "url-value" and kind is Kind.FRAME and isinstance(obj.get("URL_set"), dict):
            obj["URL_set"][draw(urls)] = draw(json_values | st.sampled_from([0, 1, 2, True, False, 0.0, 1.0]))
        elif action == "url-key" and kind is Kind.FRAME and isinstance(obj.get("URL_set"), dict):
            obj["URL_set"][draw(st.sampled_from(["", "x" * 8192, "x" * 8193]))] = 0
    return kind, obj


def _strict_ints(value) -> bool:
    """No float anywhere that JSON Schema would count as an integer (1.0)."""
    if isinstance(value, float):
        return not value.is_integer()
    if isinstance(value, dict):
        return all(map(_strict_ints, value.values()))
    if isinstance(value, list):
        return all(map(_strict_ints, value))
    return True


@MANY
@given(case=valid_and_invalid_objects())
def test_jsonschema_and_fastjsonschema_agree(case):
    kind, obj = case
    expected = _jsonschema_valid(kind, obj)
    assert _fast_valid(kind, obj) == expected
    if kind is Kind.FRAME and isinstance(obj, dict):
        check, rest = messages._FAST_FRAME
        if check(obj.get("URL_set")):  # the fast path may only accept what the schema accepts
            try:
                rest(obj)
                rest_ok = True
            except messages.fastjsonschema.JsonSchemaValueException:
                rest_ok = False
            assert rest_ok == expected
    try:
        msg = messages.from_json(kind, obj)
    except ProtocolError as exc:
        assert exc.reason in KNOWN_REASONS
        accepted = False
    else:
        accepted = True
        assert msg.KIND is kind
    if accepted:
        assert expected  # from_json is never looser than the schema
    elif expected:
        # Stricter than the schema only on integral floats and registration/error syntax.
        assert kind in (Kind.REGISTER, Kind.ERROR) or not _strict_ints(obj)


# --- compressed bodies (header flag bit 0) ------------------------------------------------

BIG = Frame({f"http://site{i % 7}.example/docs/page-{i}.html": i % 2 for i in range(200)}, "127.0.1.10", 99, 2)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name.lower())
@FEW
@given(data=st.data())
def test_round_trip_compressed_every_kind(kind, data):
    msg = data.draw(STRATEGIES[kind])
    plain = encode(msg)
    small = encode(msg, compress=True)
    body_len = len(plain) - HEADER_SIZE
    assert is_compressed(small) == (len(small) != len(plain))
    if is_compressed(small):
        assert body_len >= COMPRESS_MIN_BODY and len(small) < len(plain)
        assert small[9] == FLAG_ZSTD and small[10:16] == bytes(6)
    else:
        assert small == plain  # short, or zstd would not make it smaller
    assert decode_one(small) == msg
    assert compressed(plain) == small
    assert uncompressed(small) == plain
    if kind is Kind.FRAME:
        assert encode_frame(msg, compress=True) == small


def test_compressed_frame_is_smaller_and_decodes():
    plain, small = encode(BIG), encode(BIG, compress=True)
    assert len(small) * 4 < len(plain)
    decoder = Decoder()
    decoder.feed(small)
    assert decoder.next_message() == BIG and decoder.compressed_messages == 1
    assert decode_one(plain) == BIG


def test_small_and_tagged_bodies_are_never_compressed():
    beat = encode(Heartbeat("127.0.0.1", 1.5), compress=True)
    assert not is_compressed(beat) and beat == encode(Heartbeat("127.0.0.1", 1.5))
    tagged = encode(BIG, tag=b"t", compress=True)
    assert not is_compressed(tagged) and tagged == encode(BIG, tag=b"t")
    assert compressed(tagged) is tagged


@SOME
@given(msgs=st.lists(st.tuples(any_message | st.just(BIG), st.booleans()), max_size=10), data=st.data())
def test_mixed_stream_in_random_chunks(msgs, data):
    stream = b"".join(encode(m, compress=c) for m, c in msgs)
    decoder = Decoder()
    got = []
    pos = 0
    while pos < len(stream):
        size = data.draw(st.integers(1, max(1, len(stream) - pos)) | st.integers(1, 20))
        decoder.feed(stream[pos : pos + size])
        pos += size
        got += list(decoder)
    assert got == [m for m, _ in msgs]
    # Converting the whole stream either way gives the same messages.
    assert list(_decode_all(compressed(stream))) == got
    assert not is_compressed(uncompressed(stream)) and list(_decode_all(uncompressed(stream))) == got


def _decode_all(stream: bytes):
    decoder = Decoder()
    decoder.feed(stream)
    return decoder


def test_compressed_body_rejected_unless_negotiated():
    small = encode(BIG, compress=True)
    assert reason_of(small, allow_compressed=False) == "bad-header"
    assert decode_one(encode(BIG), allow_compressed=False) == BIG  # plain bodies are fine


@pytest.mark.parametrize("bit", range(1, 8))
def test_unknown_flag_bits_rejected(bit):
    assert reason_of(frame_bytes(GOOD, reserved=bytes([1 << bit]) + bytes(6))) == "bad-header"
    assert reason_of(frame_bytes(GOOD, reserved=bytes([1 << bit | 1]) + bytes(6))) == "bad-header"
    with pytest.raises(ValueError):
        wire.header(Kind.FRAME, 1, flags=1 << bit)


def test_zip_bomb_rejected_before_decompressing():
    # 16 MiB of JSON whitespace compresses to about 500 bytes: far below max_frame_size as
    # received, far above it once decompressed. Its declared size is what stops it.
    bomb = zstandard.ZstdCompressor(level=3).compress(b"{" + b" " * (16 * 1024 * 1024) + b"}")
    assert len(bomb) < 4096
    with pytest.raises(ProtocolError) as info:
        decode_one(pack(Kind.FRAME, bomb, flags=FLAG_ZSTD))
    assert info.value.reason == "too-large"
    assert "decompressed" in str(info.value) and "4194304" in str(info.value)
    # The decompressed limit is the decoder's max_frame_size, not only the default.
    small = encode(BIG, compress=True)
    plain_len = len(encode(BIG)) - HEADER_SIZE
    assert reason_of(small, max_frame_size=plain_len - 1) == "too-large"
    assert decode_one(small, max_frame_size=plain_len) == BIG
    with pytest.raises(ProtocolError):
        uncompressed(small, plain_len - 1)


def test_compressed_body_without_declared_size_rejected():
    body = zstandard.ZstdCompressor(write_content_size=False).compress(orjson.dumps(BIG.to_json()))
    assert reason_of(pack(Kind.FRAME, body, flags=FLAG_ZSTD)) == "bad-compression"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not zstd at all",
        zstandard.ZstdCompressor().compress(GOOD)[:-3],  # truncated frame
        zstandard.ZstdCompressor().compress(GOOD) + b"x",  # trailing bytes
        zstandard.ZstdCompressor().compress(GOOD) * 2,  # two frames
        bytes([0x28, 0xB5, 0x2F, 0xFD]),  # magic alone
    ],
    ids=["empty", "garbage", "truncated", "trailing", "two-frames", "magic-only"],
)
def test_corrupt_compressed_body_rejected(body):
    assert reason_of(pack(Kind.FRAME, body, flags=FLAG_ZSTD)) == "bad-compression"


def test_compressed_body_with_lying_size_rejected():
    body = bytearray(zstandard.ZstdCompressor().compress(orjson.dumps(BIG.to_json())))
    size = zstandard.frame_content_size(bytes(body))
    header_size = zstandard.frame_header_size(bytes(body))
    # The content size is the last field of the frame header (little-endian).
    field = 2 if size < 65536 + 256 else 4
    real = int.from_bytes(body[header_size - field : header_size], "little")
    body[header_size - field : header_size] = (real - 10).to_bytes(field, "little")
    assert reason_of(pack(Kind.FRAME, bytes(body), flags=FLAG_ZSTD)) == "bad-compression"


def test_compressed_json_errors_keep_their_reasons():
    for plain, reason in ((b"{", "bad-json"), (b'{"URL_set": {}}' + b" " * 300, "schema")):
        body = zstandard.ZstdCompressor().compress(plain)
        assert reason_of(pack(Kind.FRAME, body, flags=FLAG_ZSTD)) == reason


def test_welcome_and_register_offer():
    reg = Register("127.0.1.10", 1, "host", "127.0.1.10:7000", None, ("zstd", "lz4"))
    assert reg.to_json()["compress"] == ["zstd", "lz4"]
    assert decode_one(encode(reg)) == reg
    assert "compress" not in Register("127.0.1.10", 1, "host", "h:1").to_json()
    assert decode_one(encode(Welcome(("zstd",)))) == Welcome(("zstd",))
    assert decode_one(encode(Welcome())) == Welcome(())
    for obj in ({"compress": ["zstd", "lz4"]}, {"compress": ["ZSTD"]}, {}, {"compress": [], "x": 1}):
        assert reason_of(frame_bytes(json.dumps(obj).encode(), Kind.WELCOME)) == "schema"
    bad_offer = dict(reg.to_json(), compress=["zstd", "zstd"])
    assert reason_of(frame_bytes(json.dumps(bad_offer).encode(), Kind.REGISTER)) == "schema"


# --- deflate-stream: the decoder inflates what follows the switch ------------------------------

STREAM_MESSAGES = [Frame({f"http://s{i % 5}.test/p/{i}/{j}": 0 for j in range(i % 7)}, "127.0.1.10", 100 + i, 1)
                   for i in range(40)] + [Heartbeat("127.0.1.10", 1.5), Task(7, ("http://a.test/",))]


def _stream(messages) -> bytes:
    deflater = Deflater()
    return b"".join(deflater.compress(encode(m)) for m in messages)


@given(st.lists(st.integers(1, 300), min_size=1, max_size=60))
@settings(max_examples=60, deadline=None)
def test_deflate_stream_decodes_in_any_chunking(cuts):
    """A plain message, the switch, then a deflated stream, all fed in arbitrary pieces:
    start_inflate takes over the bytes after the switch that were already fed."""
    plain = encode(Status(True)) + encode(Welcome(("deflate-stream",)))
    data = plain + _stream(STREAM_MESSAGES)
    decoder, got, at = Decoder(), [], 0
    for cut in cuts * (len(data) // sum(cuts) + 1):
        decoder.feed(data[at : at + cut])
        at += cut
        for msg in decoder:
            got.append(msg)
            if type(msg) is Welcome:
                decoder.start_inflate()
        if at >= len(data):
            break
    assert got == [Status(True), Welcome(("deflate-stream",)), *STREAM_MESSAGES]
    assert decoder.pending == 0 and decoder.deflated_bytes == len(data) - len(plain)


def test_deflate_stream_inflates_only_what_the_next_message_needs():
    """A deflate bomb (40 MB of messages in ~100 KB) fed at once: taking one message
    inflates about one message and one INFLATE_STEP, not the whole stream."""
    big = encode(Task(1, tuple(f"http://bomb.test/{'a' * 180}/{j}" for j in range(100))))
    deflater = Deflater()
    data = b"".join(deflater.compress(big) for _ in range(2000))
    assert len(data) < len(big) * 2000 / 100
    decoder = Decoder()
    decoder.start_inflate()
    decoder.feed(data)
    tracemalloc.start()
    try:
        assert decoder.next_message() == decode_one(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000 < len(big) * 2000 / 20  # the whole stream is 40 MB
    assert decoder.pending > len(data) / 2  # the rest still waits, deflated


def _ended() -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return z.compress(encode(Status(True))) + z.flush(zlib.Z_FINISH) + b"more"


@pytest.mark.parametrize("data", [b"\xff\xfe not deflate", _ended()], ids=["invalid", "final-block"])
def test_deflate_stream_errors_are_bad_compression(data):
    decoder = Decoder()
    decoder.start_inflate()
    decoder.feed(data)
    with pytest.raises(ProtocolError) as err:
        list(decoder)
    assert err.value.reason == "bad-compression"
    with pytest.raises(ProtocolError):  # poisoned
        decoder.feed(b"x")
