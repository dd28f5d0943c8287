"""The test setup itself: a pytest that would run grouped tests side by side stops the run with one line."""

import pytest

from tests import conftest


class LoadgroupConfig:
    """What the controller's config says under the suite's addopts (``--dist loadgroup``)."""

    def getoption(self, name: str, default: object = None) -> object:
        return "loadgroup" if name == "dist" else default


def test_a_pytest_that_drops_xdist_groups_stops_the_run_with_one_line(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the controller, where the run starts
    monkeypatch.setattr(pytest, "__version__", "9.2.0")
    with pytest.raises(pytest.UsageError, match=r"pytest 9\.2\.0 drops pytest-xdist's test groups .* \(< 9\.2;"):
        conftest.pytest_configure(LoadgroupConfig())
    monkeypatch.setattr(pytest, "__version__", "9.1.1")
    conftest.pytest_configure(LoadgroupConfig())  # the pinned release: the run goes on


class Item:
    """A collected test as :func:`conftest.costliest_first` reads it: its node id and its marks."""

    def __init__(self, nodeid: str, cost: float | None = None, group: str | None = None) -> None:
        self.nodeid = nodeid
        self.marks = {"cost": pytest.mark.cost(cost).mark} if cost is not None else {}
        if group is not None:
            self.marks["xdist_group"] = pytest.mark.xdist_group(group).mark

    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def test_the_costliest_modules_and_tests_start_first_and_a_group_keeps_its_order():
    items = [Item("a.py::cheap"), Item("b.py::one", 50, "g"), Item("b.py::two", 100, "g"), Item("c.py::x", 30),
             Item("c.py::y", 120), Item("d.py::z")]  # fmt: skip
    order = [item.nodeid for item in conftest.costliest_first(items)]
    # b and c tie (150: collection order), a module's tests together, a grouped module in its order, no cost last
    assert order == ["b.py::one", "b.py::two", "c.py::y", "c.py::x", "a.py::cheap", "d.py::z"]
