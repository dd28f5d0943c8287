"""``fedvit robustness-check``: the Carlini et al. sanity checks on a finished run's model.

Marked ``robustness`` (AutoAttack, Square and a 100-step x 5-restart PGD: ~35 s on 2 idle CPU cores with Square
cut to 300 queries, far longer on busy ones): not in the default suite; CI runs ``pytest -m robustness``.
"""

from __future__ import annotations

import json

import pytest
from safetensors.numpy import save_file

from fedvit.app.cli import main
from fedvit.app.robustness_check import EPS_SWEEP_255, run_checks
from fedvit.core.config import parse_config
from fedvit.core.model import get_weights
from tests.test_adversarial import trained_tiny

pytestmark = pytest.mark.robustness


@pytest.fixture
def finished_run(tmp_path):
    """A run folder as fedvit writes it: config.json with robust.* on, and the final model.safetensors."""
    model, _, _ = trained_tiny()
    config = parse_config({"robust.enabled": True, "robust.steps": 10, "model.head": "vis"})
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    save_file({k: v.copy() for k, v in get_weights(model).items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_report_has_every_check_with_its_numbers(finished_run, capsys):
    code = main(["robustness-check", str(finished_run), "--samples", "12", "--square-queries", "300"])
    report = json.loads((finished_run / "robustness-check.json").read_text())
    assert code == (0 if report["passed"] else 1)
    assert report["samples"] == 12 and report["eps-255"] == 8.0 and report["square-queries"] == 300
    acc = report["accuracy"]
    assert set(acc) == {"natural", "pgd", "autoattack", "pgd-strong", "square"}
    assert all(0.0 <= v <= acc["natural"] for k, v in acc.items() if k != "natural")
    assert [float(e) for e in report["eps-sweep"]] == list(EPS_SWEEP_255)
    checks = {c["check"]: c for c in report["checks"]}
    assert len(checks) == 4 and all(c["numbers"] for c in checks.values())
    # The ensemble is at least as strong as the run's PGD-10 on the same images (can fail: a broken wrapper).
    assert checks["AutoAttack <= PGD"]["passed"], checks["AutoAttack <= PGD"]
    assert checks["robust accuracy -> 0 as ε grows"]["passed"], checks["robust accuracy -> 0 as ε grows"]
    markdown = (finished_run / "robustness-check.md").read_text()
    assert markdown.count("| pass |") + markdown.count("| **FAIL** |") == 4
    assert "AutoAttack <= PGD" in capsys.readouterr().out


def test_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["robustness-check", str(tmp_path / "nope")]) == 2
    assert "config.json is missing" in capsys.readouterr().err
    assert main(["robustness-check", str(tmp_path), "--samples", "0"]) == 2
    assert main(["robustness-check", str(tmp_path), "--square-queries", "0"]) == 2


def test_run_checks_refuses_a_folder_without_a_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        run_checks(tmp_path)
