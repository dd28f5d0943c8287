"""The warm SuperExec executor: ClientApp tasks are forked (and reaped), everything else goes to Flower's."""

from __future__ import annotations

import time

from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult

from fedvit.app.deployment import warm_superexec
from fedvit.app.deployment.warm_superexec import ForkExecutor


class Fallback:
    def __init__(self) -> None:
        self.launched: list[ExecutionSpec] = []
        self.reconciled = 0

    def launch(self, spec):
        self.launched.append(spec)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        self.reconciled += 1

    def close(self) -> None:
        pass


def spec(task_type: TaskType, install: bool = False) -> ExecutionSpec:
    return ExecutionSpec(
        task_type=task_type,
        runtime_api_address="127.0.0.1:1",
        token="t",
        insecure=True,
        root_certificates_path=None,
        runtime_dependency_install=install,
        parent_pid=None,
        suppress_output=False,
        task_id=7,
    )


def test_only_clientapp_tasks_are_forked(tmp_path, monkeypatch):
    marker = tmp_path / "child-ran"

    def fake_task(task):  # runs in the forked child instead of Flower's run_clientapp
        marker.write_text(f"{task.task_id} {time.time()}")
        return 3

    monkeypatch.setattr(warm_superexec, "run_forked_clientapp", fake_task)
    fallback = Fallback()
    executor = ForkExecutor(fallback)
    assert executor.launch(spec(TaskType.SERVER_APP)).status == "accepted"
    assert executor.launch(spec(TaskType.CLIENT_APP, install=True)).status == "accepted"
    assert [s.task_type for s in fallback.launched] == [TaskType.SERVER_APP, TaskType.CLIENT_APP]
    assert not executor.children and not marker.exists()

    assert executor.launch(spec(TaskType.CLIENT_APP)).status == "accepted"
    assert len(fallback.launched) == 2 and len(executor.children) == 1
    deadline = time.monotonic() + 30
    while executor.children and time.monotonic() < deadline:
        executor.reconcile()
        time.sleep(0.05)
    assert not executor.children  # reaped
    assert marker.read_text().startswith("7 ")
    assert fallback.reconciled > 0


class PullCalled(Exception):
    pass


def test_forked_tasks_retry_their_object_pull_sooner_and_bad_values_stop_the_command(monkeypatch):
    import pytest
    from flwr.proto.message_pb2 import ObjectTree
    from flwr.supercore.inflatable import inflatable_utils

    seen = {}

    def recording_pull(object_ids, pull_object_fn, **kwargs):
        seen.update(kwargs, ids=object_ids)
        raise PullCalled

    pull = inflatable_utils.pull_and_inflate_object_from_tree
    monkeypatch.setattr(pull, "__kwdefaults__", dict(pull.__kwdefaults__))  # restored after the test
    monkeypatch.setattr(inflatable_utils, "pull_objects", recording_pull)
    previous = warm_superexec.set_object_pull_backoff(0.05, 0.2)
    assert previous == {"initial_backoff": 1, "backoff_cap": 10, "max_tries_per_object": 500}  # Flower's fixed ones
    with pytest.raises(PullCalled):  # the path run_clientapp takes: the new defaults reach Flower's pull
        pull(ObjectTree(object_id="m"), lambda _id: b"", lambda _id: None)
    assert seen["initial_backoff"] == 0.05 and seen["backoff_cap"] == 0.2 and seen["ids"] == ["m"]
    assert seen["max_tries_per_object"] is None and seen["max_time"] == 7200  # only Flower's time limit remains

    initial, cap = warm_superexec.PULL_BACKOFF_ENV["initial"], warm_superexec.PULL_BACKOFF_ENV["cap"]
    monkeypatch.delenv(initial, raising=False)
    monkeypatch.delenv(cap, raising=False)
    assert warm_superexec.pull_backoff() == (0.05, 0.2)
    monkeypatch.setenv(initial, "0.5")
    monkeypatch.setenv(cap, "1")
    assert warm_superexec.pull_backoff() == (0.5, 1.0)
    for bad in ("fast", "0", "60", "2"):  # 2 > the cap
        monkeypatch.setenv(initial, bad)
        with pytest.raises(SystemExit, match=initial):
            warm_superexec.pull_backoff()
