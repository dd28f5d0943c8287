"""Every figure, word and verdict of one realistic audit as JSON, to compare two commits of the audit (a refactor
must leave them identical): membership per update and per client (AUC, TPRs, nulls, whether they clear, the power
twin's figures), label and image evidence, the per-client findings and both verdicts.

    PYTHONPATH=. uv run --frozen python -m benchmarks.audit_figures --case rounds --out /tmp/new.json

For an older commit, run the same file from a worktree of it with that commit's source first on the path:
``git worktree add /tmp/old REV && cd /tmp/old && PYTHONPATH=/tmp/old/src:/tmp/old ../main/.venv/bin/python -m
benchmarks.audit_figures --out /tmp/old.json`` (copy this file there if the commit predates it), then
``diff /tmp/old.json /tmp/new.json``. The cases are :mod:`benchmarks.audit_time`'s. Where the report's schema
stays, :mod:`benchmarks.audit_identity` compares whole reports field by field; this compares the figures alone,
across a change of schema (#71's typed report moved keys, not figures).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.audit_time import CASES
from fedvit.audit.pipeline import run_audit

MEMBERSHIP = ("status", "auc", "tpr@0.001", "tpr@0.01", "tpr@resolution", "tpr@0.001-parametric", "null", "clears",
              "score", "members", "non-members", "fpr-resolution")  # fmt: skip
SCORE = ("auc", "tpr@0.01", "tpr@resolution", "null", "clears-null")


def membership(e: dict[str, Any]) -> dict[str, Any]:
    """A membership entry's figures as audit.json holds them (keys that every version of the report has)."""
    power = e.get("power") or {}
    simulated = power.get("simulated") or {}
    return {k: e.get(k) for k in MEMBERSHIP} | {
        "scores": {n: {k: s.get(k) for k in SCORE} for n, s in (e.get("scores") or {}).items()},
        "power": {"status": power.get("status"), "could-have-seen": power.get("could-have-seen"),
                  "observed-auc": power.get("observed-auc"), "simulated-auc": simulated.get("auc"),
                  "simulated-null": (simulated.get("null") or {}).get("auc")},
    }  # fmt: skip


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """The report's figures, words and verdicts."""
    return {
        "updates": [{"update": u["update"], "membership": membership(u["leakage"]["membership"]),
                     "labels": {k: u["leakage"]["labels"].get(k) for k in ("status", "error", "null-error", "clears")},
                     "images": {k: u["leakage"]["images"].get(k) for k in ("status", "top1", "null-top1", "clears")}}
                    for u in report["updates"]],
        "clients": [{"client": c["client"], "membership": membership(c["membership"])} for c in report["clients"]],
        "findings": [[f["client"], *[[f[k][part] for part in ("word", "figure", "null", "interval", "power")]
                                     for k in f if k not in ("client", "updates")]] for f in report["findings"]],
        "verdict": report["verdict"],
        "verdict-detail": report["verdict-detail"],
    }  # fmt: skip


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=list(CASES), default="rounds")
    parser.add_argument("--out", type=Path, required=True, help="the JSON written")
    args = parser.parse_args()
    torch.set_num_threads(2)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Messages outside a Flower run
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, options = CASES[args.case](root / "cap")
        report = run_audit(root / "cap", root / "out", options)
    args.out.write_text(json.dumps(figures(report), indent=1, sort_keys=True, default=str))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
