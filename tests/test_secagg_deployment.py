"""SecAgg+ through the tap: the third-party app in the shape of Flower's secure-aggregation example (legacy
workflow, ``SecAggPlusWorkflow`` and ``secaggplus_mod``; cnnapp's CNN and SGD momentum 0.9) on three SuperNodes,
two rounds. Every stage of every node is in the capture; the audit exits 0, names SecAgg+, computes no per-client
figure from a masked vector, rebuilds each round's aggregate equal to the server's, and its verdict speaks of the
aggregate."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from fedvit.audit.secagg import rebuild, secagg_rounds
from fedvit.capture.reader import load_exchanges
from tests.report_checks import check_markdown
from tests.test_thirdparty_deployment import APP, deploy, fedvit

pytestmark = [pytest.mark.deployment, pytest.mark.long]
PARTITIONS = (0, 1, 2)  # partition-sizes "1,2,3,4": 1, 2 and 3 images
STAGES = 4  # setup, share keys, collect masked vectors, unmask


def secagg_copy(tmp_path):
    """The app folder with its SecAgg+ server and client apps as its components."""
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text().replace('"cnnapp.server_app:app"', '"cnnapp.secagg_server_app:app"')
    pyproject.write_text(text.replace('"cnnapp.client_app:app"', '"cnnapp.secagg_client_app:app"'))
    return app


def test_secagg_through_the_tap_is_kept_whole_and_audited_as_the_aggregate(tmp_path):
    done, final, captures = deploy(tmp_path / "run", through_tap=True, rounds=2, app=secagg_copy(tmp_path),
                                   partitions=PARTITIONS, extra="secagg-nodes=3 fraction-evaluate=0.0")  # fmt: skip
    assert final.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    stats = json.loads((captures / "tap.json").read_text())["records"]
    assert stats["seen-received"] == stats["received"] == stats["seen-sent"] == stats["sent"] == 2 * 3 * STAGES
    exchanges, skipped = load_exchanges(captures)
    rounds, rest = secagg_rounds(exchanges)
    assert rest == [] and skipped == [] and len(rounds) == 2
    for found in rounds:
        assert all(len(stages) == STAGES for stages in found.stages.values()) and len(found.stages) == 3
    server = torch.load(final)
    rebuilt = rebuild(rounds[-1])  # the last round's aggregate is the model the server ended on
    assert max(float(np.abs(a - v.numpy()).max()) for a, v in zip(rebuilt, server.values(), strict=True)) < 1e-6

    sizes = {int(n): found.examples[n] for found in rounds[:1] for n in found.examples}
    mapping = [f"--partition={node}={size - 1}" for node, size in sizes.items()]  # partition p holds p + 1 images
    out = tmp_path / "audit"
    audit = fedvit("audit", str(captures), "--out", str(out), "--model", "cnnapp.task:Net", "--app-dir", str(APP),
                   "--data", "cnnapp_partitions:partition", *mapping, "--decoy-partitions", "4-40",
                   "--iterations", "20", "--restarts", "1", "--membership-references", "3")  # fmt: skip
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    # each member takes one step from the same broadcast: the aggregate's label counts are exact (one step over the
    # union), and each client's own images are judged in it
    report = check_markdown(out)
    assert report["verdict"].startswith("SecAgg+: the 3 clients' updates are masked"), report["verdict"]
    assert {u["node"] for u in report["updates"]} == {"aggregate"}  # nothing computed from a masked vector
    first, _ = report["secure-aggregation"]["rounds"]
    assert first["aggregate"].startswith("rebuilt") and first["next-broadcast-max-difference"] < 1e-6
    masked = [f for f in report["findings"] if f["client"].startswith("partition")]
    assert len(masked) == 3 and all(f["labels"]["why"].startswith("masked by SecAgg+") for f in masked)
    assert all(f["membership"]["figure"].startswith("its images in the aggregate") for f in masked)
    aggregate = next(f for f in report["findings"] if f["client"] == "the aggregate (SecAgg+)")
    assert aggregate["labels"]["word"] == "leaks" and aggregate["labels"]["figure"].startswith("error 0.0%")
