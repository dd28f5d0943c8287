"""Does the recipe fit? The audit's fit check against controls, on the test apps deployed through ``fedvit tap``.

Three deployments on 127.0.0.1 through the tap (the deployment suite's harness), then ``fedvit audit`` on each
capture under recipes that are right and recipes that are not:

- the CNN of the quickstart-shaped app (SGD, momentum 0.9 in its code; 1,000 and 1,200 textures per client,
  Dirichlet(0.5) classes, batch 32, 1 local epoch), at lr 0.01 and, as a control, at lr 0.1;
- the ViT head of the app shaped like Flower's ViT example (Adam, random resized crops and flips in its code;
  64 and 80 images, batch 16, 2 rounds), whose run config names neither the optimiser nor the augmentation.

Every row is one audit of every update of a capture: the recipe as read (the app bundle the tap kept) or as a
control states it (``--recipe``), the fit's figures per update, whether it fits, and where the recipe fits the
label-count error against the prior's and the membership figures. The head app's last rows compare the recipe read
from the code with the one assumed without it (SGD, no augmentation; ``--no-fit-check`` so that its figures are
reported) and with the one inferred from the update (no code).

    uv run python -m benchmarks.recipe_fit   # writes docs/results/data/recipe-fit.csv (about 25 min on 2 cores)
    uv run python -m benchmarks.recipe_fit --model "vit head"   # only the head's rows re-measured, the CNN's kept
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, write_csv

OUT = ROOT / "docs" / "results" / "data" / "recipe-fit.csv"
CNN_RUN = 'partition-sizes="1000,1200" dirichlet-alpha=0.5 images="textures" batch-size=32 fraction-evaluate=0.0'
CNN_SIZES, HEAD_SIZES = {1000: 0, 1200: 3}, {64: 0, 80: 3}
CNN = ["--model", "cnnapp.task:Net", "--app-dir", str(ROOT / "tests" / "thirdparty_app"), "--data",
       "cnnapp_partitions:large", "--decoy-partitions", "4-7"]  # fmt: skip
HEAD = ["--model", "vithead.task:get_model", "--model-arg", "num_classes=10", "--app-dir", str(ROOT / "tests" /
        "headapp"), "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225", "--data", "vithead_data:partition",
        "--decoy-partitions", "4-7"]  # fmt: skip
# (model, capture, control, what the audit is told, --recipe and other flags)
CASES = [
    ("cnn", "lr 0.01", "right", "the code (SGD β 0.9, lr 0.01)", []),
    ("cnn", "lr 0.01", "wrong optimiser", "Adam", ["--recipe", "optimizer=adam"]),
    ("cnn", "lr 0.01", "wrong momentum", "SGD β 0", ["--recipe", "momentum=0"]),
    ("cnn", "lr 0.01", "augmentation declared, none used", "crops", ["--recipe", "augment=crop"]),
    ("cnn", "lr 0.01", "client at 1/10 the stated lr", "lr 0.1", ["--recipe", "lr=0.1"]),
    ("cnn", "lr 0.1", "right", "the code (SGD β 0.9, lr 0.1)", []),
    ("cnn", "lr 0.1", "client at 10x the stated lr", "lr 0.01", ["--recipe", "lr=0.01"]),
    ("vit head", "lr 0.001", "right", "the code (Adam, lr 0.001, crops and flips)", []),
    ("vit head", "lr 0.001", "wrong optimiser", "SGD β 0.9", ["--recipe", "optimizer=sgd", "--recipe",
                                                             "momentum=0.9"]),  # fmt: skip
    ("vit head", "lr 0.001", "wrong optimiser", "SGD β 0", ["--recipe", "optimizer=sgd", "--recipe", "momentum=0"]),
    ("vit head", "lr 0.001", "client at 10x the stated lr", "lr 0.0001", ["--recipe", "lr=0.0001"]),
    ("vit head", "lr 0.001", "augmentation missing", "no augmentation", ["--recipe", "augment=none"]),
    ("vit head", "lr 0.001", "assumed (no code)", "SGD (momentum estimated), no augmentation",
     ["--recipe", "optimizer=sgd", "--recipe", "augment=none", "--no-fit-check"]),
    ("vit head", "lr 0.001", "inferred (no code)", "nothing: the capture without its FAB", ["--bare"]),
]


def deploy(model: str, lr: str, workdir: Path) -> Path:
    """One deployment through the tap (tests/test_thirdparty_deployment.py's harness); returns the tap's folder."""
    from tests.test_headapp_deployment import APP as HEAD_APP
    from tests.test_thirdparty_deployment import APP as CNN_APP
    from tests.test_thirdparty_deployment import deploy as run

    if model == "cnn":
        done, final, captures = run(workdir, through_tap=True, rounds=1, extra=f"{CNN_RUN} lr={lr.split()[1]}",
                                    app=CNN_APP)  # fmt: skip
    else:
        done, final, captures = run(workdir, through_tap=True, app=HEAD_APP)
    if not final.exists():
        sys.exit(f"the {model} deployment failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return captures


def mapping(captures: Path, sizes: dict[int, int]) -> list[str]:
    """--partition NODE=P for each captured node, told apart by its number of images."""
    found = {}
    for manifest in captures.glob("run-*/captures/round-*/node-*.json"):
        if re.fullmatch(r"node-\d+", manifest.stem):
            record = json.loads(manifest.read_text())
            found[record["node"]] = sizes[record["sent"]["metrics"]["metrics"]["num-examples"]]
    return [f"--partition={node}={partition}" for node, partition in found.items()]


def audit(captures: Path, out: Path, args: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "fedvit.app.cli", "audit", str(captures), "--out", str(out), *args],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"fedvit audit failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads((out / "audit.json").read_text())


def rows_of(case: tuple, report: dict) -> list[dict]:
    model, capture, control, told, _ = case
    rows = []
    for update in report["updates"]:
        fit, labels = update["recipe-fit"] or {}, update["leakage"]["labels"]
        member = update["leakage"]["membership"]
        power = member.get("power") or {}
        (optimiser,) = [p for p in update["recipe"].split("; ") if p.startswith("optimiser ")] or ["optimiser —"]
        rows.append({
            "model": model, "capture": capture, "control": control, "told": told, "update": update["update"],
            "examples": update["examples"], "optimiser": optimiser.removeprefix("optimiser ").split(" (")[0],
            "simulated": fit.get("recipe"), "norm-ratio": round(fit.get("scale", float("nan")), 3),
            "cosine": round(fit.get("cosine", float("nan")), 3),
            "own-cosine": round(fit.get("own-cosine", float("nan")), 3),
            "cosine-bound": round(fit.get("cosine-bound", float("nan")), 3),
            "flatness-simulated": round(fit.get("flatness", [float("nan")] * 2)[0], 3),
            "flatness-observed": round(fit.get("flatness", [float("nan")] * 2)[1], 3),
            "fits": fit.get("fits"), "label-error": labels.get("error"), "prior-error": labels.get("null-error"),
            "labels": labels["status"], "membership-auc": member.get("auc"),
            "membership-null-auc": (member.get("null") or {}).get("auc"),
            "power": power.get("status"), "power-auc": (power.get("simulated") or {}).get("auc"),
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted({c[0] for c in CASES}),
                        help="re-measure only this model's cases; the other's rows are kept from the CSV")  # fmt: skip
    chosen = parser.parse_args().model
    cases = [c for c in CASES if chosen in (None, c[0])]
    rows = []
    if chosen is not None:
        if not OUT.is_file():
            sys.exit(f"--model {chosen} keeps the other rows of {OUT}, which does not exist: run without --model")
        with open(OUT, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["model"] != chosen]
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        captures = {key: deploy(*key, work / f"{key[0]}-{key[1]}".replace(" ", "-"))
                    for key in {(c[0], c[1]) for c in cases}}  # fmt: skip
        for k, case in enumerate(cases):
            model, capture, control, _, flags = case
            where = captures[model, capture]
            if "--bare" in flags:  # the same capture without the app bundle the tap kept
                bare = work / f"bare-{k}"
                shutil.copytree(where, bare, ignore=shutil.ignore_patterns("fabs"))
                where, flags = bare, [f for f in flags if f != "--bare"]
            sizes = CNN_SIZES if model == "cnn" else HEAD_SIZES
            base = (CNN if model == "cnn" else [*HEAD, "--membership-references", "3"]) + mapping(where, sizes)
            report = audit(where, work / f"audit-{k}", base + flags)
            rows += rows_of(case, report)
            print(f"{model} {capture} {control}: " + ", ".join(f"{r['simulated']} fits {r['fits']} (norm "
                  f"×{r['norm-ratio']}, cos {r['cosine']}/{r['cosine-bound']}, flat {r['flatness-simulated']}/"
                  f"{r['flatness-observed']})" for r in rows[-len(report['updates']):]), flush=True)  # fmt: skip
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
