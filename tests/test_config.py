from pathlib import Path

import pytest

from core.config import Config, ConfigError, check_against_federation, parse_config
from fedvit_app.run_config import check_config


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("model.name", "vit_does_not_exist", "timm.list_models"),
        ("data.name", "mnist", "synthetic, cifar10"),
        ("data.name", "imagefolder:", "imagefolder:<path>"),
        ("strategy", "fedsomething", "fedsgd, fedavg"),
        ("data.partitioner", "shards", "iid, noniid-k, dirichlet"),
        ("lr", 0.0, "> 0"),
        ("lr", -0.5, "> 0"),
        ("num-server-rounds", 0, ">= 1"),
        ("num-server-rounds", 2.5, "an integer"),
        ("fraction-train", 0.0, "(0, 1]"),
        ("momentum", 1.0, "[0, 1)"),
        ("data.client-test-fraction", 1.0, "(0, 1)"),
        ("centralized-evaluation", "yes", "true or false"),
        ("not-a-key", 1, "a known key"),
    ],
)
def test_bad_values_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as err:
        parse_config({key: value})
    line = str(err.value)
    assert "\n" not in line
    assert key in line and repr(value if key != "lr" else float(value))[:6] in line and allowed in line


def test_k_classes_more_than_synthetic_classes():
    with pytest.raises(ConfigError, match=r"data.classes-per-client=11 .*at most the number of classes \(10\)"):
        parse_config({"data.partitioner": "noniid-k", "data.classes-per-client": 11})


def test_federation_checks_need_data_facts():
    config = parse_config({"data.partitioner": "noniid-k", "data.classes-per-client": 4})
    with pytest.raises(ConfigError, match="classes-per-client=4"):
        check_against_federation(config, num_clients=2, num_train=100, num_classes=3)
    with pytest.raises(ConfigError, match="num-partitions=5 .*training samples \\(4\\)"):
        check_against_federation(config, num_clients=5, num_train=4, num_classes=10)
    check_against_federation(config, num_clients=5, num_train=100, num_classes=10)


def test_defaults_match_pyproject_and_round_trip():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    flat = {}
    for key, value in pyproject["tool"]["flwr"]["app"]["config"].items():
        if isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in value.items()}
        else:
            flat[key] = value
    assert flat == Config().to_dict()
    assert parse_config(flat) == Config()


def test_cli_check_config_exit_codes(capsys):
    from pathlib import Path

    app = Path(__file__).parents[1]
    assert check_config(app, []) == 0
    assert check_config(app, ["lr=-1"]) == 2
    assert "lr=-1.0 is invalid" in capsys.readouterr().err


@pytest.mark.parametrize("preset", sorted((Path(__file__).parents[1] / "conf").glob("*.toml")), ids=lambda p: p.name)
def test_presets_are_valid(preset):
    assert check_config(Path(__file__).parents[1], [str(preset)]) == 0


def test_cli_refuses_a_local_superlink_that_would_reinstall_dependencies(tmp_path, monkeypatch):
    """A SuperLink started without FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 is detected by its /proc entry."""
    import os
    import subprocess
    import sys
    import time

    from fedvit_app import cli, flower_processes

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"}
    # A stand-in process whose command line names flower-superlink, as the real one's does.
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", "flower-superlink"]
    fake = subprocess.Popen(sleeper, env=env)
    fine = subprocess.Popen(sleeper, env=dict(env, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1"))
    try:
        time.sleep(0.5)
        stale = flower_processes.superlink_pids(tmp_path, with_env="FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1")
        assert stale == [fake.pid]
        code = cli.main(["run", str(Path(__file__).parents[1])])
        assert code == 2
        assert sorted(flower_processes.superlink_pids(tmp_path)) == sorted([fake.pid, fine.pid])
        assert flower_processes.stop_local_superlink(tmp_path) == 2
    finally:
        fake.kill()
        fine.kill()


def test_flower_env_finds_this_environments_flower_commands_without_activation():
    import sys
    from pathlib import Path

    from fedvit_app.flower_processes import flower_env

    env = flower_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert flower_env({"PATH": env["PATH"]})["PATH"] == env["PATH"]  # not added twice
