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
