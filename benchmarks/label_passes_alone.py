"""Whether the label estimate could skip its class-mix search on one-epoch updates (the search is most of the
quickstart CNN's audit time, #70): the passes' counts alone against the counts each search start ends at and the
counts the audit keeps, on :mod:`benchmarks.audit_time`'s one-epoch reference updates (``cnn``: one update of
1,864 images; ``rounds``: ten updates of 150 and 180 images over 5 rounds), audited as that benchmark audits them.

``label_mix_search.py`` measured the passes on 1,000-image clients of synthetic data, where one epoch's passes
were as good as the search. This checks the same claim on the audit's own reference updates, and (``--case
table``) on the one-epoch rows of ``label_distribution.py``'s table (the CNN and the tiny ViT, IID and five
Dirichlet(0.5) draws, 500 to 2,000 images; momentum unknown, as there), one row at a time on 2 threads. Times are
not reported (see ``audit_time.py``).

    uv run --frozen python -m benchmarks.label_passes_alone   # writes docs/results/data/label-passes-alone.csv
    uv run --frozen python -m benchmarks.label_passes_alone --case table   # label-passes-alone-table.csv (~25 min)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.audit_time import CASES
from benchmarks.common import ROOT, write_csv
from fedvit.attacks import label_distribution
from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.labels import label_accuracy
from fedvit.audit.pipeline import run_audit

OUT = ROOT / "docs" / "results" / "data" / "label-passes-alone.csv"
TABLE_OUT = ROOT / "docs" / "results" / "data" / "label-passes-alone-table.csv"


def truth_of(case: str, node: int) -> np.ndarray:
    """The true labels behind an update of ``case`` (the node's partition, as audit_time captured it)."""
    from cnnapp_partitions import flower, medium

    return flower(0)[1] if case == "cnn" else medium(node - 10)[1]


class Recorded:
    """Every class-mix search the label estimate runs while installed: its first start (the passes' counts) and
    what each start ended at."""

    def __init__(self) -> None:
        self.searches: list[tuple[np.ndarray, dict]] = []
        self._search = label_distribution.class_mix_search

    def __enter__(self) -> Recorded:
        def recording(*args: Any, **kwargs: Any) -> dict:
            found = self._search(*args, **kwargs)
            self.searches.append((np.array(args[3]), found))  # args[3]: the passes' counts, the first start
            return found

        label_distribution.class_mix_search = recording
        return self

    def __exit__(self, *exc: object) -> None:
        label_distribution.class_mix_search = self._search


def start_errors(passed: np.ndarray, found: dict, labels: np.ndarray) -> dict[str, float | None]:
    """The share of images misplaced by the passes' counts, by where each search start ended (None: the learned
    start was not searched) and by the counts the audit kept (the lower residual)."""
    error = lambda counts: round(1 - label_accuracy(counts, labels), 4)  # noqa: E731
    learned = found.get(label_distribution.FROM_LEARNED)
    return {"passes error": error(passed), "from passes error": error(found[label_distribution.FROM_PASSES].counts),
            "from learned error": None if learned is None else error(learned.counts),
            "kept error": error(found[label_distribution.lowest_residual(found)].counts)}  # fmt: skip


def case_rows(case: str) -> list[dict[str, Any]]:
    """One row per update of ``case``: the passes' error, each search start's, the kept counts' and the residuals."""
    with tempfile.TemporaryDirectory() as tmp, Recorded() as searches:
        _, options = CASES[case](Path(tmp) / "cap")
        updates = run_audit(Path(tmp) / "cap", Path(tmp) / "out", options)["updates"]
    recorded = searches.searches
    if len(recorded) != len(updates):
        raise RuntimeError(f"{case}: {len(recorded)} label searches for {len(updates)} updates")
    rows = []
    for update, (passed, found) in zip(updates, recorded, strict=True):
        labels = truth_of(case, int(update["node"]))
        first = found[label_distribution.FROM_PASSES]
        kept = found[label_distribution.lowest_residual(found)]
        rows.append({
            "case": case, "round": update["round"], "node": update["node"], "images": len(labels),
            "local epochs": 1, **start_errors(passed, found, labels),
            "report's error": round(update["leakage"]["labels"]["error"], 4),
            "spread at the passes": None if first.spread is None else round(first.spread, 3),
            "kept residual": round(kept.residual, 3), "searched": not first.settled,
            "search residuals": sum(f.simulations for f in found.values()),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def table_rows() -> list[dict[str, Any]]:
    """One row per one-epoch row of label_distribution.py's table: the error of each start and of the kept counts,
    and which start the audit kept."""
    from benchmarks.label_distribution import DRAWS, PARTITIONS, SIZES, client_update, models

    specs = models()
    cases = [(name, split, size, seed) for name in specs for split in PARTITIONS for size in SIZES
             for seed in DRAWS[split]]  # label_distribution.py's order
    rows = []
    for name, partition, size, seed in cases:
        obs, (_, labels), others = client_update(specs[name], 1, size, partition, seed)
        with Recorded() as recorded:
            label_distribution.estimate(obs, Auxiliary(*others, "2,000 other images"), seed)
        ((passed, found),) = recorded.searches
        kept = label_distribution.lowest_residual(found)
        rows.append({"model": name, "partition": partition, "client seed": seed, "images": size,
                     **start_errors(passed, found, labels),
                     "kept start": "learned" if kept == label_distribution.FROM_LEARNED else "passes"})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=["cnn", "rounds", "all", "table"], default="all")
    parser.add_argument("--out", type=Path, help="the CSV written (default: by case)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Messages outside a Flower run
    if args.case == "table":
        write_csv(table_rows(), args.out or TABLE_OUT)
        return
    rows = [row for case in (["cnn", "rounds"] if args.case == "all" else [args.case]) for row in case_rows(case)]
    write_csv(rows, args.out or OUT)


if __name__ == "__main__":
    main()
