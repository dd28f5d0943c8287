"""Test setup: one thread per xdist worker, and a Flower task identity so strategies can build messages outside
the runtime."""

import os
from pathlib import Path

import pytest
from flwr.supercore.task_identity import TaskIdentity
from packaging.version import Version

GROUPS_LOST_FROM = Version("9.2")  # pytest ignores the node ids xdist's loadgroup rewrites from this release on


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker (and every process it starts: Flower's, the audit's) computes on one thread:
    the workers already fill the cores, and two workers' thread pools on the same cores slow both (torch's threads
    spin while they wait). A pytest known to drop xdist's groups stops the run here, with one line."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and config.getoption("dist", "no") == "loadgroup" and (
        Version(pytest.__version__) >= GROUPS_LOST_FROM
    ):  # fmt: skip
        raise pytest.UsageError(
            f"pytest {pytest.__version__} drops pytest-xdist's test groups (--dist loadgroup), so tests that share a "
            f"deployment would run side by side: use the pytest uv.lock pins (< {GROUPS_LOST_FROM}; uv sync --frozen)"
        )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = "1"
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that must share one worker (one deployment, Docker stack or Ray cluster at a time) carry an
    ``xdist_group``; pytest-xdist's ``--dist loadgroup`` keeps them together by appending the group to their node
    id. A pytest that ignores that would spread them over the workers without a word: refuse to run instead (a
    backstop for a release not yet known to: it surfaces as xdist's INTERNALERROR, with this message in it).

    Tests marked ``long`` (minutes each) are collected first, in their order: xdist hands out work in collection
    order, so the longest start first and the workers end together instead of one finishing a long test alone."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("long") is None)  # stable: order kept within
    if not os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("loadgroup", False):  # set in workers
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} drops pytest-xdist's group of {lost[0]} (and {len(lost) - 1} more): "
            "grouped tests would run side by side; use the pytest uv.lock pins (uv sync --frozen)"
        )


@pytest.fixture(autouse=True)
def _client_state(tmp_path, monkeypatch):
    """Client-private files (mask seeds, locked masks) go to a per-test folder, never ~/.fedvit."""
    monkeypatch.setenv("FEDVIT_CLIENT_STATE", str(tmp_path / "client-state"))
    # An in-process run's partial run config lacks fedvit's capture.* keys, so capture_mod takes it for another
    # app and records to $FEDVIT_CAPTURE_DIR, else ./fedvit-captures: the checkout (it once ended up committed).
    monkeypatch.setenv("FEDVIT_CAPTURE_DIR", str(tmp_path / "captures"))


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1
    yield


_REPORTS_READ: dict[str, int] = {}  # audit.md / audit.html already checked in this worker → its mtime


@pytest.fixture(autouse=True)
def _reports_print_possible_figures(tmp_path_factory):
    """Every audit.md and audit.html a test (or a fixture before it) writes under pytest's temporary folders prints
    no AUC above 1 and no TPR above 100% (:func:`tests.report_checks.impossible_figures`)."""
    yield
    from tests.report_checks import impossible_figures

    for path in written_reports(tmp_path_factory.getbasetemp()):
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:  # removed by its test's own clean-up
            continue
        if _REPORTS_READ.get(path) == stamp:
            continue
        _REPORTS_READ[path] = stamp
        found = impossible_figures(Path(path).read_text(errors="replace"))
        assert not found, f"{path} prints figures no AUC or TPR can take: {found[:5]}"


NOT_REPORTS = {"site-packages", "__pycache__", "node_modules", ".git", "chromium-profile"}  # large trees, no report


def written_reports(root: os.PathLike) -> list[str]:
    """Every audit.md and audit.html under ``root`` (one walk, skipping installed environments and caches)."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in NOT_REPORTS and not d.startswith(".venv")]
        found += [os.path.join(folder, f) for f in files if f in ("audit.md", "audit.html")]
    return found
