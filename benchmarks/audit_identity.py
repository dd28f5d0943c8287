"""Same captures, same audit: the reports of two fedvit checkouts on one set of captures, compared field by field
(timings and temporary paths aside). For refactors that must not move a figure.

    uv run --frozen python -m benchmarks.audit_identity --captures /tmp/ident/captures --make
    uv run --frozen python -m benchmarks.audit_identity --captures /tmp/ident/captures \\
        --old /path/to/old-checkout --old-cli fedvit_app.cli --out /tmp/ident

``--make`` writes the captures with this checkout (a masked FedSGD run, a 2-epoch FedAvg run, both with ground
truth, and four exchanges of the third-party test app); each checkout then audits them (and runs a small
``--benchmark``) with its own environment (``<checkout>/.venv``) and command line module.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "thirdparty_app"
TIMING = {"seconds", "train-s", "compute-s"}
BUDGET = ["--iterations", "30", "--restarts", "1"]


def make_captures(out: Path) -> None:
    from flwr.supercore.task_identity import TaskIdentity

    from fedvit.core.config import Config
    from tests.helpers import run_in_process

    sys.path.insert(0, str(APP))
    from tests.test_app_audit import capture_exchange

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    base = Config().to_dict() | {"centralized-evaluation": False, "capture.enabled": True, "capture.ground-truth": True}
    run_in_process(base | {"num-server-rounds": 2, "batch-size": 2, "out-dir": str(out), "run-name": "fedsgd-masked",
                           "strategy": "masked-fedsgd", "mask.r": 0.2})  # fmt: skip
    run_in_process(base | {"num-server-rounds": 1, "batch-size": 4, "out-dir": str(out), "run-name": "fedavg",
                           "strategy": "fedavg", "local-epochs": 2, "lr": 0.05,
                           "data.synthetic-train-size": 60})  # fmt: skip
    for node, partition in ((11, 0), (12, 1), (13, 2), (14, 3)):
        capture_exchange(out / "thirdparty", node, partition)


def audit_all(checkout: Path, cli: str, captures: Path, out: Path) -> None:
    python = str(checkout / ".venv" / "bin" / "python")
    runs = {
        "fedsgd-masked": [str(captures / "fedsgd-masked")],
        "fedavg": [str(captures / "fedavg")],
        "thirdparty": [str(captures / "thirdparty"), "--model", "cnnapp.task:Net", "--app-dir", str(APP), "--data",
                       "cnnapp_partitions:partition", "--partition", "11=0", "--partition", "12=1", "--partition",
                       "13=2", "--partition", "14=3", "--decoy-partitions", "4-40"],  # fmt: skip
        "benchmark": ["--benchmark", "--images", "2", "--defences", "plain,encryption-paper"],
    }
    for name, args in runs.items():
        print(f"{checkout}: {name}", flush=True)
        subprocess.run([python, "-m", cli, "audit", *args, *BUDGET, "--out", str(out / name)], cwd=checkout,
                       check=True, capture_output=True)  # fmt: skip


def stripped(value):
    if isinstance(value, dict):
        return {k: stripped(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [stripped(v) for v in value]
    return "<temporary path>" if isinstance(value, str) and value.startswith("/tmp/") else value


def compare(old: Path, new: Path) -> int:
    differences = 0
    for name in ("fedsgd-masked", "fedavg", "thirdparty", "benchmark"):
        a, b = (json.loads((d / name / "audit.json").read_text()) for d in (old, new))
        for key in a.keys() | b.keys():
            if stripped(a.get(key)) != stripped(b.get(key)):
                differences += 1
                print(f"{name}: {key} differs")
        print(f"{name}: {len(a['rows'])} rows, {len(a['updates'])} updates compared")
    print("identical" if not differences else f"{differences} differences")
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--captures", type=Path, required=True)
    parser.add_argument("--make", action="store_true", help="write the captures with this checkout")
    parser.add_argument("--old", type=Path, help="the other checkout (with its own .venv)")
    parser.add_argument("--old-cli", default="fedvit.app.cli",
                        help="its command line module (fedvit_app.cli before 0.2)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/audit-identity"))
    args = parser.parse_args()
    if args.make:
        make_captures(args.captures)
    if args.old is not None:
        audit_all(args.old, args.old_cli, args.captures, args.out / "old")
        audit_all(ROOT, "fedvit.app.cli", args.captures, args.out / "new")
        sys.exit(1 if compare(args.out / "old", args.out / "new") else 0)


if __name__ == "__main__":
    main()
