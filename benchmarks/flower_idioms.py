"""The test apps written in the idioms of Flower's own PyTorch examples (tests/flower_idioms), each run in this
process through its own ClientApp and ``capture_mod`` and audited with ``--model``, ``--data`` and ``--app``: what
the audit reads of each from its code alone and the verdict it gives. The advanced-pytorch-shaped app (a head kept
in ``context.state``) runs twice, from two seeds, to set two audits of equivalent runs side by side.

    uv run --frozen python -m benchmarks.flower_idioms

Writes docs/results/data/flower-idioms.csv (one row per audited update, and one for the Lightning-shaped app,
which trains and is captured, then refused in one line).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, write_csv

OUT = ROOT / "docs" / "results" / "data" / "flower-idioms.csv"
IDIOMS = {
    "quickstart": "Message API; `from … import train as train_fn`; `x.view(-1, 16 * 5 * 5)`; {img, label} batches",
    "legacy": "`client_fn` + NumPyClient; batch size only in `DataLoader(batch_size=32)`; grey {image, label}",
    "fl-dp-sa": "the legacy client with `fixedclipping_mod` + `secaggplus_mod`; central DP on the server",
    "stateful": "head kept in `context.state`; `RandomCrop(28, padding=4)` + flip; 2 rounds",
    "lightning": "LightningModule autoencoder: `configure_optimizers` (Adam), MSE `training_step`",
}


def short(source: str) -> str:
    """``sgd (app code: task.py:59, `torch.optim.SGD(…)`)`` → ``sgd (task.py:59)``: the value and the line that
    states it (the value alone where no line does)."""
    value, _, rest = source.partition(" (")
    line = re.search(r"[\w.]+\.py:\d+", rest)
    return f"{value} ({line.group(0)})" if line else value


def first_clause(text: str) -> str:
    return text.split("; ")[0] if text else ""


def labels_cell(update: dict[str, Any]) -> str:
    labels = update["leakage"]["labels"]
    if labels["status"] == "measured":
        return f"error {labels['error']:.1%} vs prior {labels['null-error']:.1%}"
    return f"{labels['status']}: {first_clause(labels.get('why') or labels.get('benchmarked-error', ''))}"[:160]


def membership_cell(update: dict[str, Any]) -> str:
    found = update["leakage"]["membership"]
    if found["status"] != "measured":
        return f"{found['status']}: {first_clause(found.get('why', ''))}"[:120]
    return f"AUC {found['auc']:.3f} vs null {found['null']['auc']:.3f}"


def rows_of(app: str, run: str, report: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
    """One row per audited update of ``report``."""
    out = []
    for update in report["updates"]:
        sources = dict(update["recipe-sources"])
        recipe = "; ".join(f"{key} {short(sources[key])}" for key in ("optimiser", "lr", "momentum", "batch-size",
                                                                       "epochs", "augmentation", "client state",
                                                                       "central DP") if key in sources)  # fmt: skip
        fit = update["recipe-fit"]
        out.append({
            "app": app, "example": example(app), "idioms": IDIOMS[app], "run": run, "update": update["update"],
            "recipe from the code": recipe,
            "recipe fit": "—" if fit is None else ("fits" if fit["fits"] else "does not fit") + (
                " (direction unresolved)" if fit.get("direction-unresolved") else ""),
            "labels": labels_cell(update), "membership": membership_cell(update),
            "verdict": " / ".join(report["verdict"].splitlines()), "seconds": round(seconds, 1),
        })  # fmt: skip
    return out


def example(app: str) -> str:
    from tests.idiom_harness import SHAPES

    return {"fl-dp-sa": "fl-dp-sa", "lightning": "quickstart-pytorch-lightning"}.get(app) or SHAPES[app].example


def audited(app: str, work: Path, seed: int = 0) -> list[dict[str, Any]]:
    """``app`` run and audited in ``work``."""
    from fedvit.audit.pipeline import AuditOptions, run_audit
    from fedvit.audit.user_data import UserData
    from fedvit.core.budget import AuditConfig
    from tests.idiom_harness import SHAPES, audit, fl_dp_sa_app, run_app, run_fl_dp_sa

    started = time.perf_counter()
    if app == "fl-dp-sa":
        folder = fl_dp_sa_app(work / "app")
        config = {"num-server-rounds": 2, "noise-multiplier": 0.1, "clipping-norm": 1.0, "num-sampled-clients": 3}
        run_fl_dp_sa(work / "cap", config)
        spec = SHAPES["legacy"].spec()
        budget = AuditConfig(iterations=5, restarts=1, max_seconds=20)
        data = UserData("tests.idiom_harness:legacy_partition", {str(1000 + p): p for p in range(3)},
                        tuple(range(3, 8)), str(SHAPES["legacy"].folder))  # fmt: skip
        report = run_audit(work / "cap", work / "out", AuditOptions(spec=spec, budget=budget, app=folder, data=data))
        report["updates"] = report["updates"][:1]  # the first round's aggregate: the one with a next broadcast
        rows = rows_of(app, "seed 0", report, time.perf_counter() - started)
        gap = report["secure-aggregation"]["rounds"][0]
        rows[0]["labels"] += (f"; aggregate vs next broadcast: RMS {gap['next-broadcast-rms-difference']:.4f}, "
                              f"expected σ·C/N {gap['central-dp-std']:.4f}")  # fmt: skip
        return rows
    shape = SHAPES[app]
    run_app(shape, work / "cap", rounds=2 if app == "stateful" else 1, seed=seed)
    report = audit(shape, work / "cap", work / "out")
    return rows_of(app, f"seed {seed}", report, time.perf_counter() - started)


def lightning_row(work: Path) -> dict[str, Any]:
    """The Lightning-shaped app: trained through its ClientApp (Lightning's Trainer) and captured, then refused by
    the audit in one line (its forward is no classifier's, its loss a reconstruction's)."""
    from fedvit.attacks.simulation import ModelInputError
    from fedvit.observed.app_code import load_app, read_code
    from tests.idiom_harness import LIGHTNING, SHAPES, audit, run_app

    started = time.perf_counter()
    shape = SHAPES["lightning"]
    run_app(shape, work / "cap")
    try:
        audit(shape, work / "cap", work / "out")
        refused = "not refused"
    except ModelInputError as err:
        refused = "refused: " + str(err).split("; ", 1)[-1]
    code = read_code(load_app(LIGHTNING), {"run config": shape.run_config})
    recipe = "; ".join(f"{key} {short(value.described())}" for key, value in code.values().items())
    return {"app": "lightning", "example": example("lightning"), "idioms": IDIOMS["lightning"], "run": "seed 0",
            "update": "2 captured", "recipe from the code": f"{recipe}; loss {short(code.loss.described())}",
            "recipe fit": "—", "labels": "—", "membership": "—", "verdict": refused,
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from flwr.supercore.task_identity import TaskIdentity  # messages outside a Flower run need an identity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for app, seed in (("quickstart", 0), ("legacy", 0), ("fl-dp-sa", 0), ("stateful", 0), ("stateful", 1)):
            print(f"flower idioms: {app} (seed {seed})", flush=True)
            rows += audited(app, Path(folder) / f"{app}-{seed}", seed)
        rows.append(lightning_row(Path(folder) / "lightning"))
    write_csv(rows, args.out)


if __name__ == "__main__":
    main()
