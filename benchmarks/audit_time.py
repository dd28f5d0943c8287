"""Wall-clock of one quickstart-sized update's audit: the third-party app's CNN, 1,864 photograph-like images of
Dirichlet(0.5) classes, batch 32, 1 local epoch (59 steps), SGD momentum 0.9 in its code and on no record, captured
through fedvit's capture path and audited with ``--data`` at the default budget (labels with the optimiser
inferred, membership against 8 shadow updates, the power twin; image inversion refused; report written). The
time target: at most 60 s on 2 cores. Each repeat is a fresh audit of the same capture in this process (the
first pays the imports and the model build).

    uv run --frozen python -m benchmarks.audit_time [--repeats 2] [--profile]
    # writes docs/results/data/audit-time.csv
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from benchmarks.common import ROOT, write_csv

APP = ROOT / "tests" / "thirdparty_app"
sys.path.insert(0, str(APP))

from fedvit.attacks.model_spec import ModelSpec  # noqa: E402
from fedvit.audit.pipeline import AuditOptions, run_audit  # noqa: E402
from fedvit.audit.user_data import UserData  # noqa: E402
from fedvit.capture.writer import add_direction, capture_stem  # noqa: E402

EPOCHS, LR, BATCH, PARTITION = 1, 0.01, 32, 0
OUT = ROOT / "docs" / "results" / "data" / "audit-time.csv"


def capture(root: Path) -> int:
    """One train exchange of the app as its ClientApp makes it (partition 0 of ``cnnapp_partitions.flower``);
    returns its image count."""
    from cnnapp.task import Net, train
    from cnnapp_partitions import flower

    torch.manual_seed(0)
    model = Net()
    images, labels = flower(PARTITION)
    config = ConfigRecord({"lr": LR, "local-epochs": EPOCHS, "server-round": 1})
    instruction = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
                          dst_node_id=9, message_type="train")  # fmt: skip
    train(model, images, labels, EPOCHS, LR, BATCH, seed=1)
    metrics = MetricRecord({"train_loss": 1.0, "num-examples": len(labels)})
    reply = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=instruction)
    stem = capture_stem(root, 1, 1, 9, "train")
    head = {"run-id": 1, "round": 1, "node": 9, "observer": "benchmark", "run_config": {"batch-size": BATCH}}
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)
    return len(labels)


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="print the 25 costliest functions of the last repeat")
    args = parser.parse_args()
    torch.set_num_threads(2)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Messages outside a Flower run
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images = capture(root / "cap")
        data = UserData("cnnapp_partitions:flower", {"9": PARTITION}, decoy_partitions=(4, 5), app_dir=str(APP))
        options = AuditOptions(spec=ModelSpec("cnnapp.task:Net", app_dir=str(APP)), data=data)
        for repeat in range(1, args.repeats + 1):
            profile = cProfile.Profile() if args.profile and repeat == args.repeats else None
            started = time.perf_counter()
            if profile is not None:
                profile.enable()
            (update,) = run_audit(root / "cap", root / f"out-{repeat}", options)["updates"]
            if profile is not None:
                profile.disable()
            rows.append({"repeat": repeat, "images": images, "local steps": update["steps"],
                         "update s": update["seconds"], "audit_captures s": round(time.perf_counter() - started, 1),
                         "recipe fits": update["recipe-fit"]["fits"],
                         "label error": update["leakage"]["labels"].get("error"),
                         "membership": update["leakage"]["membership"]["status"],
                         "power": update["leakage"]["membership"]["power"]["status"]})  # fmt: skip
            print(rows[-1], flush=True)
            print("labels:", update["attacks"]["labels (head-bias gradient)"], flush=True)
            if profile is not None:
                stats = pstats.Stats(profile).sort_stats("cumulative")
                stats.print_stats(25)
                stats.print_callees("attack_exchange|measure_all|alignment")
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
