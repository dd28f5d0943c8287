"""Test setup: a Flower task identity so strategies can build messages outside the runtime."""

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture(autouse=True)
def _client_state(tmp_path, monkeypatch):
    """Client-private files (mask seeds, locked masks) go to a per-test folder, never ~/.fedvit."""
    monkeypatch.setenv("FEDVIT_CLIENT_STATE", str(tmp_path / "client-state"))


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1
    yield
