"""Per-round latency: loopback deployment (TLS, SuperNode auth, process isolation) vs simulation.

The same tiny run (default model and data, FedSGD, 3 clients, central and federated evaluation every round) is
run once as a ``flwr run`` simulation and once against the loopback deployment of ``fedvit deploy loopback``.
Reported: median round time after round 1, its train and evaluate parts, and the import time of one ClientApp
process (deployment starts a fresh one per message).

Usage: uv run --frozen python benchmarks/deployment_latency.py [--rounds 4] [--clients 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from round_overhead import flwr_run, snapshot  # noqa: E402

from fedvit_app.deployment.loopback import LoopbackDeployment  # noqa: E402
from fedvit_app.flower_processes import private_superlink_env, stop_local_superlink  # noqa: E402


def round_times(run_dir: Path) -> dict[str, float]:
    rounds = [r for r in json.loads((run_dir / "metrics.json").read_text())["rounds"] if r["round"] >= 2]
    return {key: statistics.median(r[key] for r in rounds) for key in ("round-s", "train-s", "evaluate-s")}


def clientapp_import_s(repeats: int = 3) -> float:
    """Wall time of a fresh Python process importing the ClientApp (what each deployment message pays)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fedvit_app.client_app"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="fedvit-deploy-bench-"))
    app = snapshot(work / "app")
    out = work / "outputs"
    common = [f"out-dir='{out}'", f"num-server-rounds={args.rounds}", f"min-nodes={args.clients}"]
    results = {}

    print("[1/3] ClientApp import time ...", flush=True)
    import_s = clientapp_import_s()

    print("[2/3] simulation ...", flush=True)
    home = work / "flwr-home"
    env = private_superlink_env(home)
    try:
        flwr_run(app, env, args.clients, [*common, "run-name='simulation'"])
    finally:
        stop_local_superlink(home)
    results["simulation (Ray, 1 CPU per client)"] = round_times(out / "simulation")

    print("[3/3] loopback deployment ...", flush=True)
    with LoopbackDeployment(work / "loopback", args.clients) as deployment:
        done = deployment.run(app, [*common, "run-name='deployment'"])
    if done.returncode != 0:
        sys.exit(f"deployment run failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    results["loopback deployment (TLS, auth, process isolation)"] = round_times(out / "deployment")

    print(
        "\ncommand: uv run --frozen python benchmarks/deployment_latency.py "
        f"--rounds {args.rounds} --clients {args.clients}"
    )
    print("| runtime | round s | train s | evaluate s |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['round-s']:.2f} | {r['train-s']:.2f} | {r['evaluate-s']:.2f} |")
    print(f"\nClientApp process import (fresh interpreter, `import fedvit_app.client_app`): {import_s:.1f} s")


if __name__ == "__main__":
    main()
