import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupnet.codec.numbers import (
    MAX_HOST, MAX_NETWORK, MAX_NUMBER, MAX_SEQUENCE, host_id_from_ip, make_number, split_number,
)

networks = st.integers(0, MAX_NETWORK)
hosts = st.integers(0, MAX_HOST)
sequences = st.integers(0, MAX_SEQUENCE)


@given(networks, hosts, sequences)
def test_round_trip_and_range(network, host, seq):
    n = make_number(network, host, seq)
    assert 0 <= n <= MAX_NUMBER < 2**63
    assert split_number(n) == (network, host, seq)


@given(st.tuples(networks, hosts, sequences), st.tuples(networks, hosts, sequences))
def test_distinct_parts_give_distinct_numbers_ordered_by_sequence_first(a, b):
    na, nb = make_number(*a), make_number(*b)
    assert (na == nb) == (a == b)
    # Total order: sequence, then network, then host.
    assert (na < nb) == ((a[2], a[0], a[1]) < (b[2], b[0], b[1]))


@pytest.mark.parametrize("args", [(-1, 0, 0), (MAX_NETWORK + 1, 0, 0), (0, MAX_HOST + 1, 0), (0, 0, MAX_SEQUENCE + 1)])
def test_out_of_range_parts_are_refused(args):
    with pytest.raises(ValueError):
        make_number(*args)


def test_host_id_is_the_host_part_of_the_ip():
    assert host_id_from_ip("127.0.2.17", "127.0.2.0/24") == 17
    assert host_id_from_ip("10.1.3.4", "10.1.0.0/16") == 3 * 256 + 4
    with pytest.raises(ValueError, match="not in LAN"):
        host_id_from_ip("127.0.3.1", "127.0.2.0/24")
    with pytest.raises(ValueError, match="wider"):
        host_id_from_ip("10.1.3.4", "10.0.0.0/8")
