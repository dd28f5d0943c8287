import json
import tomllib
from pathlib import Path

from fedvit.app.experiments import load_experiment, method_config, plot_accuracy, summarize
from fedvit.app.run_config import check_config

ROOT = Path(__file__).parents[1]
SPECS = sorted((ROOT / "conf" / "experiments").glob("*.toml"))


def test_every_method_of_every_experiment_is_a_valid_run_config(tmp_path):
    assert SPECS
    for spec in SPECS:
        exp = load_experiment(spec)
        for label, overrides in exp.methods.items():
            path = method_config(exp, ROOT, tmp_path, label, [overrides])
            assert check_config(ROOT, [str(path)]) == 0, (spec.name, label)
            values = tomllib.loads(path.read_text())
            assert values["run-name"] == label and values["out-dir"] == str(tmp_path)


def test_method_overrides_win_over_the_base_preset(tmp_path):
    exp = load_experiment(ROOT / "conf" / "experiments" / "masking-cpu.toml")
    from flwr.common.config import flatten_dict

    path = method_config(exp, ROOT, tmp_path, "fresh-r0.8", [exp.methods["fresh-r0.8"]])
    values = flatten_dict(tomllib.loads(path.read_text()))
    assert values["mask.r"] == 0.8 and values["strategy"] == "masked-fedsgd" and values["num-server-rounds"] == 30


def test_summary_table_and_plot(tmp_path):
    for label, accs in {"a": [0.1, 0.5, 0.4], "b": [0.1, 0.2, 0.3]}.items():
        (tmp_path / label).mkdir()
        rounds = [{"round": r, "central-accuracy": acc} for r, acc in enumerate(accs)]
        (tmp_path / label / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    table = summarize(tmp_path, ["a", "b"])
    assert "| a | 40.00% | 50.00% (1) | 2 |" in table and "| b | 30.00% | 30.00% (2) | 2 |" in table
    assert json.loads((tmp_path / "summary.json").read_text())[0]["best"] == 0.5
    assert plot_accuracy(tmp_path, ["a", "b"]).is_file()


def test_grid_spans_every_combination_and_the_fat_report_follows_the_paper(tmp_path):
    import json

    import pytest

    from fedvit.app.experiments import grid_methods
    from fedvit.app.fat_report import write_fat_report

    grid = {
        "partition": {"iid": "data.partitioner='iid'", "noniid2": "data.partitioner='noniid-k'"},
        "aggregator": {"fedavg": "strategy='fedavg'", "fedwavg": "strategy='fedwavg'"},
        "training": {"NT": "lr=0.03", "AT": "adversarial.enabled=true"},
    }
    methods = grid_methods(grid)
    assert len(methods) == 8 and methods["noniid2.fedwavg.AT"] == (
        "data.partitioner='noniid-k' strategy='fedwavg' adversarial.enabled=true"
    )
    with pytest.raises(ValueError, match="no '.'"):
        grid_methods({"a": {"x.y": ""}})
    # Fake runs: accuracy and robust accuracy per round.
    robust_best = {"fedavg": 0.30, "fedwavg": 0.35}
    for label in methods:
        partition, aggregator, training = label.split(".")
        rounds = [{"round": 0, "central-accuracy": 0.1, "central-robust-accuracy": 0.0}]
        rounds += [{"round": 1, "central-accuracy": 0.6, "central-robust-accuracy": robust_best[aggregator]}]
        rounds += [{"round": 2, "central-accuracy": 0.7, "central-robust-accuracy": 0.2}]
        if partition == "iid":  # AutoAttack in the final round of these runs only
            rounds[-1]["central-autoattack-accuracy"] = 0.15
            rounds[-1]["autoattack"] = {"version": "apgd", "norm": "Linf", "eps-255": 8.0}
        (tmp_path / label).mkdir()
        (tmp_path / label / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    report = write_fat_report(tmp_path, grid)
    # NT: best accuracy 70.00; AT: accuracy at the best robust round (round 1: 60.00) and that robust accuracy.
    # AT AutoAttack: the final round's, where measured.
    assert "| fedwavg | 70.00 | (60.00, **35.00**) | 15.00 (apgd, round 2) | 70.00 | (60.00, **35.00**) | – |" in report
    assert "| fedavg | 70.00 | (60.00, <u>30.00</u>) | 15.00 (apgd, round 2) |" in report
    assert (tmp_path / "fig2.png").is_file() and (tmp_path / "fat-table.json").is_file()
    (tmp_path / "iid.fedavg.AT" / "metrics.json").unlink()  # a run that did not finish
    assert "| fedavg | 70.00 | not run | not run |" in write_fat_report(tmp_path, grid)
