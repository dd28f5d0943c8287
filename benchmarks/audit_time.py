"""Wall-clock of the audit of one update, per reference update (``--case``), each captured through fedvit's capture
path and audited with ``--data`` and the app's code (the recipe read from it) at the default budget (labels,
membership against 8 shadow updates, the power twin; image inversion refused; report written):

- ``cnn``: the third-party app's CNN as Flower's quickstart writes it (``x.view``), 1,864 photograph-like images of
  Dirichlet(0.5) classes, batch 32, 1 local epoch (59 steps), SGD momentum 0.9 in its code. Target: at most 12 s.
- ``vit-b16``: torchvision's ViT-B/16 at 224 px with only ``heads`` trained, Adam and ``RandomResizedCrop((224,
  224))`` in the app's code (benchmarks/vitb16_app, shaped like Flower's ViT fine-tuning example), 64 images,
  batch 32, 1 epoch; the other client's 64 images are the auxiliary data and non-members. Target: at most 120 s.
- ``rounds``: the deployment suite's 5-round realistic audit (``tests/test_realistic_audit.py``, its rounds test)
  without the deployment: the same app, two IID clients of 150 and 180 photograph-like images, 5 rounds of 1 local
  epoch from FedAvg's mean, decoy partitions 4-23; 10 updates and each client's rounds combined. Target: at most
  60% of the time it took when the target was set (the recipe read from the code, before this benchmark).

``update s`` is the mean over the audit's updates; the label, membership and power columns are its first update's.

Each repeat is a fresh audit of the same capture in this process (the first pays the imports and the model build).

    uv run --frozen python -m benchmarks.audit_time [--case cnn|vit-b16|rounds|all] [--repeats 2] [--profile]
    # writes docs/results/data/audit-time.csv, and per stage of each case's last repeat audit-stages.csv
    # (--out, --stages-out: other files, e.g. one case before and after a change)
    # --search-steps K: the label estimate's class-mix search capped at K steps per start (the audit's cap is 5),
    # what a smaller budget saves; its files must be named with --out and --stages-out

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

from benchmarks.common import ROOT, search_caps, write_csv

APP = ROOT / "tests" / "thirdparty_app"
VIT_APP = ROOT / "benchmarks" / "vitb16_app"
sys.path.insert(0, str(APP))
sys.path.insert(0, str(VIT_APP))

from fedvit.audit.pipeline import AuditOptions, run_audit  # noqa: E402
from fedvit.audit.user_data import UserData  # noqa: E402
from fedvit.capture.writer import add_direction, capture_stem  # noqa: E402
from fedvit.observed.model_spec import ModelSpec  # noqa: E402

EPOCHS, LR, BATCH, PARTITION = 1, 0.01, 32, 0
OUT = ROOT / "docs" / "results" / "data" / "audit-time.csv"
STAGES_OUT = ROOT / "docs" / "results" / "data" / "audit-stages.csv"
STAGES = {  # the registry's call of each stage -> its name in the table
    "on_features": "frozen backbone's features (and view bank)",
    "recover_labels_and_momentum": "label search",
    "reference_updates": "shadow updates",
    "alignment_score": "shadow-alignment score",
    "candidate_losses": "loss scores (the candidates' losses)",
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


def write_exchange(root: Path, received: dict, sent: dict, examples: int, run_config: dict, server_round: int = 1,
                   node: int = 9) -> None:  # fmt: skip
    """One train exchange (by default round 1, node 9) as fedvit's capture path writes it."""
    config = ConfigRecord({"lr": float(run_config["lr"]), "local-epochs": int(run_config["local-epochs"]),
                           "server-round": server_round})  # fmt: skip
    instruction = Message(RecordDict({"arrays": ArrayRecord(received), "config": config}), dst_node_id=node,
                          message_type="train")  # fmt: skip
    metrics = MetricRecord({"train_loss": 1.0, "num-examples": examples})
    reply = Message(RecordDict({"arrays": ArrayRecord(sent), "metrics": metrics}), reply_to=instruction)
    stem = capture_stem(root, 1, server_round, node, "train")
    head = {"run-id": 1, "round": server_round, "node": node, "observer": "benchmark", "run_config": run_config}
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)


def capture_cnn(root: Path) -> tuple[int, AuditOptions]:
    """Partition 0 of ``cnnapp_partitions.flower`` trained as the app's ClientApp trains it; its audit options."""
    from cnnapp.task import Net, train
    from cnnapp_partitions import flower

    torch.manual_seed(0)
    model = Net()
    received = {n: t.clone() for n, t in model.state_dict().items()}
    images, labels = flower(PARTITION)
    train(model, images, labels, EPOCHS, LR, BATCH, seed=1)
    write_exchange(root, received, model.state_dict(), len(labels),
                   {"batch-size": BATCH, "lr": LR, "local-epochs": EPOCHS})  # fmt: skip
    data = UserData("cnnapp_partitions:flower", {"9": PARTITION}, decoy_partitions=(4, 5), app_dir=str(APP))
    return len(labels), AuditOptions(spec=ModelSpec("cnnapp.task:Net", app_dir=str(APP)), data=data, app=APP)


def capture_vit(root: Path) -> tuple[int, AuditOptions]:
    """Partition 0 of the ViT-B/16 app, its head trained as its ClientApp trains it (Adam, random resized crops);
    partition 1 (the other client's) is the audit's other data."""
    from vitb16.task import get_model, load_data, train

    config = {"num-classes": 10, "lr": 0.001, "local-epochs": 1, "batch-size": 32}
    model = get_model(config["num-classes"])
    received = {n: t.clone() for n, t in model.heads.state_dict().items()}
    images, labels = load_data(0)
    torch.manual_seed(1)
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=config["lr"])
    train(model, images, labels, optimizer, config["local-epochs"], config["batch-size"])
    write_exchange(root, received, model.heads.state_dict(), len(labels), config)
    data = UserData("vitb16_data:partition", {"9": 0}, decoy_partitions=(1,), app_dir=str(VIT_APP))
    spec = ModelSpec("vitb16.task:get_model", (3, 224, 224), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
                     app_dir=str(VIT_APP), args=(("num_classes", 10),))  # fmt: skip
    return len(labels), AuditOptions(spec=spec, data=data, app=VIT_APP)


ROUNDS, ROUNDS_SIZES = 5, {0: 150, 3: 180}  # the deployment suite's rounds run (cnnapp_partitions.medium)


def capture_rounds(root: Path) -> tuple[int, AuditOptions]:
    """Partitions 0 and 3 of ``cnnapp_partitions.medium`` over :data:`ROUNDS` rounds of 1 local epoch, each round
    from the example-weighted mean of the last (FedAvg), as the deployment suite's rounds test trains them; the
    audit options of that test (decoy partitions 4-23)."""
    from cnnapp.task import Net, train
    from cnnapp_partitions import medium

    torch.manual_seed(0)
    model = Net()
    data = {p: medium(p) for p in ROUNDS_SIZES}
    run_config = {"batch-size": BATCH, "lr": LR, "local-epochs": EPOCHS}
    for server_round in range(1, ROUNDS + 1):
        received = {n: t.clone() for n, t in model.state_dict().items()}
        sent = {}
        for node, (images, labels) in ((10 + p, data[p]) for p in ROUNDS_SIZES):
            client = Net()
            client.load_state_dict(received)
            train(client, images, labels, EPOCHS, LR, BATCH, seed=server_round * 100 + node)
            sent[node] = ({n: t.clone() for n, t in client.state_dict().items()}, len(labels))
            write_exchange(root, received, sent[node][0], len(labels), run_config, server_round, node)
        total = sum(n for _, n in sent.values())
        model.load_state_dict({k: sum(w[k] * n for w, n in sent.values()) / total for k in received})
    data = UserData("cnnapp_partitions:medium", {str(10 + p): p for p in ROUNDS_SIZES},
                    decoy_partitions=tuple(range(4, 24)), app_dir=str(APP))  # fmt: skip
    return sum(ROUNDS_SIZES.values()), AuditOptions(spec=ModelSpec("cnnapp.task:Net", app_dir=str(APP)), data=data,
                                                    app=APP)  # fmt: skip


CASES = {"cnn": capture_cnn, "vit-b16": capture_vit, "rounds": capture_rounds}


@contextlib.contextmanager
def search_capped(cap: int | None) -> Iterator[None]:
    """The label estimate's class-mix search capped at ``cap`` steps per start while inside (None: as it is)."""
    from fedvit.attacks import label_distribution

    kept = label_distribution.SEARCH_STEPS
    if cap is not None:
        label_distribution.SEARCH_STEPS = cap  # read by estimate() at each call
    try:
        yield
    finally:
        label_distribution.SEARCH_STEPS = kept


def audit_repeats(case: str, images: int, options: AuditOptions, root: Path, repeats: int, profiled: bool,
                  tag: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """``repeats`` fresh audits of the capture under ``root / "cap"`` (each into a folder of its own, named with
    ``tag``): a row per repeat, and the last one's stages."""
    rows, stages = [], []
    for repeat in range(1, repeats + 1):
        profile = cProfile.Profile() if profiled and repeat == repeats else None
        clock = StageClock()
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        with clock.installed():
            updates = run_audit(root / "cap", root / f"out{tag}-{repeat}", options)["updates"]
        update = updates[0]
        if profile is not None:
            profile.disable()
        stages = clock.rows(time.perf_counter() - started)
        rows.append({"case": case, "repeat": repeat, "images": images, "updates": len(updates),
                     "local steps": update["steps"],
                     "update s": round(sum(u["seconds"] for u in updates) / len(updates), 1),
                     "audit_captures s": round(time.perf_counter() - started, 1),
                     "recipe": update["recipe-fit"]["recipe"], "recipe fits": update["recipe-fit"]["fits"],
                     "label error": update["leakage"]["labels"].get("error"),
                     "membership": update["leakage"]["membership"]["status"],
                     "power": update["leakage"]["membership"]["power"]["status"]})  # fmt: skip
        print(rows[-1], flush=True)
        print("labels:", update["attacks"]["labels (head-bias gradient)"], flush=True)
        print("per update, membership AUC and label error:", [(round(u["leakage"]["membership"]["auc"], 4),
              u["leakage"]["labels"].get("error")) for u in updates], flush=True)  # fmt: skip
        print("frozen features:", update.get("frozen-features"), flush=True)
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    return rows, stages


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="print the 25 costliest functions of the last repeat")
    parser.add_argument("--out", type=Path, default=OUT, help="the per-repeat CSV written")
    parser.add_argument("--stages-out", type=Path, default=STAGES_OUT, help="the per-stage CSV written")
    parser.add_argument("--search-steps", default=None, help="cap the label estimate's class-mix search at these "
                        "Gauss-Newton steps per start, comma-separated, each audited in turn on the same capture "
                        "(default: the audit's own cap, no column for it)")  # fmt: skip
    args = parser.parse_args()
    caps = search_caps(parser, args.search_steps)
    if args.search_steps is not None and (args.out == OUT or args.stages_out == STAGES_OUT):
        parser.error("--search-steps times other budgets: name its files with --out and --stages-out")
    torch.set_num_threads(2)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Messages outside a Flower run
    rows, stage_rows = [], []
    for case in CASES if args.case == "all" else [args.case]:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            images, options = CASES[case](root / "cap")
            for cap in caps:
                with search_capped(cap):
                    found, stages = audit_repeats(case, images, options, root, args.repeats, args.profile, f"-{cap}")
                budget = {} if cap is None else {"search steps": cap}
                rows += [row | budget for row in found]
                stage_rows += [{"case": case, **budget, **row} for row in stages]
                for row in stages:
                    print(f"{case:8s} {row['stage']:45s} {row['seconds']:7.1f} s {row['share']:>5s}")
    write_csv(rows, args.out)
    write_csv(stage_rows, args.stages_out)


if __name__ == "__main__":
    main()
