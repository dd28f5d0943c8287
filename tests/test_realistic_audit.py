"""The audit on the rounds people train: the third-party app (Flower's CNN and FedAvg, SGD momentum 0.9 in its code and
on no record) deployed through ``fedvit tap`` with 1,000 and 1,200 photograph-like images per client (the app's
``images="textures"``), Dirichlet(0.5) classes, batch 32, 1 and 3 local epochs. The replies must read as weights,
the label counts come within the method's benchmarked error and beyond the prior, membership (each image's gradient
against what the update holds beyond 8 shadow updates) clears its within-class null in AUC and TPR at 1% FPR, and
two controls that hold no information about the mapped client's data end in "no evidence": Flower's LocalDpMod at
large noise, and each node mapped to the other client's data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedvit.attacks.label_distribution import BENCHMARKED_ERROR
from tests.test_thirdparty_deployment import APP, PARTITIONS, deploy, fedvit

pytestmark = pytest.mark.deployment
SIZES = {PARTITIONS[0]: 1000, PARTITIONS[1]: 1200}  # partition-sizes "1000,1200": partition 3 takes the second
RUN = 'partition-sizes="1000,1200" dirichlet-alpha=0.5 images="textures" batch-size=32 lr=0.01'


def tapped(workdir: Path, extra: str) -> Path:
    done, final, captures = deploy(workdir, through_tap=True, rounds=1, extra=f"{RUN} {extra}")
    assert final.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return captures


def audit(captures: Path, out: Path, swap: bool = False) -> dict:
    """``fedvit audit`` with the user's data; each node mapped to its partition (or, ``swap``, to the other's)."""
    trains = [m for m in captures.glob("run-*/captures/round-*/node-*.json") if m.stem.split("-")[-1].isdigit()]
    assert len(trains) == 2
    mapping = []
    for manifest in trains:
        head = json.loads(manifest.read_text())
        size = head["sent"]["metrics"]["metrics"]["num-examples"]
        partition = next(p for p, n in SIZES.items() if n == size)
        if swap:
            partition = next(p for p in SIZES if p != partition)
        mapping.append(f"--partition={head['node']}={partition}")
    done = fedvit("audit", str(captures), "--out", str(out), "--model", "cnnapp.task:Net", "--app-dir", str(APP),
                  "--data", "cnnapp_partitions:large", *mapping, "--decoy-partitions", "4-7")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[-2500:])
    return json.loads((out / "audit.json").read_text())


def test_realistic_rounds_leak_their_label_distribution_and_the_controls_show_no_evidence(tmp_path):
    for epochs in (1, 3):
        report = audit(tapped(tmp_path / f"e{epochs}", f"local-epochs={epochs}"), tmp_path / f"audit-e{epochs}")
        assert "eavesdropper on the wire" in report["threat-model"]
        for u in report["updates"]:
            assert u["sent"].startswith("weights"), u["sent"]
            assert u["steps"] == epochs * -(-u["examples"] // 32)
            labels = u["leakage"]["labels"]
            assert labels["status"] == "measured" and labels["error"] <= BENCHMARKED_ERROR["cnn"][epochs], labels
            assert labels["clears"], labels  # far closer to the truth than the prior (Dirichlet classes)
            # one recipe: the app's momentum (on no record) estimated once, stated everywhere, assumed nowhere
            assert "momentum 0.9 estimated from the update" in u["attacks"]["labels (head-bias gradient)"]
            assert "momentum 0.9 (estimated from the update: simulated/observed head change" in u["recipe"]
            assert not [a for a in u["assumptions"] if a.startswith("momentum")], u["assumptions"]
            member = u["leakage"]["membership"]
            assert member["status"] == "measured" and member["members"] == u["examples"]
            assert member["reference"].startswith("the update beyond 8 shadow updates"), member
            assert member["auc"] > member["null"]["auc"], member
            assert u["leakage"]["images"]["status"] == "not measured"  # > 64 images: inversion not attempted
            assert u["attacks"]["gradient matching (optimisation, defence-aware)"].startswith(
                "not applicable: not attempted"
            )
        assert report["verdict"].startswith("LEAKS: labels beyond the null in 2 of 2 update(s)")
        # AUC and TPR at 1% FPR beyond their nulls in at least one client's update at either epoch count; every
        # update's AUC beyond its null (a client with half its images in one class singles out fewer members)
        cleared = [u for u in report["updates"] if u["leakage"]["membership"]["clears"]]
        assert cleared, report["verdict"]
        assert f"membership beyond the null in {len(cleared)} of 2" in report["verdict"]
        assert (tmp_path / f"audit-e{epochs}" / "membership-roc.png").exists()
        if epochs == 1:
            swapped = audit(tmp_path / "e1" / "captures", tmp_path / "audit-swapped", swap=True)
            assert swapped["verdict"].startswith("no evidence at this budget"), swapped["verdict"]

    noisy = audit(tapped(tmp_path / "dp", "local-epochs=1 local-dp-epsilon=0.1 local-dp-clip=1.0"), tmp_path / "dp-a")
    assert all(u["sent"].startswith("weights") for u in noisy["updates"])
    assert noisy["verdict"].startswith("no evidence at this budget"), noisy["verdict"]
