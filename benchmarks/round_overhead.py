"""Round overhead of fedvit in Flower simulation.

Measures, in real ``flwr run`` simulations with the same ClientApp:
  1. FedSGD round wall time / the sampled clients' own compute time (tiny ViT and ViT-S/16 at 32 px);
  2. fedvit FedSGD and FedAvg round time / Flower's stock FedAvg on the same payload.

Usage: uv run python benchmarks/round_overhead.py [--rounds 20] [--clients 5] [--skip-vit-s]
The first round (Ray actor warm-up) is excluded; medians over the remaining rounds are reported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fedvit.app.flower_processes import private_superlink_env, stop_local_superlink  # noqa: E402

TINY: list[str] = []
VIT_S_32 = [
    "model.name='vit_small_patch16_224' model.img-size=32 model.patch-size=16 model.embed-dim=0 "
    "model.depth=0 model.num-heads=0"
]


def snapshot(dest: Path, stock: bool = False) -> Path:
    """A copy of the tracked files, so edits made while the benchmark runs cannot leak into it.

    With ``stock`` the copy's ServerApp is the stock-FedAvg baseline.
    """
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    if stock:
        pyproject = dest / "pyproject.toml"
        text = pyproject.read_text().replace(
            'serverapp = "fedvit.app.server_app:app"', 'serverapp = "benchmarks.stock_fedavg_app:app"'
        )
        pyproject.write_text(text)
    return dest


def flwr_run(app: Path, env: dict, clients: int, overrides: list[str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "fedvit.app.cli",
        "run",
        str(app),
        "--federation-config",
        f"num-supernodes={clients} client-resources-num-cpus=1",
    ]
    for o in overrides:
        cmd += ["-c", o]
    proc = subprocess.run(cmd, env=env, cwd=app, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--skip-vit-s", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="fedvit-bench-"))
    home = work / "flwr-home"
    env = private_superlink_env(home)
    ours = snapshot(work / "app")
    stock = snapshot(work / "stock-app", stock=True)
    out = work / "outputs"
    common = f"out-dir='{out}' num-server-rounds={args.rounds} centralized-evaluation=false fraction-evaluate=0.0"
    results = {}
    try:
        cases = [
            ("fedsgd tiny", ours, "fedsgd", TINY),
            ("fedavg tiny", ours, "fedavg", TINY),
            ("stock FedAvg, fedsgd clients", stock, "fedsgd", TINY),
            ("stock FedAvg, fedavg clients", stock, "fedavg", TINY),
        ]
        if not args.skip_vit_s:
            cases += [
                ("fedsgd ViT-S/16 32px", ours, "fedsgd", VIT_S_32),
                ("stock FedAvg, fedsgd clients, ViT-S/16 32px", stock, "fedsgd", VIT_S_32),
            ]
        for i, (name, app, strategy, model) in enumerate(cases):
            run_name = f"case{i}"
            print(f"[{i + 1}/{len(cases)}] {name} ...", flush=True)
            flwr_run(app, env, args.clients, [common, f"run-name='{run_name}' strategy='{strategy}'", *model])
            if app == stock:
                rounds = json.loads((out / run_name / "stock-rounds.json").read_text())["round-s"]
                results[name] = {"round_s": median_after_warmup(rounds)}
            else:
                hist = [r for r in json.loads((out / run_name / "metrics.json").read_text())["rounds"] if r["round"]]
                results[name] = {
                    "round_s": median_after_warmup([r["round-s"] for r in hist]),
                    "compute_sum_s": median_after_warmup([r["compute-s-sum"] for r in hist]),
                    "compute_max_s": median_after_warmup([r["compute-s-max"] for r in hist]),
                    "payload_up_mb": hist[-1]["bytes-up"] / 1e6,
                }
            print(f"    {results[name]}", flush=True)
    finally:
        stop_local_superlink(home)

    print(
        f"\ncommand: uv run python benchmarks/round_overhead.py --rounds {args.rounds} --clients {args.clients}"
        + (" --skip-vit-s" if args.skip_vit_s else "")
    )
    print(f"{'case':48s} {'round s':>8s} {'Σ compute':>9s} {'max comp':>9s} {'wall/Σ':>7s} {'wall/max':>8s}")
    for name, r in results.items():
        extra = ""
        if "compute_sum_s" in r:
            extra = (
                f" {r['compute_sum_s']:9.3f} {r['compute_max_s']:9.3f} {r['round_s'] / r['compute_sum_s']:7.2f}"
                f" {r['round_s'] / r['compute_max_s']:8.2f}"
            )
        print(f"{name:48s} {r['round_s']:8.3f}{extra}")
    pairs = [
        ("fedsgd tiny", "stock FedAvg, fedsgd clients"),
        ("fedavg tiny", "stock FedAvg, fedavg clients"),
        ("fedsgd ViT-S/16 32px", "stock FedAvg, fedsgd clients, ViT-S/16 32px"),
    ]
    for mine, theirs in pairs:
        if mine in results and theirs in results:
            print(f"{mine} / {theirs}: {results[mine]['round_s'] / results[theirs]['round_s']:.3f}")
    dest = ROOT / "benchmarks" / "results"
    dest.mkdir(exist_ok=True)
    (dest / "round_overhead.json").write_text(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
