"""Replays pytest-xdist's ``--dist loadgroup`` scheduling on 2 workers from measured test durations, to compare
collection orders without rerunning the suites: scopes (an ``xdist_group``, else one test) are queued largest first
(``loadscopereorder``; stable), each worker starts with one scope and takes the next whenever at most two of its
tests are left (xdist's ``LoadScopeScheduling``), and a test takes its measured time whatever runs beside it
(so pairing two heavy tests is not modelled). Each order is replayed as measured and over draws with every
duration scaled by an independent factor in [1 − noise, 1 + noise].

    uv run --frozen python -m benchmarks.xdist_replay [--draws 2000] [--noise 0.2]
    # reads docs/results/data/xdist-durations.csv, writes docs/results/data/xdist-replay.csv
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
from collections import OrderedDict

from benchmarks.common import ROOT, write_csv

DURATIONS = ROOT / "docs" / "results" / "data" / "xdist-durations.csv"
WORKERS = 2


def makespan(tests: list[tuple[str, str, float]], workers: int = WORKERS) -> float:
    """When the last worker finishes ``tests`` ((name, group or "", seconds) in collection order)."""
    scopes: OrderedDict[str, list[float]] = OrderedDict()
    for name, group, seconds in tests:
        scopes.setdefault(group or name, []).append(seconds)
    queue = OrderedDict(sorted(scopes.items(), key=lambda item: -len(item[1])))
    pending: list[list[float]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def assign(worker: int) -> None:
        if queue:
            pending[worker].extend(queue.popitem(last=False)[1])

    for worker in range(workers):
        assign(worker)
    for worker in range(workers):
        if len(pending[worker]) <= 2:
            assign(worker)
    while any(pending):
        worker = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w])
        clock[worker] += pending[worker].pop(0)
        if len(pending[worker]) <= 2:
            assign(worker)
    return max(clock)


def suite_tests(rows: list[dict[str, str]], order: str) -> list[tuple[str, str, float]]:
    """The suite's tests in ``order`` ("order before" or "order after"), a row of n tests as n equal ones."""
    tests = []
    for row in sorted(rows, key=lambda r: int(r[order])):
        n = int(row["tests"])
        tests += [(f"{row['test']} #{k}", row["group"], float(row["seconds"]) / n) for k in range(n)]
    return tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--noise", type=float, default=0.2)
    args = parser.parse_args()
    with open(DURATIONS, newline="") as f:
        rows = list(csv.DictReader(f))
    table = []
    for suite in dict.fromkeys(r["suite"] for r in rows):
        mine = [r for r in rows if r["suite"] == suite]
        rng = random.Random(0)
        factors = [{r["test"]: rng.uniform(1 - args.noise, 1 + args.noise) for r in mine} for _ in range(args.draws)]
        for order in ("order before", "order after"):
            tests = suite_tests(mine, order)
            noisy = [makespan([(n, g, s * f[n.rsplit(" #", 1)[0]]) for n, g, s in tests]) for f in factors]
            table.append({"suite": suite, "order": order.removeprefix("order "),
                          "sum of durations (s)": round(sum(s for _, _, s in tests)),
                          "makespan as measured (s)": round(makespan(tests)),
                          f"mean makespan, ±{args.noise:.0%} noise (s)": round(statistics.mean(noisy)),
                          "90th percentile (s)": round(statistics.quantiles(noisy, n=10)[8])})  # fmt: skip
            print(table[-1])
    write_csv(table, DURATIONS.with_name("xdist-replay.csv"))


if __name__ == "__main__":
    main()
