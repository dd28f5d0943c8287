"""``fedvit audit-app`` end to end: a real ``flwr run`` simulation of a Flower-shaped app with capture_mod wrapped
around its ClientApp in a staged copy, then the audit, in one command with no other flag; and ``--fail-on labels``
as a CI gate on a skewed-label app and under LocalDpMod.

Marked ``deployment`` (CI runs it beside the loopback tests, and again on Flower 1.42) to keep the default suite
within its time budget.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedvit.app.flower_processes import flower_env

# xdist: a running Ray cluster is joined by any local ray.init()
pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("ray"), pytest.mark.long]
TESTS = Path(__file__).parent
QUICKSTART = TESTS / "flower_idioms" / "quickstart"
HEADAPP = TESTS / "headapp"
CNNAPP = TESTS / "thirdparty_app"


def fedvit(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = flower_env() | {"PYTHONPATH": str(TESTS.parent)}  # the hand-written loader of the flag-driven audit
    done = subprocess.run([sys.executable, "-m", "fedvit.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)  # fmt: skip
    print(done.stdout[-4000:], done.stderr[-3000:])
    return done


def numbers(values: dict, prefix: str = "") -> dict[str, float]:
    """Every number in a nested figure dict, by its path (text, such as where the data came from, left out)."""
    found: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            found |= numbers(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool) and key != "seconds":
            found[prefix + key] = float(value)
    return found


# Each app's flag-driven audit: every value audit-app reads from the code written out by hand, as before audit-app.
WRITTEN_OUT = {
    "quickstart": ("qsapp.task:Net()", ["--model", "qsapp.task:Net", "--input", "3,32,32", "--mean", "0.5,0.5,0.5",
                   "--std", "0.5,0.5,0.5", "--data", "tests.idiom_harness:qs_partition", "--decoy-partitions", "2-3"]),
    # the ViT head example's shape: get_model(num_classes) from the run config, a normalisation written out,
    # Adam and random crops; its loader has no held-out split: each client's others are the other client's images
    "headapp": ("vithead.task:get_model(num_classes=10)", ["--model", "vithead.task:get_model", "--model-arg",
                "num_classes=10", "--input", "3,32,32", "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225",
                "--data", "vithead_data:partition"]),
    # a third-party app whose own config makes Dirichlet(0.3) partitions; its loader returns one array pair: each
    # client's others are the other client's images
    "dirichlet": ("cnnapp.task:Net()", ["--model", "cnnapp.task:Net", "--input", "3,32,32", "--mean", "0.5,0.5,0.5",
                  "--std", "0.5,0.5,0.5", "--data", "cnnapp_partitions:skewed"]),
}  # fmt: skip
APPS = {"quickstart": QUICKSTART, "headapp": HEADAPP, "dirichlet": CNNAPP}


def with_dirichlet_partitions(app: Path) -> None:
    """cnnapp's own config set to two partitions of 24 images with Dirichlet(0.3) class shares (no flag needed)."""
    if str(CNNAPP) not in sys.path:
        sys.path.insert(0, str(CNNAPP))
    from cnnapp_partitions import SKEWED_ALPHA, SKEWED_SIZES

    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    for line, value in (('partition-sizes = "1,2,3,4"', f'partition-sizes = "{SKEWED_SIZES}"'),
                        ("dirichlet-alpha = 0.0", f"dirichlet-alpha = {SKEWED_ALPHA}")):  # fmt: skip
        assert line in text, line
        text = text.replace(line, value)
    pyproject.write_text(text)


@pytest.mark.parametrize("name", list(WRITTEN_OUT))
def test_audit_app_with_no_flag_runs_captures_and_audits_a_flower_shaped_app(tmp_path, name):
    """``fedvit audit-app APP`` and nothing else: the app's simulation runs (2 SuperNodes, 1 round), the capture
    lands in ./fedvit-audit, the report lists what was read from the app; the flag-driven audit of the same capture
    (every value written out) gives the same label and membership figures and findings."""
    app = tmp_path / name
    shutil.copytree(APPS[name], app, ignore=shutil.ignore_patterns("__pycache__"))
    if name == "dirichlet":
        with_dirichlet_partitions(app)
    done = fedvit("audit-app", str(app), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "fedvit-audit"
    report = json.loads((out / "audit.json").read_text())
    assert len(report["updates"]) == 2
    assert {f["what"] for f in report["read-from-app"]} >= {"model", "mean", "std", "clients' data", "input"}
    model, flags = WRITTEN_OUT[name]
    assert f"fedvit audit-app: model: {model}" in done.stdout
    for update in report["updates"]:  # every figure measured: the others are known without decoys
        assert update["leakage"]["membership"]["status"] == "measured", update["leakage"]["membership"]
        assert "noise" not in update["attacks"]["labels (head-bias gradient)"]
    flagged = fedvit("audit", str(out / "captures"), "--out", str(tmp_path / "flags"), *flags, "--app-dir", str(app),
                     "--app", str(app), "--leakage", "labels,membership", cwd=tmp_path)  # fmt: skip
    assert flagged.returncode == 0, flagged.stderr[-3000:]
    theirs = json.loads((tmp_path / "flags" / "audit.json").read_text())
    for mine, other in zip(report["updates"], theirs["updates"], strict=True):
        assert mine["labels"] == other["labels"]
        for kind in ("labels", "membership"):
            a, b = numbers(mine["leakage"][kind]), numbers(other["leakage"][kind])
            assert a.keys() == b.keys() and a == pytest.approx(b, rel=1e-6, abs=1e-9), kind
    # a finding's words may name where the images came from: the app's loader with its line, or the --data loader
    loader = next(f for f in report["read-from-app"] if f["what"] == "clients' data")
    named_by_app = f"{loader['value'].split(',')[0]} ({loader['source']})"
    named_by_flag = flags[flags.index("--data") + 1]
    for mine, other in zip(report["findings"], theirs["findings"], strict=True):
        for kind in ("labels", "membership"):
            assert json.dumps(mine[kind]).replace(named_by_app, named_by_flag) == json.dumps(other[kind]), kind


SKEWED, UNDER_DP = "dirichlet-alpha=0.2", "dirichlet-alpha=0.2 local-dp-epsilon=0.02"


@pytest.mark.parametrize(("setting", "code"), [(SKEWED, 1), (UNDER_DP, 0)])
def test_fail_on_labels_fails_a_skewed_label_app_and_passes_it_under_local_dp(tmp_path, setting, code):
    """The third-party CNN app, 2 clients of 24 images with Dirichlet(0.2) class shares: the label counts leak and
    ``--fail-on labels`` exits 1. The same app under LocalDpMod at ε = 0.02 (noise far above the update): exit 0."""
    config = f"partition-sizes='24,24' {setting}"
    done = fedvit("audit-app", str(CNNAPP), "--out", str(tmp_path / "out"), "-c", config, "--leakage", "labels",
                  "--fail-on", "labels", cwd=tmp_path)  # fmt: skip
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"--fail-on labels: {'FAILED' if code else 'passed'}" in done.stdout
