"""Wall-clock of the audit of one realistic update, scoring included: the third-party app's CNN, 1,200
photograph-like images of Dirichlet(0.5) classes, batch 32, 3 local epochs, SGD momentum 0.9 on no record, captured
through fedvit's capture path and audited with ``--data`` (labels; membership against 8 shadow updates over 1,200
members and half the 2,400 decoy images; image inversion refused) at the default budget.

    uv run python -m benchmarks.realistic_audit
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from benchmarks.common import ROOT

APP = ROOT / "tests" / "thirdparty_app"
sys.path.insert(0, str(APP))

from fedvit.attacks.model_spec import ModelSpec  # noqa: E402
from fedvit.audit.pipeline import AuditOptions, audit_captures  # noqa: E402
from fedvit.audit.user_data import UserData  # noqa: E402
from fedvit.capture.writer import add_direction, capture_stem  # noqa: E402

SIZE, EPOCHS, LR = 1200, 3, 0.01


def capture(root: Path) -> None:
    """One train exchange of the app as its ClientApp makes it (partition 3 of ``cnnapp_partitions.large``)."""
    from cnnapp.task import Net, train
    from cnnapp_partitions import large

    torch.manual_seed(0)
    model = Net()
    config = ConfigRecord({"lr": LR, "local-epochs": EPOCHS, "server-round": 1})
    instruction = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}), dst_node_id=9,
                          message_type="train")  # fmt: skip
    images, labels = large(3)
    train(model, images, labels, EPOCHS, LR, 32, seed=1)
    metrics = MetricRecord({"train_loss": 1.0, "num-examples": len(labels)})
    reply = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=instruction)
    stem = capture_stem(root, 1, 1, 9, "train")
    head = {"run-id": 1, "round": 1, "node": 9, "observer": "benchmark", "run_config": {"batch-size": 32}}
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    torch.set_num_threads(2)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Messages outside a Flower run
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        capture(root / "cap")
        data = UserData("cnnapp_partitions:large", {"9": 3}, decoy_partitions=(4, 5), app_dir=str(APP))
        options = AuditOptions(spec=ModelSpec("cnnapp.task:Net", app_dir=str(APP)), data=data)
        started = time.perf_counter()
        report = audit_captures(root / "cap", root / "out", options)
        seconds = time.perf_counter() - started
    update = report["updates"][0]
    print(f"one update of {update['examples']} images, {update['steps']} local steps: audited in {seconds:.1f} s "
          f"(labels, membership, scoring); leakage: {update['leakage']['labels']}, "
          f"membership AUC {update['leakage']['membership'].get('auc')}")  # fmt: skip


if __name__ == "__main__":
    main()
