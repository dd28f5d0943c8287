"""An app shaped like Flower's ViT fine-tuning example (tests/headapp: a ViT's head federated on a frozen backbone,
Adam, random crops and flips, ``get_model(num_classes)``, a data loader that returns permuted tensors), deployed on
127.0.0.1 through ``fedvit tap`` and audited with ``fedvit audit --model vithead.task:get_model --model-arg
num_classes=10``: the head-only update maps onto ``heads.head``, the recipe reads the optimiser and the augmentation
from the run config, label counts and membership are measured against their nulls, and each node mapped to the other
client's data (a control that holds no information about the mapped data) ends in "no evidence" for membership.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_thirdparty_deployment import deploy, fedvit

pytestmark = pytest.mark.deployment
APP = Path(__file__).parent / "headapp"
SIZES = {0: 64, 3: 80}  # partition-sizes "64,80": node partitions 0 and 3


def audit(captures: Path, out: Path, swap: bool) -> dict:
    manifests = [m for m in captures.glob("run-*/captures/round-*/node-*.json") if m.stem.split("-")[-1].isdigit()]
    sizes = {json.loads(m.read_text())["node"]: json.loads(m.read_text())["sent"]["metrics"]["metrics"]["num-examples"]
             for m in manifests}  # fmt: skip
    assert len(manifests) == 4 and sorted(sizes.values()) == [64, 80], sizes
    mapping = [f"--partition={node}={next(p for p, n in SIZES.items() if (n == size) != swap)}"
               for node, size in sizes.items()]  # fmt: skip
    done = fedvit("audit", str(captures), "--out", str(out), "--model", "vithead.task:get_model", "--model-arg",
                  "num_classes=10", "--app-dir", str(APP), "--data", "vithead_data:partition", *mapping,
                  "--decoy-partitions", "4-7", "--membership-references", "3", timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[-2000:])
    return json.loads((out / "audit.json").read_text())


def test_a_head_fine_tuned_with_adam_and_crops_through_the_tap_is_audited_on_its_head(tmp_path):
    done, final, captures = deploy(tmp_path / "run", through_tap=True, app=APP)
    assert final.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = audit(captures, tmp_path / "audit", swap=False)
    assert "vithead.task:get_model(num_classes=10)" in report["model"]
    for row in report["updates"]:
        assert "; of heads only (2 of " in row["sent"] and row["sent"].startswith("weights")
        assert "optimiser adam (run config)" in row["recipe"]
        assert "augmentation random resized crop (scale 0.5–1) + horizontal flip (run config)" in row["recipe"]
        assert "momentum — (adam: betas 0.9, 0.999" in row["recipe"]
        assert row["frozen-features"].startswith("the whole model runs: the client trains on random views")
        labels = row["leakage"]["labels"]
        assert labels["status"] == "measured" and labels["null-error"] is not None, labels
        membership = row["leakage"]["membership"]
        assert membership["status"] == "measured" and membership["null"]["auc"] is not None, membership
        assert membership["power"]["status"] == "measured", membership["power"]
        assert "unverified: the client's optimiser is adam" in row["attacks"]["labels (head-bias gradient)"]
    swapped = audit(captures, tmp_path / "swapped", swap=True)
    for row in swapped["updates"]:
        assert not row["leakage"]["membership"]["clears"], row["leakage"]["membership"]
    print(report["verdict"], "|", swapped["verdict"])
    assert swapped["verdict"].startswith("no evidence at this budget"), swapped["verdict"]
