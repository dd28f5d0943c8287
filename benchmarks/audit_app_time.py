"""How long ``fedvit audit-app`` takes on the quickstart-shaped test app (tests/flower_idioms/quickstart: Flower's
quickstart-pytorch idioms, 2 SuperNodes from its own federation, 1 round), run and audit together, with no flag
but ``--out``: the wall clock of the whole command and of its two phases (the captured simulation and reading the
app, until the first value read is printed; the audit), timed as the command's lines arrive.

    uv run --frozen python -m benchmarks.audit_app_time [--repeats 2]

Writes docs/results/data/audit-app-time.csv. Run it alone on the machine: it times wall clock.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, write_csv
from fedvit.app.flower_processes import flower_env

OUT = ROOT / "docs" / "results" / "data" / "audit-app-time.csv"
APP = ROOT / "tests" / "flower_idioms" / "quickstart"
TARGET_S = 180.0  # the line: run and audit together within 3 minutes on 2 cores


def timed_run(out: Path) -> dict[str, object]:
    """One ``fedvit audit-app`` of the test app into ``out``: seconds in all, to the audit's first line, and after."""
    cmd = [sys.executable, "-m", "fedvit.app.cli", "audit-app", str(APP), "--out", str(out)]
    start = time.perf_counter()
    audit_started = None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=flower_env())
    assert proc.stdout is not None
    verdict: list[str] = []
    for line in proc.stdout:
        if audit_started is None and line.startswith("fedvit audit-app: model:"):
            audit_started = time.perf_counter()
        if line.startswith("audit written to"):
            verdict.append("")  # the verdict block ends
        elif verdict and verdict[-1] != "" or line.strip() == "verdict:":
            verdict.append(line.strip())
    code = proc.wait()
    total = time.perf_counter() - start
    if code != 0 or audit_started is None:
        raise SystemExit(f"fedvit audit-app exited {code}")
    return {
        "app": "tests/flower_idioms/quickstart (2 SuperNodes, 1 round, 24 images each)",
        "total s": round(total, 1),
        "simulation and reading the app s": round(audit_started - start, 1),
        "audit s": round(total - (audit_started - start), 1),
        "within 180 s": "yes" if total <= TARGET_S else "no",
        "verdict": " ".join(v for v in verdict if v and v != "verdict:"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="audit-app-time-") as tmp:
            row = {"repeat": repeat + 1, **timed_run(Path(tmp) / "out")}
        print(row, flush=True)
        rows.append(row)
    write_csv(rows, args.out)


if __name__ == "__main__":
    main()
