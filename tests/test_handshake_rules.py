"""The handshake's rules, sans I/O (dedupnet/adapters/net/transport/handshake.py): who may
register as what, and which compression both ends use, decided without a socket.
The same rules over real TCP are tests/test_handshakes.py, test_auth.py and test_tls.py."""

from __future__ import annotations

import pytest

from dedupnet.adapters.net.transport.handshake import Accepted, ClientHandshake, Peer, Refused, ServerHandshake
from dedupnet.codec.auth import Keyring
from dedupnet.codec.errors import ProtocolError
from dedupnet.codec.messages import Register, Status, Welcome
from dedupnet.codec.wire import Decoder, encode

HOST = "127.0.9.10"


def register(role: str = "host", ip: str = HOST, compress: tuple[str, ...] | None = None) -> Register:
    return Register(ip, 9, role, f"{ip}:1", compress=compress)


def test_the_first_message_must_be_a_register_of_an_accepted_role_from_its_own_address():
    rules = ServerHandshake(("host", "center"), timeout=2.5)
    peer = Peer(HOST)
    assert isinstance(rules.judge(register(), peer), Accepted)
    verdicts = {
        "timeout": rules.judge(None, peer),
        "not-register": rules.judge(Status(True), peer),
        "bad-role": rules.judge(register("control"), peer),
        "source-mismatch": rules.judge(register(ip="127.0.9.11"), peer),
    }
    for reason, verdict in verdicts.items():
        assert isinstance(verdict, Refused) and (verdict.reason, verdict.error_reason) == (reason, reason)
    assert "2.5 s" in verdicts["timeout"].text
    assert isinstance(ServerHandshake(verify_source=False).judge(register(ip="127.0.9.11"), peer), Accepted)


def test_a_welcome_answers_only_an_offer_and_names_what_both_ends_use():
    peer = Peer(HOST)
    assert ServerHandshake().judge(register(), peer) == Accepted(register(), None, None, None)
    offered = register(compress=("zstd",))
    assert ServerHandshake().judge(offered, peer) == Accepted(offered, None, Welcome(("zstd",)), "zstd")
    assert ServerHandshake(compress=False).judge(offered, peer) == Accepted(offered, None, Welcome(()), None)


def test_a_register_must_carry_its_own_roles_key():
    lan, peers = Keyring.single(b"l" * 32, 1), Keyring.single(b"p" * 32, 2)
    rules = ServerHandshake(("host", "center"), keyrings={"host": lan, "center": peers})

    def judged(msg: Register, ring: Keyring):
        tags = rules.tags()
        decoder = Decoder(verify_tag=tags)
        decoder.feed(ring.sign(encode(msg)))
        return rules.judge(decoder.next_message(), Peer(HOST), tags)

    accepted = judged(register("center"), peers)
    assert isinstance(accepted, Accepted) and accepted.keyring is peers
    refused = judged(register("host"), peers)  # a host tagged with the peer key
    assert isinstance(refused, Refused) and refused.bad_tag and refused.keyring is None
    assert (refused.reason, refused.error_reason) == ("bad-input", "bad-tag")
    # Refused for another reason, the Error is tagged with the key that verified, so the client can read it.
    refused = judged(register("center", ip="127.0.9.11"), peers)
    assert refused.reason == "source-mismatch" and refused.keyring is peers


def test_the_client_offers_what_it_may_and_accepts_one_welcome_naming_it():
    assert ClientHandshake(register(), compress=True).register.compress is not None
    assert ClientHandshake(register(compress=("zstd",)), compress=False).register.compress is None
    client = ClientHandshake(register(), compress=True)
    assert client.welcome(Welcome(("zstd",))) == "zstd"
    with pytest.raises(ProtocolError, match="not asked"):
        client.welcome(Welcome(("zstd",)))  # a second one
    with pytest.raises(ProtocolError, match="not asked"):
        ClientHandshake(register(), compress=False).welcome(Welcome(()))
    with pytest.raises(ProtocolError, match="not offered"):
        ClientHandshake(register(compress=()), compress=True).welcome(Welcome(("zstd",)))
