"""Counters: a series is its name and its labels in any order; bad names are refused
every time, not only the first (the check runs once per series seen)."""

import pytest

from dedupnet.codec.counters import Counters


def test_labels_in_any_order_are_one_series():
    c = Counters()
    c.inc("fetch_errors", kind="timeout", site="a")
    c.inc("fetch_errors", 2, site="a", kind="timeout")
    c.inc("fetch_errors", kind="connect", site="a")
    assert c.get("fetch_errors", site="a", kind="timeout") == 3
    assert c.get("fetch_errors", kind="connect", site="a") == 1
    assert c.total("fetch_errors") == 4


@pytest.mark.parametrize("name, labels", [("bad name", {}), ("9lives", {}), ("ok", {"bad-label": 1}),
                                          ("ok", {"__reserved": 1})])
def test_bad_names_are_refused_each_time(name, labels):
    c = Counters()
    for _ in range(2):
        with pytest.raises(ValueError):
            c.inc(name, **labels)
    assert c.total(name) == 0
