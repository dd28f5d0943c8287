"""Test setup: a Flower task identity so strategies can build messages outside the runtime."""

import pytest
from flwr.supercore.task_identity import TaskIdentity


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
