"""What SecAgg+ leaves to the server, as N grows: the same N clients (the third-party app's CNN, 100 and 120
photograph-like images of Dirichlet(0.5) classes per client, batch 32, one local epoch, SGD momentum 0.9 in its
code only) trained one FedAvg round through Flower's SecAgg+ (legacy workflow, ``secaggplus_mod``) and without it,
both captured by ``capture_mod`` and audited with ``--data`` (24 other partitions as non-members):

- without SecAgg+, each client's own update (label error and membership, mean over the clients);
- with SecAgg+, the aggregate the server rebuilds (label error of the survivors' union, membership of its images),
  and each client's own images in the aggregate (``membership-members``), beside what the audit could have seen of
  one client's images in a simulated aggregate of that N (the power twin).

    uv run --frozen python -m benchmarks.secagg_leakage [--sizes 2,5,10]
    # writes docs/results/data/secagg-leakage.csv
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, write_csv

sys.path.insert(0, str(ROOT))

from fedvit.audit.pipeline import AuditOptions, run_audit  # noqa: E402
from fedvit.audit.user_data import UserData  # noqa: E402
from fedvit.observed.model_spec import ModelSpec  # noqa: E402
from tests.secagg_harness import APP, Recipe, run_secagg  # noqa: E402

OUT = ROOT / "docs" / "results" / "data" / "secagg-leakage.csv"
DECOYS = 24  # partitions past the clients' as non-members, decoys and (half of them) the power twin's pool


def shares(n: int) -> tuple[int | float, int | float]:
    """SecAgg+'s share number and reconstruction threshold for ``n`` clients: Flower's example's 3 and 2 up to 5
    clients, 5 and 3 beyond; two clients share with both (Flower's fractions 1.0: its integers must exceed 2)."""
    if n <= 2:
        return 1.0, 1.0
    return (3, 2) if n <= 5 else (5, 3)


def audit(captures: Path, out: Path, n: int) -> dict:
    data = UserData("cnnapp_partitions:quick", {}, tuple(range(n, n + DECOYS)), str(APP))
    options = AuditOptions(spec=ModelSpec("cnnapp.task:Net", app_dir=str(APP)), data=data)
    return run_audit(captures, out, options)


def figures(update: dict) -> dict:
    """One update's label error (and the prior's), membership AUC and TPR (and their nulls), and its finding."""
    labels, member = update["leakage"]["labels"], update["leakage"]["membership"]
    at = "0.01" if member.get("tpr@0.01") is not None else "resolution"
    return {
        "label error": labels.get("error"),
        "prior error": labels.get("null-error"),
        "labels beyond null": labels.get("clears"),
        "membership AUC": member.get("auc"),
        "null AUC": member.get("null", {}).get("auc"),
        "TPR": member.get(f"tpr@{at}"),
        "at FPR": 0.01 if at == "0.01" else (member.get("operating-points") or {}).get("resolution", {}).get("fpr"),
        "membership beyond null": member.get("clears"),
        "recipe fits": (update.get("recipe-fit") or {}).get("fits"),
    }


def each_client(update: dict) -> list[dict]:
    """Each client's own images: in the aggregate (SecAgg+), else in its own update; with the power twin's."""
    found = update.get("membership-members") or {"own": update["leakage"]["membership"]}
    out = []
    for e in found.values():
        if e.get("status") != "measured":
            continue
        power = e.get("power") or {}
        twin = power.get("simulated") if power.get("status") == "measured" else None
        out.append({"client AUC": e["auc"], "client null AUC": e["null"]["auc"], "client beyond null": e["clears"],
                    "twin AUC": None if twin is None else twin["auc"],
                    "twin beyond null": None if twin is None else power["could-have-seen"]})  # fmt: skip
    return out


def mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return None if not values else float(np.mean(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,5,10", help="numbers of clients (default %(default)s)")
    args = parser.parse_args(argv)
    from cnnapp_partitions import quick
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # what a ServerApp process sets

    recipe = Recipe(load=quick, lr=0.01, epochs=1, batch=32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(v) for v in args.sizes.split(",")]:
            for secure in (False, True):
                root = Path(tmp) / f"{n}-{secure}"
                started = time.perf_counter()
                count, threshold = shares(n)
                run_secagg(root / "cap", num_nodes=n, rounds=1, num_shares=count, threshold=threshold,
                           recipe=recipe, secure=secure)  # fmt: skip
                report = audit(root / "cap", root / "out", n)
                found = [figures(u) for u in report["updates"]]
                row = {"clients": n, "view": "the aggregate (SecAgg+)" if secure else "each client (no SecAgg+)",
                       "updates audited": len(found)}  # fmt: skip
                for key in ("label error", "prior error", "membership AUC", "null AUC", "TPR", "at FPR"):
                    value = mean(found, key)
                    row[key] = None if value is None else round(value, 4)
                for key in ("labels beyond null", "membership beyond null", "recipe fits"):
                    row[key] = f"{sum(bool(f[key]) for f in found)} of {len(found)}"
                clients = [c for u in report["updates"] for c in each_client(u)]
                for key in ("client AUC", "client null AUC", "twin AUC"):
                    value = mean(clients, key)
                    row[key] = None if value is None else round(value, 4)
                row["clients beyond null"] = f"{sum(c['client beyond null'] for c in clients)} of {len(clients)}"
                twins = [c for c in clients if c["twin beyond null"] is not None]
                row["twin beyond null"] = f"{sum(c['twin beyond null'] for c in twins)} of {len(twins)}"
                row["seconds"] = round(time.perf_counter() - started, 1)
                print(row, flush=True)
                rows.append(row)
    write_csv(rows, OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
