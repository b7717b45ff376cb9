"""The CPU figures of ``dedupnet sim``'s report: every process of the run, by role, per
page (dedupnet/harness/simcpu.py). The runs themselves are those of test_sim.py and
test_simproc.py, which check their reports with ``check_cpu_figures`` (tests/helpers.py)."""

from dedupnet.harness.simcpu import cpu_figures


def test_roles_without_a_figure_are_left_out_and_the_rest_add_up():
    f = cpu_figures({"hosts": 1.5, "centers": None, "web": 0.25, "redis": 0.25}, 1000)
    assert f["cpu_s"] == {"hosts": 1.5, "web": 0.25, "redis": 0.25}
    assert f["cpu_total_s"] == 2.0 and f["cpu_total_ms_per_page"] == 2.0
    assert f["cpu_ms_per_page"] == {"hosts": 1.5, "web": 0.25, "redis": 0.25}


def test_no_figure_at_all_and_no_page_give_none():
    assert cpu_figures({}, 10)["cpu_total_s"] is None
    f = cpu_figures({"hosts": 1.0}, 0)
    assert f["cpu_total_s"] == 1.0 and f["cpu_total_ms_per_page"] is None and f["cpu_ms_per_page"] == {}
