"""Build the tutorial's capture and audit from scratch with the commands docs/tutorial.md shows, and write what the
page includes under docs/_static/tutorial/: the commands as run, the verdict, the head of audit.md, the pictures,
the timings and the capture's disk use.

    uv run --frozen python docs/build_tutorial.py                      # the page's run: 1,000 and 1,200 images
    uv run --frozen python docs/build_tutorial.py --sizes 100,120 --out /tmp/tutorial   # a quick run elsewhere

First, the page's opening: ``fedvit audit-app`` on the quickstart-shaped test app (tests/flower_idioms/quickstart),
the one command, whose own lines (what it read from the app, the verdict) go to audit-app.txt. Then it copies the
test app (tests/thirdparty_app: Flower's quickstart CNN, nothing of fedvit) to a work folder and runs there, in
order: a SuperLink, ``fedvit tap`` in front of it, two SuperNodes (partitions 0 and 1 of 2) dialling the
tap, ``flwr run``, then ``fedvit audit`` with each node mapped to the partition its reply's size shows. The ports are
the page's; the run fails if one is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "tests" / "thirdparty_app"
QUICKSTART = REPO / "tests" / "flower_idioms" / "quickstart"
STATIC = REPO / "docs" / "_static" / "tutorial"
LINK, TAP, NODES = 8000, 9100, (9094, 9095)
SIZES = "1000,1200"
LOADERS = {SIZES: "cnnapp_partitions:large", "100,120": "cnnapp_partitions:quick"}  # the app's loader per size
HEAD_LINES = 16  # audit.md's first lines on the page: the verdict and the per-client table


def run_config(sizes: str) -> str:
    return (f'num-server-rounds=1 partition-sizes="{sizes}" dirichlet-alpha=0.5 images="textures" batch-size=32 '
            "lr=0.01 local-epochs=1 fraction-evaluate=0.0")  # fmt: skip


def federation_commands(sizes: str) -> list[tuple[str, str]]:
    """(name, command) of the processes, in start order; the last one (``flwr run``) runs to its end."""
    return [
        ("superlink", f"flower-superlink --insecure --host 127.0.0.1 --port {LINK} "
                      "--disable-runtime-dependency-installation"),
        ("tap", f"fedvit tap --listen 127.0.0.1:{TAP} --upstream 127.0.0.1:{LINK} --out captures/"),
        *[(f"supernode-{p}", f"flower-supernode --insecure --superlink 127.0.0.1:{TAP} --port {port} "
                             f'--node-config "partition-id={p} num-partitions=2"') for p, port in enumerate(NODES)],
        ("run", f"flwr run . tapped --stream -c '{run_config(sizes)}'"),
    ]  # fmt: skip


def audit_command(partitions: dict[int, int], loader: str) -> str:
    """``fedvit audit`` with each node (its id read from the capture) mapped to its partition."""
    mapping = " ".join(f"--partition={node}={p}" for node, p in sorted(partitions.items(), key=lambda kv: kv[1]))
    return (f"fedvit audit captures/ --out audit/ --model cnnapp.task:Net --app-dir . --data {loader} "
            f"{mapping} --decoy-partitions 2-5")  # fmt: skip


def commands_text(sizes: str, partitions: dict[int, int], loader: str) -> str:
    """The shell lines the page shows (one terminal each for the long-running processes)."""
    lines = [command for _, command in federation_commands(sizes)]
    return "\n".join(lines + [audit_command(partitions, loader)]) + "\n"


def node_partitions(captures: Path, sizes: str) -> dict[int, int]:
    """Each captured node and its partition, told apart by the size its reply reports (``num-examples``)."""
    by_size = {int(n): p for p, n in enumerate(sizes.split(","))}
    if len(by_size) != 2:
        raise SystemExit(f"--sizes {sizes}: give two different sizes (they tell the nodes apart)")
    found = {}
    for manifest in sorted(captures.glob("run-*/captures/round-*/node-*.json")):
        if not manifest.stem.split("-")[-1].isdigit():
            continue  # evaluate exchanges
        head = json.loads(manifest.read_text())
        found[int(head["node"])] = by_size[int(head["sent"]["metrics"]["metrics"]["num-examples"])]
    if sorted(found.values()) != [0, 1]:
        raise SystemExit(f"the capture holds nodes {found}, not one per partition")
    return found


def disk_use(folder: Path) -> tuple[int, int]:
    files = [f for f in folder.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files), len(files)


def build(out: Path, work: Path, sizes: str, loader: str) -> dict:
    """Run the page's commands in ``work`` and write the page's files under ``out``; returns the facts."""
    app = work / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__", "captures", "audit"))
    home = work / "flwr-home"
    sys.path.insert(0, str(REPO / "src"))
    from fedvit.app.deployment.connection import add_connection
    from fedvit.app.deployment.loopback import wait_for_port

    add_connection(home, "tapped", f"127.0.0.1:{LINK}", None)
    bin_dir = str(Path(sys.executable).parent)  # this environment's fedvit, flwr and flower-* first
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
                        "PYTHONPATH": str(app), "OMP_NUM_THREADS": "1"}  # fmt: skip
    (work / "logs").mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    ports = {"superlink": LINK, "tap": TAP, "supernode-0": NODES[0], "supernode-1": NODES[1]}
    started = time.monotonic()
    try:
        *background, (_, run) = federation_commands(sizes)
        for name, command in background:
            log = work / "logs" / f"{name}.log"
            with open(log, "ab") as sink:
                procs.append(subprocess.Popen(shlex.split(command), cwd=app, env=env, stdout=sink,
                                              stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
            wait_for_port(ports[name], procs[-1], log)
            print(f"tutorial: {name} listening on 127.0.0.1:{ports[name]}", flush=True)
        done = subprocess.run(shlex.split(run), cwd=app, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"flwr run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        trained = time.monotonic() - started
    finally:
        for proc in reversed(procs):  # the tap last but one: it writes tap.json as it stops
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
    captures = app / "captures"
    partitions = node_partitions(captures, sizes)
    started = time.monotonic()
    audit = subprocess.run(shlex.split(audit_command(partitions, loader)), cwd=app, env=env, capture_output=True,
                           text=True, timeout=3600)  # fmt: skip
    if audit.returncode != 0:
        raise SystemExit(f"fedvit audit failed:\n{audit.stdout[-3000:]}\n{audit.stderr[-3000:]}")
    audited = time.monotonic() - started
    report = json.loads((app / "audit" / "audit.json").read_text())
    size, files = disk_use(captures)
    facts = {
        "sizes": sizes,
        "nodes": {str(node): p for node, p in partitions.items()},
        "run-seconds": round(trained, 1),
        "audit-seconds": round(audited, 1),
        "update-seconds": [u["seconds"] for u in report["updates"]],
        "capture-bytes": size,
        "capture-files": files,
        "verdict": report["verdict"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "commands.sh").write_text(commands_text(sizes, partitions, loader))
    (out / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    (out / "facts.md").write_text(facts_text(facts))
    head = (app / "audit" / "audit.md").read_text().splitlines()[2:HEAD_LINES]  # below the title
    head = [f"**{line[3:]}**" if line.startswith("## ") else line for line in head]  # no section of the page
    (out / "audit-head.md").write_text("\n".join(head).rstrip() + "\n")
    for name in ("audit.json", "audit.html", "membership-roc.png", "labels.png"):
        shutil.copyfile(app / "audit" / name, out / name)
    return facts


def audit_app_lines(work: Path, extra: list[str]) -> str:
    """``fedvit audit-app`` on a copy of the quickstart-shaped app: the lines it prints of its own (what it ran and
    read, the verdict, where the report went), without Flower's log stream."""
    app = work / "quickstart"
    shutil.copytree(QUICKSTART, app, ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = str(Path(sys.executable).parent)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(Path(bin_dir) / "fedvit"), "audit-app", *extra], cwd=app, env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"fedvit audit-app failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines, verdict = [], False
    for line in done.stdout.splitlines():
        verdict = verdict or line == "verdict:"
        if line.startswith("fedvit audit-app:") or verdict:
            lines.append(line.replace(str(work), "…"))
    return "$ fedvit audit-app\n" + "\n".join(lines) + "\n"


def facts_text(facts: dict) -> str:
    """The page's sentence on cost: the run, the audit per update, the capture's disk use."""
    per_update = ", ".join(f"{s:.0f} s" for s in facts["update-seconds"])
    return (f"The run took **{facts['run-seconds']:.0f} s** from the SuperLink's start to `flwr run`'s end; the "
            f"audit **{facts['audit-seconds']:.0f} s** on 2 CPU cores ({per_update} per update). The capture holds "
            f"**{facts['capture-bytes'] / 1e6:.1f} MB in {facts['capture-files']} files**.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=SIZES, choices=list(LOADERS), help="images of partition 0 and 1 "
                        "(default %(default)s)")
    parser.add_argument("--out", type=Path, default=STATIC, help="where the page's files go (default: the page's)")
    parser.add_argument("--work", type=Path, help="work folder (default: a temporary one, removed afterwards)")
    parser.add_argument("--audit-app-args", default="", help="extra flags for the opening's fedvit audit-app (a "
                        "test's smaller budget; the page's run gives none)")
    args = parser.parse_args(argv)
    if args.sizes not in LOADERS:
        raise SystemExit(f"--sizes {args.sizes}: the test app has loaders for {', '.join(LOADERS)} only")
    loader = LOADERS[args.sizes]
    work = args.work or Path(tempfile.mkdtemp(prefix="fedvit-tutorial-"))
    try:
        opening = audit_app_lines(work, shlex.split(args.audit_app_args))
        facts = build(args.out.resolve(), work, args.sizes, loader)
        (args.out / "audit-app.txt").write_text(opening)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
