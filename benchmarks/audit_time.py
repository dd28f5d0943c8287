"""Wall-clock of one quickstart-sized update's audit: the third-party app's CNN, 1,864 photograph-like images of
Dirichlet(0.5) classes, batch 32, 1 local epoch (59 steps), SGD momentum 0.9 in its code and on no record, captured
through fedvit's capture path and audited with ``--data`` at the default budget (labels with the optimiser
inferred, membership against 8 shadow updates, the power twin; image inversion refused; report written). The
time target: at most 60 s on 2 cores. Each repeat is a fresh audit of the same capture in this process (the
first pays the imports and the model build).

    uv run --frozen python -m benchmarks.audit_time [--repeats 2] [--profile]
    # writes docs/results/data/audit-time.csv, and per stage of the last repeat docs/results/data/audit-stages.csv

The stages (seconds and share of the audit): the label search, the shadow updates, the shadow-alignment score, the
loss scores' candidate losses, the membership judgement against its null, the power twin, the image inversion,
and the rest (reading the capture, scoring, the report). Each stage's own time: a stage that runs inside another
(the label search inside the label counts) is not counted twice.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
STAGES_OUT = ROOT / "docs" / "results" / "data" / "audit-stages.csv"
STAGES = {  # the registry's call of each stage -> its name in the table
    "recover_labels_and_momentum": "label search",
    "reference_updates": "shadow updates",
    "alignment_score": "shadow-alignment score",
    "candidate_losses_of": "loss scores (the candidates' losses)",
    "judge": "membership judgement (null)",
    "power": "power twin",
    "run_attack": "image inversion",
}


class StageClock:
    """Each stage's own wall-clock: the registry's call of it wrapped; time spent in a stage that runs inside
    another is that inner stage's only."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES.values(), 0.0)
        self._open: list[list[float]] = []  # per running stage: [start, time inside nested stages]

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from fedvit.audit import registry

        originals = {name: getattr(registry, name) for name in STAGES}
        for name, fn in originals.items():
            setattr(registry, name, self.timed(STAGES[name], fn))
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(registry, name, fn)

    def timed(self, stage: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            self._open.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, nested = self._open.pop()
                elapsed = time.perf_counter() - start
                self.seconds[stage] += elapsed - nested
                if self._open:
                    self._open[-1][1] += elapsed

        return run

    def rows(self, total: float) -> list[dict[str, Any]]:
        rest = total - sum(self.seconds.values())
        found = list(self.seconds.items()) + [("the rest (reading, scoring, report)", rest), ("the audit", total)]
        return [{"stage": name, "seconds": round(seconds, 1), "share": f"{seconds / total:.0%}"}
                for name, seconds in found]  # fmt: skip


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
            clock = StageClock()
            started = time.perf_counter()
            if profile is not None:
                profile.enable()
            with clock.installed():
                (update,) = run_audit(root / "cap", root / f"out-{repeat}", options)["updates"]
            if profile is not None:
                profile.disable()
            stages = clock.rows(time.perf_counter() - started)
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
    for row in stages:
        print(f"{row['stage']:40s} {row['seconds']:7.1f} s {row['share']:>5s}")
    write_csv(stages, STAGES_OUT)


if __name__ == "__main__":
    main()
