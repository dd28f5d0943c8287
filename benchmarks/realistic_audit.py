"""Wall-clock of the audit of realistic updates, scoring included: the third-party app's CNN, 1,200 photograph-like
images of Dirichlet(0.5) classes, batch 32, 3 local epochs, SGD momentum 0.9 on no record, two rounds of one client
captured through fedvit's capture path and audited with ``--data`` (labels; membership against 8 shadow updates over
1,200 members and half the 2,400 decoy images, the power twin; image inversion refused) at the default budget; and
the client's membership over both rounds combined (its cost against the updates' own).

    uv run python -m benchmarks.realistic_audit   # writes docs/results/data/realistic-audit.csv
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from benchmarks.common import ROOT, write_csv

APP = ROOT / "tests" / "thirdparty_app"
sys.path.insert(0, str(APP))

from fedvit.audit.pipeline import AuditOptions, run_audit  # noqa: E402
from fedvit.audit.user_data import UserData  # noqa: E402
from fedvit.capture.writer import add_direction, capture_stem  # noqa: E402
from fedvit.observed.model_spec import ModelSpec  # noqa: E402

SIZE, EPOCHS, LR, ROUNDS = 1200, 3, 0.01, (1, 2)
OUT = ROOT / "docs" / "results" / "data" / "realistic-audit.csv"


def capture(root: Path) -> None:
    """Two train exchanges of the app as its ClientApp makes them (partition 3 of ``cnnapp_partitions.large``), the
    second from the model the first ended on."""
    from cnnapp.task import Net, train
    from cnnapp_partitions import large

    torch.manual_seed(0)
    model = Net()
    images, labels = large(3)
    for server_round in ROUNDS:
        config = ConfigRecord({"lr": LR, "local-epochs": EPOCHS, "server-round": server_round})
        instruction = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
                              dst_node_id=9, message_type="train")  # fmt: skip
        train(model, images, labels, EPOCHS, LR, 32, seed=server_round)
        metrics = MetricRecord({"train_loss": 1.0, "num-examples": len(labels)})
        reply = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                        reply_to=instruction)  # fmt: skip
        stem = capture_stem(root, 1, server_round, 9, "train")
        head = {"run-id": 1, "round": server_round, "node": 9, "observer": "benchmark",
                "run_config": {"batch-size": 32}}  # fmt: skip
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
        report = run_audit(root / "cap", root / "out", options)
        seconds = time.perf_counter() - started
    (client,) = report["clients"]
    rows = [{"update": u["update"], "images": u["examples"], "local steps": u["steps"], "audit s": u["seconds"],
             "label error": u["leakage"]["labels"].get("error"),
             "prior error": u["leakage"]["labels"].get("null-error"),
             "membership AUC": round(u["leakage"]["membership"]["auc"], 3),
             "membership null AUC": round(u["leakage"]["membership"]["null"]["auc"], 3),
             "power measured": u["leakage"]["membership"]["power"]["status"] == "measured"}
            for u in report["updates"]]  # fmt: skip
    rows.append({"update": f"client {client['client']}: {len(client['updates'])} rounds combined", "images": SIZE,
                 "local steps": None, "audit s": client["seconds"], "label error": None, "prior error": None,
                 "membership AUC": round(client["membership"]["auc"], 3),
                 "membership null AUC": round(client["membership"]["null"]["auc"], 3), "power measured": None})
    # fmt: skip
    for row in rows:
        print(row)
    updates = sum(u["seconds"] for u in report["updates"])
    print(f"{seconds:.1f} s in all; the combined verdict added {client['seconds']:.1f} s to the updates' "
          f"{updates:.1f} s ({client['seconds'] / updates:.0%})")  # fmt: skip
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
