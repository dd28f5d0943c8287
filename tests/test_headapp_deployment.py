"""An app shaped like Flower's ViT fine-tuning example (tests/headapp: a ViT's head federated on a frozen backbone,
Adam, random crops and flips, ``get_model(num_classes)``, a data loader that returns permuted tensors; its run
config names neither the optimiser nor the augmentation), deployed on 127.0.0.1 through ``fedvit tap`` and audited
with ``fedvit audit --model vithead.task:get_model --model-arg num_classes=10``: the head-only update maps onto
``heads.head``; the recipe is read from the app bundle the tap kept (Adam and the crop with their source lines), or,
without it, Adam is inferred from the update; label counts and membership are measured against their nulls, and
each node mapped to the other client's data (a control that holds no information about the mapped data) ends in
"no evidence" for membership. Controls: code that says SGD, or a tenth of the learning rate, does not fit the update,
and the figures that simulate it are withheld (with the check off, they are not: the mutation check).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_thirdparty_deployment import deploy, fedvit

pytestmark = [pytest.mark.deployment, pytest.mark.long]
APP = Path(__file__).parent / "headapp"
SIZES = {0: 64, 3: 80}  # partition-sizes "64,80": node partitions 0 and 3
NORMALISATION = ["--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]  # the app's ImageNet mean and std


def audit(captures: Path, out: Path, swap: bool, *extra: str, updates: int = 4) -> dict:
    manifests = [m for m in captures.glob("run-*/captures/round-*/node-*.json") if m.stem.split("-")[-1].isdigit()]
    sizes = {json.loads(m.read_text())["node"]: json.loads(m.read_text())["sent"]["metrics"]["metrics"]["num-examples"]
             for m in manifests}  # fmt: skip
    assert len(manifests) == updates and sorted(sizes.values()) == [64, 80], sizes
    mapping = [f"--partition={node}={next(p for p, n in SIZES.items() if (n == size) != swap)}"
               for node, size in sizes.items()]  # fmt: skip
    done = fedvit("audit", str(captures), "--out", str(out), "--model", "vithead.task:get_model", "--model-arg",
                  "num_classes=10", "--app-dir", str(APP), *NORMALISATION, "--data", "vithead_data:partition", *mapping,
                  "--decoy-partitions", "4-7", "--membership-references", "3", *extra, timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[-2000:])
    return json.loads((out / "audit.json").read_text())


def line_of(file: str, text: str) -> str:
    path = next(APP.rglob(file))
    return f"{file}:{next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)}"


def app_copy(folder: Path, old: str, new: str, file: str = "client_app.py") -> Path:
    """The head app's code with ``old`` replaced by ``new`` in its ``file`` (the ClientApp builds the optimiser):
    code that is not what the clients ran."""
    shutil.copytree(APP, folder, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
    source = folder / "vithead" / file
    assert old in source.read_text()
    source.write_text(source.read_text().replace(old, new))
    return folder


def test_a_head_fine_tuned_with_adam_and_crops_through_the_tap_is_audited_on_its_head(tmp_path):
    done, final, captures = deploy(tmp_path / "run", through_tap=True, app=APP)
    assert final.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert len(list((captures / "fabs").glob("*.fab"))) == 1  # the app bundle, kept once
    report = audit(captures, tmp_path / "audit", swap=False)
    assert "vithead.task:get_model(num_classes=10)" in report["model"]
    adam, crop = line_of("client_app.py", "torch.optim.Adam("), line_of("task.py", "AUGMENT = ")
    for row in report["updates"]:
        assert "; of heads only (2 of " in row["sent"] and row["sent"].startswith("weights")
        assert row["app-code"].startswith("the app bundle ") and "(the app bundle the tap kept)" in row["app-code"]
        assert f"optimiser adam (app code: {adam}, `torch.optim.Adam(…)`)" in row["recipe"]
        assert (f"augmentation random resized crop (scale 0.5–1) + horizontal flip (app code: RandomResizedCrop(32, "
                f"scale=(0.5, 1.0), antialias=True) {crop}") in row["recipe"]  # fmt: skip
        assert f"lr 0.001 (app code: {adam}, run config 'lr')" in row["recipe"]
        assert "trained heads (app code: " in row["recipe"] and "frozen backbone (app code: " in row["recipe"]
        assert row["recipe-fit"]["fits"] and row["recipe-fit"]["recipe"] == "Adam", row["recipe-fit"]
        # the backbone runs once per image and view: a bank of the client's crops and flips, its spread measured
        assert row["frozen-features"].startswith("the frozen layers' outputs computed once for"), row["frozen-features"]
        assert "a bank of 2 random views per image" in row["frozen-features"] and ": within the fit's margin" in row[
            "frozen-features"]
        labels = row["leakage"]["labels"]
        # under Adam the counts' relation (SGD's update) does not hold: estimated, their error beside, never judged
        assert labels["status"] == "estimated (unverified)" and labels["null-error"] is not None, labels
        assert labels["why"].startswith("the counts rest on SGD's update, which this one is not (the client's "
                                        "optimiser is adam"), labels  # fmt: skip
        membership = row["leakage"]["membership"]
        assert membership["status"] == "measured" and membership["null"]["auc"] is not None, membership
        assert membership["power"]["status"] == "measured", membership["power"]
        assert "unverified: the client's optimiser is adam" in row["attacks"]["labels (head-bias gradient)"]
    swapped = audit(captures, tmp_path / "swapped", swap=True)
    for row in swapped["updates"]:
        assert not row["leakage"]["membership"]["clears"], row["leakage"]["membership"]
    print(report["verdict-detail"], "|", swapped["verdict-detail"])
    assert swapped["verdict-detail"].startswith("no evidence at this budget"), swapped["verdict-detail"]

    # the first round's capture (both nodes' updates) for what follows: the same figures per update, half the audit
    first = tmp_path / "first-round"
    shutil.copytree(captures, first, ignore=shutil.ignore_patterns("round-0002"))
    # without its code (as capture_mod records it where no app folder is named): Adam inferred
    bare = tmp_path / "bare"
    shutil.copytree(first, bare, ignore=shutil.ignore_patterns("fabs"))
    inferred = audit(bare, tmp_path / "inferred", False, updates=2)
    for row in inferred["updates"]:
        assert row["app-code"].startswith("none: the tap kept no app bundle"), row["app-code"]
        assert row["recipe-fit"]["recipe"] in ("Adam", "AdamW") and row["recipe-fit"]["fits"], row["recipe-fit"]
        (optimiser,) = [p for p in row["recipe"].split("; ") if p.startswith("optimiser ")]
        assert optimiser.split()[1] in ("adam", "adamw") and "(inferred from the update: after the passes, SGD" in (
            optimiser), optimiser
        assert "inferred from the update" in row["attacks"]["labels (head-bias gradient)"]

    # controls: code that is not what the clients ran
    for name, old, new in (("sgd", "torch.optim.Adam(", "torch.optim.SGD("),
                           ("lr", 'lr=float(context.run_config["lr"]))', 'lr=float(context.run_config["lr"]) / 10)')):
        wrong = app_copy(tmp_path / f"app-{name}", old, new)
        control = audit(first, tmp_path / f"control-{name}", False, "--app", str(wrong), updates=2)
        assert_withheld(control)
        if name == "sgd":  # the mutation check: with the fit check off, the same capture gets every figure
            unchecked = audit(first, tmp_path / "unchecked", False, "--app", str(wrong), "--no-fit-check", updates=2)
            for row in unchecked["updates"]:
                assert not row["recipe-fit"]["fits"] and not row["recipe-fit"]["checked"]
                assert row["leakage"]["labels"]["status"] == "measured"
                assert row["leakage"]["membership"]["power"]["status"] == "measured"


def assert_withheld(report: dict) -> None:
    """A recipe that does not fit: every figure that simulates it withheld with that reason, no power claim, and a
    verdict no stronger than "no evidence"."""
    for row in report["updates"]:
        assert not row["recipe-fit"]["fits"], row["recipe-fit"]
        labels = row["leakage"]["labels"]
        assert labels["status"] == "not measured" and labels["why"].startswith("withheld: recipe does not fit"), labels
        power = row["leakage"]["membership"]["power"]
        assert power["status"] == "not measured" and power["why"].startswith("recipe does not fit"), power
        assert row["attacks"]["membership: shadow alignment"].startswith("not applicable: recipe does not fit")
    assert "could not have seen" not in report["verdict-detail"] and "could have seen" not in report["verdict-detail"]
    assert not report["verdict-detail"].startswith("LEAKS: labels"), report["verdict-detail"]
