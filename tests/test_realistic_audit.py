"""The audit on the rounds people train: the third-party app (Flower's CNN and FedAvg, SGD momentum 0.9 in its code and
on no record) deployed through ``fedvit tap`` with 1,000 and 1,200 photograph-like images per client (the app's
``images="textures"``), Dirichlet(0.5) classes, batch 32, 1 and 3 local epochs. The replies must read as weights,
the label counts come within the method's benchmarked error and beyond the prior, membership (each image's gradient
against what the update holds beyond 8 shadow updates) clears its within-class null in AUC and TPR at 1% FPR, and
two controls that hold no information about the mapped client's data end in "no evidence": Flower's LocalDpMod at
large noise (its settings read from the run config as a claim the audit finds consistent), and each node mapped to
the other client's data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fedvit.attacks.label_distribution import BENCHMARKED_ERROR
from tests.report_checks import check_markdown
from tests.test_thirdparty_deployment import APP, PARTITIONS, deploy, fedvit

pytestmark = [pytest.mark.deployment, pytest.mark.long]
SIZES = {PARTITIONS[0]: 1000, PARTITIONS[1]: 1200}  # partition-sizes "1000,1200": partition 3 takes the second
# fraction-evaluate=0: the audit reads the train replies; evaluation rounds would only start more ClientApp processes
RUN = 'partition-sizes="1000,1200" dirichlet-alpha=0.5 images="textures" batch-size=32 lr=0.01 fraction-evaluate=0.0'


def tapped(workdir: Path, extra: str, run: str = RUN, rounds: int = 1) -> Path:
    done, final, captures = deploy(workdir, through_tap=True, rounds=rounds, extra=f"{run} {extra}")
    assert final.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return captures


def node_partitions(captures: Path, sizes: dict[int, int] = SIZES) -> dict[Path, int]:
    """Each captured train exchange's manifest and the partition that trained it (told apart by its size)."""
    trains = [m for m in captures.glob("run-*/captures/round-*/node-*.json") if m.stem.split("-")[-1].isdigit()]
    found = {}
    for manifest in trains:
        size = json.loads(manifest.read_text())["sent"]["metrics"]["metrics"]["num-examples"]
        found[manifest] = next(p for p, n in sizes.items() if n == size)
    return found


def audit(captures: Path, out: Path, swap: bool = False, sizes: dict[int, int] = SIZES, loader: str = "large",
          decoys: str = "4-7") -> dict:  # fmt: skip
    """``fedvit audit`` with the user's data; each node mapped to its partition (or, ``swap``, to the other's)."""
    nodes = {json.loads(manifest.read_text())["node"]: p for manifest, p in node_partitions(captures, sizes).items()}
    assert len(nodes) == 2
    mapping = []
    for node, partition in nodes.items():
        if swap:
            partition = next(p for p in sizes if p != partition)
        mapping.append(f"--partition={node}={partition}")
    # timeout: a hang guard (a 3-epoch audit takes ~5 min alone, longer beside another xdist worker)
    done = fedvit("audit", str(captures), "--out", str(out), "--model", "cnnapp.task:Net", "--app-dir", str(APP),
                  "--data", f"cnnapp_partitions:{loader}", *mapping, "--decoy-partitions", decoys,
                  timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[-2500:])
    return check_markdown(out)  # the report's first screen, and per-client rows that agree with the update rows


def assert_labels_and_membership_leak(report: dict, epochs: int, out: Path) -> None:
    """The realistic rounds' verdict: replies read as weights, label counts within the benchmarked error and beyond
    the prior, one recipe (the momentum read from the app's code, assumed nowhere, fitting the update), membership
    measured against its null."""
    assert "eavesdropper on the wire" in report["threat-model"]
    for u in report["updates"]:
        assert u["sent"].startswith("weights"), u["sent"]
        assert u["steps"] == epochs * -(-u["examples"] // 32)
        labels = u["leakage"]["labels"]
        assert labels["status"] == "measured" and labels["error"] <= BENCHMARKED_ERROR["cnn"][epochs], labels
        assert labels["clears"], labels  # far closer to the truth than the prior (Dirichlet classes)
        # one recipe: the app's momentum (on no record) read from its code in the bundle the tap kept, assumed nowhere
        assert "momentum 0.9 (app code: task.py:" in u["recipe"] and ", MOMENTUM = 0.9)" in u["recipe"], u["recipe"]
        assert "optimiser sgd (app code: task.py:" in u["recipe"], u["recipe"]
        assert ", momentum 0.9)" in u["attacks"]["labels (head-bias gradient)"]
        assert u["recipe-fit"]["fits"] and u["recipe-fit"]["recipe"] == "SGD β 0.9", u["recipe-fit"]
        assert not [a for a in u["assumptions"] if a.startswith(("momentum", "optimiser"))], u["assumptions"]
        member = u["leakage"]["membership"]
        assert member["status"] == "measured" and member["members"] == u["examples"]
        assert member["reference"].startswith("the update beyond 8 shadow updates"), member
        assert member["auc"] > member["null"]["auc"], member
        assert u["leakage"]["images"]["status"] == "not measured"  # > 64 images: inversion not attempted
        assert u["attacks"]["gradient matching (optimisation, defence-aware)"].startswith(
            "not applicable: not attempted"
        )
    assert not [r for r in report["rows"] if "reference" in r["attack"]]  # an image attack's null: none ran
    assert report["verdict-detail"].startswith("LEAKS: labels beyond the null in 2 of 2 update(s)")
    # AUC and TPR at 1% FPR beyond their nulls in at least one client's update at either epoch count; every
    # update's AUC beyond its null (a client with half its images in one class singles out fewer members)
    cleared = [u for u in report["updates"] if u["leakage"]["membership"]["clears"]]
    assert cleared, report["verdict-detail"]
    assert f"membership beyond the null in {len(cleared)} of 2" in report["verdict-detail"]
    assert (out / "membership-roc.png").exists()


# The longest test first: xdist hands out tests in collection order, and started last it ended the deployment suite
# about 2 minutes after the other worker (xdist's scheduling replayed on one CI run's durations).
ROUNDS_RUN = ('partition-sizes="150,180" dirichlet-alpha=0 images="textures" batch-size=32 lr=0.01 local-epochs=1 '
              'fraction-evaluate=0.0')
MEDIUM = {PARTITIONS[0]: 150, PARTITIONS[1]: 180}


def test_a_clients_rounds_combined_show_at_least_its_best_round(tmp_path):
    """Two IID clients (150 and 180 photograph-like images) over 5 rounds of 1 local epoch, through the tap: each
    client's membership over its 5 updates (each score's per-update ranks combined, against the same shuffles on
    every update) has an AUC at least its best single update's, and the report and verdict carry it."""
    captures = tapped(tmp_path / "rounds", "", ROUNDS_RUN, rounds=5)
    report = audit(captures, tmp_path / "audit", sizes=MEDIUM, loader="medium", decoys="4-23")
    assert len(report["updates"]) == 10 and len(report["clients"]) == 2, report["clients"]
    for client in report["clients"]:
        partition = int(client["client"].removeprefix("partition "))
        own = [u for u in report["updates"] if u["partition"] == partition]
        assert len(own) == 5 == len(client["updates"])
        best = max(u["leakage"]["membership"]["auc"] for u in own)
        combined = client["membership"]
        print(f"{client['client']}: combined AUC {combined['auc']:.3f} ({combined['score']}), best update {best:.3f}")
        assert combined["status"] == "measured" and combined["reference"].endswith("over 5 update(s)"), combined
        assert combined["auc"] >= best, (combined, [u["leakage"]["membership"]["auc"] for u in own])
    assert "membership over each client's updates beyond the null for" in report["verdict-detail"]


def test_one_epoch_rounds_leak_their_label_distribution_and_a_swapped_mapping_shows_no_evidence(tmp_path):
    report = audit(tapped(tmp_path / "e1", "local-epochs=1"), tmp_path / "audit-e1")
    assert_labels_and_membership_leak(report, 1, tmp_path / "audit-e1")
    swapped = audit(tmp_path / "e1" / "captures", tmp_path / "audit-swapped", swap=True)
    assert swapped["verdict-detail"].startswith("no evidence at this budget"), swapped["verdict-detail"]


def test_three_epoch_rounds_leak_their_label_distribution(tmp_path):
    report = audit(tapped(tmp_path / "e3", "local-epochs=3"), tmp_path / "audit-e3")
    assert_labels_and_membership_leak(report, 3, tmp_path / "audit-e3")


def test_rounds_under_flowers_local_dp_at_large_noise_show_no_evidence(tmp_path):
    """The app's LocalDpMod settings ride in its run config: the audit reads them as the claim (ε 0.1 per update),
    models the clipped and noised update in its shadows and power twin, and finds nothing against the claim."""
    noisy = audit(tapped(tmp_path / "dp", "local-epochs=1 local-dp-epsilon=0.1 local-dp-clip=1.0"), tmp_path / "dp-a")
    std = np.sqrt(2 * np.log(1.25 / 1e-5)) / 0.1  # LocalDpMod's, sensitivity 1
    for u in noisy["updates"]:
        assert u["sent"].startswith("weights")
        assert f"update clipping norm 1, then Gaussian noise of std {std:.3g} on every entry" in u["recipe"]
        privacy = u["leakage"]["membership"]["privacy"]
        assert privacy["claimed-epsilon"] == 0.1 and privacy["consistent"], privacy
        assert privacy["members"] == privacy["non-members"] > 300, privacy  # as many of each class on both sides
    assert noisy["verdict-detail"].startswith("no evidence at this budget"), noisy["verdict-detail"]
    assert "consistent with the claimed ε in 2 of 2" in noisy["verdict-detail"]


MEMORISING = ('partition-sizes="100,120" dirichlet-alpha=0 images="textures" batch-size=32 lr=0.01 local-epochs=10 '
              'fraction-evaluate=0.0')
SMALL = {PARTITIONS[0]: 100, PARTITIONS[1]: 120}


def test_a_memorising_client_is_caught_at_least_as_well_as_the_plain_loss_attack(tmp_path):
    """Small partitions (100 and 120 photograph-like images, IID) trained for 10 local epochs, through the tap: for each
    client the audit's membership AUC is at least the AUC of the plain loss-threshold attack on its sent weights
    (one threshold on the cross-entropy, computed here from the capture, on the candidates the audit scores), and
    the audit's figures clear their null, which accounts for the choice among its scores."""
    import torch
    import torch.nn.functional as F
    from sklearn.metrics import roc_auc_score

    from fedvit.attacks.reidentification import evenly_spaced
    from fedvit.audit.user_data import OTHERS
    from fedvit.capture.reader import load_exchanges

    captures = tapped(tmp_path / "memorising", "", MEMORISING)
    report = audit(captures, tmp_path / "audit", sizes=SMALL, loader="small", decoys="4-43")
    sys.path.insert(0, str(APP))
    from cnnapp.task import Net, normalize
    from cnnapp_partitions import small

    loaded = [small(p) for p in range(4, 44)]
    others = [np.concatenate(side) for side in zip(*loaded, strict=True)]
    keep = evenly_spaced(len(others[0]), OTHERS)[1::2]  # the half the audit scores (the other trains its shadows)
    others = [side[keep] for side in others]
    exchanges, _ = load_exchanges(captures)
    assert len(exchanges) == 2 == len(report["updates"])
    for ex in exchanges:
        partition = next(p for p, n in SMALL.items() if n == ex.sent_metrics["num-examples"])
        model = Net()
        model.load_state_dict({n: torch.as_tensor(w) for n, w in ex.sent.items()})
        model.eval()
        sides = [small(partition), others]
        with torch.no_grad():
            losses = [F.cross_entropy(model(normalize(torch.as_tensor(x))), torch.as_tensor(y), reduction="none")
                      for x, y in sides]  # fmt: skip
        is_member = np.r_[np.ones(len(sides[0][0])), np.zeros(len(sides[1][0]))]
        threshold_auc = roc_auc_score(is_member, -torch.cat(losses).numpy())
        update = next(u for u in report["updates"] if str(u["node"]) == str(ex.node))
        member = update["leakage"]["membership"]
        assert member["non-member-source"].startswith("the other half of"), member
        assert member["members"] == len(sides[0][0]) and member["non-members"] == len(keep), member
        print(f"node {ex.node}: audit AUC {member['auc']:.3f} ({member['score']}), loss threshold {threshold_auc:.3f}")
        assert member["scores"]["loss of the sent weights"]["auc"] == pytest.approx(threshold_auc, abs=1e-6)
        assert member["auc"] >= threshold_auc - 1e-9, member
        assert member["clears"], member
    detail = report["verdict-detail"]
    assert detail.startswith("LEAKS") and "membership beyond the null in 2 of 2" in detail
