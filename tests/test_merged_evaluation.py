"""One message per client per round: the previous round's federated evaluation rides on the train message."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

from fedvit.strategies.base import FedVitStrategy
from tests.helpers import run_in_process

CONFIG = {"num-server-rounds": 3, "min-nodes": 3, "robust.enabled": True, "robust.steps": 1, "robust.max-samples": 8}


def _run(tmp_path, name: str, merged: bool, monkeypatch, **extra):
    monkeypatch.setattr(FedVitStrategy, "MERGE_EVALUATION", merged)
    run_dir, grid = run_in_process(CONFIG | extra | {"run-name": name, "out-dir": str(tmp_path)}, 3)
    kinds = [m.metadata.message_type for m in grid.sent]
    return json.loads((run_dir / "metrics.json").read_text())["rounds"], load_file(run_dir / "model.safetensors"), kinds


def test_merged_message_gives_the_same_metrics_and_model_with_fewer_messages(tmp_path, monkeypatch):
    separate, model_a, kinds_a = _run(tmp_path, "separate", False, monkeypatch)
    merged, model_b, kinds_b = _run(tmp_path, "merged", True, monkeypatch)
    keys = ("eval-loss", "eval-accuracy", "eval-robust-accuracy", "central-accuracy", "train-loss")
    for a, b in zip(separate, merged, strict=True):
        assert a["round"] == b["round"]
        for key in keys:
            assert (key in a) == (key in b), (a["round"], key)
            if key in a:
                assert a[key] == b[key], (a["round"], key)
    assert all("eval-accuracy" in r for r in merged if r["round"] >= 1)
    for name in model_a:
        np.testing.assert_array_equal(model_a[name], model_b[name])
    assert kinds_a.count("train") == kinds_b.count("train") == 9
    assert kinds_a.count("evaluate") == 9 and kinds_b.count("evaluate") == 3  # only the last round's own message


def test_no_merge_when_train_and_evaluation_reach_different_clients(tmp_path, monkeypatch):
    _, _, kinds = _run(tmp_path, "partial", True, monkeypatch, **{"fraction-evaluate": 0.5})
    assert kinds.count("evaluate") == 3  # one client per round (of 3, fraction 0.5), every round by itself


def test_a_run_without_central_evaluation_still_says_what_its_autoattack_numbers_mean(tmp_path):
    """Federated-only evaluation: the round entry of an AutoAttack round describes the clients' numbers."""
    from types import SimpleNamespace

    from fedvit.app.server_app import RoundEnd
    from fedvit.core.config import parse_config

    robust = {"robust.enabled": True, "robust.attack": "autoattack", "robust.version": "apgd", "robust.max-samples": 12}
    config = parse_config({"centralized-evaluation": False, "num-server-rounds": 2} | robust)
    recorded = []
    strategy = SimpleNamespace(round_of=lambda r: r, round_offset=0, stats={}, merges_evaluation=lambda r: False,
                               state_dict=lambda: {})  # fmt: skip
    recorder = SimpleNamespace(record_round=recorded.append, checkpoint=lambda *a: None)
    end = RoundEnd(config, strategy, recorder, model=None, total_rounds=2)
    for rnd in (0, 1, 2):
        assert end(rnd, {}) is None  # nothing evaluated centrally
    described = [r.get("autoattack") for r in recorded]
    assert described == [None, None, {"version": "apgd", "norm": "Linf", "eps-255": 8.0, "samples": None,
                                      "client-max-samples": 12}]  # fmt: skip
