"""The CPU figures of ``dedupnet sim``'s report: every process of the run, by role, per
page (dedupnet/harness/simcpu.py). The runs themselves are those of test_sim.py and
test_simproc.py, which check their reports with :func:`check_cpu_figures`."""

import pytest

from dedupnet.harness.report import format_report
from dedupnet.harness.simcpu import cpu_figures


def check_cpu_figures(report, roles: set[str]) -> None:
    """Plausible figures: every role has a positive one, the roles add up to the total,
    per page is the total over the requests the web answered, and the text shows them."""
    assert set(report.cpu_s) == roles
    assert all(s > 0 for s in report.cpu_s.values()), report.cpu_s
    assert report.cpu_total_s == pytest.approx(sum(report.cpu_s.values()), abs=0.005)
    assert report.cpu_total_ms_per_page == pytest.approx(report.cpu_total_s * 1000 / report.requests, rel=0.01)
    assert sum(report.cpu_ms_per_page.values()) == pytest.approx(report.cpu_total_ms_per_page, rel=0.01)
    text = format_report(report)
    assert "CPU per page" in text and all(f"{role} " in text for role in roles)


def test_roles_without_a_figure_are_left_out_and_the_rest_add_up():
    f = cpu_figures({"hosts": 1.5, "centers": None, "web": 0.25, "redis": 0.25}, 1000)
    assert f["cpu_s"] == {"hosts": 1.5, "web": 0.25, "redis": 0.25}
    assert f["cpu_total_s"] == 2.0 and f["cpu_total_ms_per_page"] == 2.0
    assert f["cpu_ms_per_page"] == {"hosts": 1.5, "web": 0.25, "redis": 0.25}


def test_no_figure_at_all_and_no_page_give_none():
    assert cpu_figures({}, 10)["cpu_total_s"] is None
    f = cpu_figures({"hosts": 1.0}, 0)
    assert f["cpu_total_s"] == 1.0 and f["cpu_total_ms_per_page"] is None and f["cpu_ms_per_page"] == {}
