"""Per-round latency: loopback deployment (TLS, SuperNode auth, process isolation) vs simulation vs Flower's floor.

The same tiny run (default model and data, FedSGD, N clients, central and federated evaluation every round) is
run as a ``flwr run`` simulation and against the loopback deployment of ``fedvit deploy loopback`` (warm
``fedvit-superexec`` executors; with ``--cold`` also Flower's plain ``flower-superexec``), and the same
deployment runs ``benchmarks/floor_app.py`` (a ClientApp that imports nothing heavy and replies at once: Flower's
own floor). Reported: median round time after round 1, fedvit's ratio to the floor, messages per round, the
time from a task's launch to the ClientApp handler in the deployment (Flower's transfer of the message included),
and the time from launch to the loaded ClientApp alone: forked from the warm parent, and in a fresh interpreter,
against a bare ``import torch``.

Usage: uv run --frozen python benchmarks/deployment_latency.py [--rounds 3] [--clients 3] [--cold]
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

from fedvit.app.client_app import REPORT_LAUNCH_ENV  # noqa: E402
from fedvit.app.deployment.loopback import LoopbackDeployment  # noqa: E402
from fedvit.app.flower_processes import private_superlink_env, stop_local_superlink  # noqa: E402


def round_times(run_dir: Path) -> dict:
    """Medians over rounds >= 2 of fedvit's metrics.json, and the messages of every round >= 1."""
    history = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    rounds = [r for r in history if r["round"] >= 2]
    keys = ("round-s", "launch-to-handler-s")
    out: dict = {key: statistics.median(r[key] for r in rounds) for key in keys if all(key in r for r in rounds)}
    out["messages"] = [r["messages"] for r in history if r["round"] >= 1]
    out["each"] = [r["round-s"] for r in rounds]
    return out


def import_s(statement: str, repeats: int = 3) -> float:
    """Median wall time of a fresh Python process running ``statement``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


LOAD_APP = (
    "from flwr.supercore.object_ref import load_app; load_app('fedvit.app.client_app:app', RuntimeError, {app!r})"
)


def cold_load_s(app: Path, repeats: int = 3) -> float:
    """A fresh interpreter loading the ClientApp as flwr-clientapp does (Flower's load_app from the app dir)."""
    return import_s(LOAD_APP.format(app=str(app)), repeats)


def warm_load_s(app: Path, repeats: int = 3) -> float:
    """fedvit-superexec's path: a preloaded parent forks; the child drops fedvit's modules and loads the ClientApp
    from the app dir. Median seconds from the fork to the loaded app (excludes Flower's message transfer)."""
    program = f"""
import os, sys, time
from fedvit.app.deployment.warm_superexec import DEFAULT_PRELOAD, PROJECT_PACKAGES, preload
preload(list(DEFAULT_PRELOAD))
times = []
for _ in range({repeats}):
    r, w = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        for name in [m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES]:
            del sys.modules[name]
        {LOAD_APP.format(app=str(app))}
        os.write(w, b"x")
        os._exit(0)
    os.read(r, 1)
    times.append(time.perf_counter() - start)
    os.waitpid(pid, 0)
print(sorted(times)[len(times) // 2])
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def deployment_run(app: Path, work: Path, clients: int, overrides: list[str], warm: bool = True) -> None:
    env = {REPORT_LAUNCH_ENV: "1"}
    with LoopbackDeployment(work, clients, client_env=env, warm_executor=warm) as deployment:
        done = deployment.run(app, overrides)
    if done.returncode != 0:
        sys.exit(f"deployment run failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")


def floor_app(dest: Path, overrides: list[str], packed: bool) -> Path:
    """A copy of the app whose ServerApp and ClientApp are benchmarks/floor_app.py, with the run's model shapes
    (``packed``: its ServerApp packs ArrayRecords as fedvit's does, else Flower's own message layout)."""
    from fedvit.app.run_config import resolved_run_config
    from fedvit.core.config import parse_config
    from fedvit.core.model import build_model, get_weights

    app = snapshot(dest)
    config = parse_config(resolved_run_config(app, overrides))
    weights = get_weights(build_model(config.model, config.data.synthetic_num_classes, config.seed))
    settings = {"shapes": {k: list(v.shape) for k, v in weights.items()}, "packed": packed}
    (app / "benchmarks" / "floor_settings.json").write_text(json.dumps(settings))
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    text = text.replace('serverapp = "fedvit.app.server_app:app"', 'serverapp = "benchmarks.floor_app:server"')
    text = text.replace('clientapp = "fedvit.app.client_app:app"', 'clientapp = "benchmarks.floor_app:client"')
    pyproject.write_text(text)
    return app


FLOOR = "Flower's floor (same deployment, ClientApp replying at once)"
FLOOR_PACKED = "Flower's floor with fedvit's packed ArrayRecords"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also run Flower's plain subprocess executor")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="fedvit-deploy-bench-"))
    app = snapshot(work / "app")
    out = work / "outputs"
    common = [f"out-dir='{out}'", f"num-server-rounds={args.rounds}", f"min-nodes={args.clients}"]
    results: dict[str, dict[str, float]] = {}
    steps = 6 if args.cold else 5

    print(f"[1/{steps}] import times (fresh interpreters) ...", flush=True)
    torch_s = import_s("import torch")
    client_s = cold_load_s(app)
    warm_s = warm_load_s(app)

    print(f"[2/{steps}] simulation ...", flush=True)
    home = work / "flwr-home"
    env = private_superlink_env(home)
    try:
        flwr_run(app, env, args.clients, [*common, "run-name='simulation'"])
    finally:
        stop_local_superlink(home)
    results["simulation (Ray, 1 CPU per client)"] = round_times(out / "simulation")

    print(f"[3/{steps}] loopback deployment, warm executor ...", flush=True)
    deployment_run(app, work / "loopback", args.clients, [*common, "run-name='deployment'"])
    results["loopback deployment (warm fedvit-superexec)"] = round_times(out / "deployment")

    for step, packed in ((4, False), (5, True)):
        name = FLOOR_PACKED if packed else FLOOR
        print(f"[{step}/{steps}] loopback deployment, {name} ...", flush=True)
        run_name = "floor-packed" if packed else "floor"
        floor_overrides = [*common, f"run-name='{run_name}'"]
        floor_dir = floor_app(work / f"{run_name}-app", floor_overrides, packed)
        deployment_run(floor_dir, work / f"loopback-{run_name}", args.clients, floor_overrides)
        floor = json.loads((out / run_name / "floor-rounds.json").read_text())["round-s"]
        results[name] = {
            "round-s": statistics.median(floor[1:]),
            "messages": [args.clients] * args.rounds,
            "each": floor[1:],
        }

    if args.cold:
        print(f"[6/{steps}] loopback deployment, Flower's subprocess executor (cold start per message) ...")
        deployment_run(app, work / "loopback-cold", args.clients, [*common, "run-name='cold'"], warm=False)
        results["loopback deployment (cold flower-superexec)"] = round_times(out / "cold")

    floor_s = results[FLOOR]["round-s"]
    print(
        "\ncommand: uv run --frozen python benchmarks/deployment_latency.py "
        f"--rounds {args.rounds} --clients {args.clients}{' --cold' if args.cold else ''}"
    )
    print("| runtime | round s (median) | rounds 2..N s | × floor | messages in rounds 1..N | launch → handler s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        launch = f"{r['launch-to-handler-s']:.2f}" if "launch-to-handler-s" in r else "–"
        messages = ", ".join(str(m) for m in r["messages"])
        ratio = f"{r['round-s'] / floor_s:.2f}" if "deployment" in name or "floor" in name else "–"
        each = ", ".join(f"{t:.1f}" for t in r["each"])
        print(f"| {name} | {r['round-s']:.2f} | {each} | {ratio} | {messages} | {launch} |")
    print(
        f"\nlaunch -> ClientApp loaded (Flower's load_app from the app dir): warm fork {warm_s:.2f} s, fresh "
        f"interpreter {client_s:.2f} s; a bare `import torch` {torch_s:.2f} s"
    )


if __name__ == "__main__":
    main()
