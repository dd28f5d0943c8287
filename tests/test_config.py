from pathlib import Path

import pytest

from fedvit.app.run_config import check_config
from fedvit.core.config import Config, ConfigError, check_against_federation, parse_config


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
        ("robust.attack", "fgsm", "pgd, autoattack"),
        ("robust.version", "plus", "standard, apgd"),
        ("robust.every", 0, ">= 1"),
        ("robust.eps-255", 0.0, "(0, 255]"),
        ("robust.eps-255", -8.0, "(0, 255]"),
        ("audit.keep", "last", "match, objective"),
        ("audit.init", "imagenet", "noise, gaussian, test-split"),
        ("audit.prior-schedule", "linear", "constant, cosine"),
        ("audit.patch-tv", -0.1, ">= 0"),
    ],
)
def test_bad_values_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as err:
        parse_config({key: value})
    line = str(err.value)
    assert "\n" not in line
    assert key in line and repr(value if key != "lr" else float(value))[:6] in line and allowed in line


def test_autoattack_settings_need_autoattack_and_robust_on():
    with pytest.raises(ConfigError, match=r"robust.every=3 .*unless robust.attack = 'autoattack'"):
        parse_config({"robust.enabled": True, "robust.every": 3})
    with pytest.raises(ConfigError, match=r"robust.attack='autoattack' .*unless robust.enabled = true"):
        parse_config({"robust.attack": "autoattack"})
    config = parse_config({"robust.enabled": True, "robust.attack": "autoattack", "robust.every": 3})
    assert (config.robust.version, config.robust.every) == ("standard", 3)


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

    from fedvit.app import cli, flower_processes

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


def test_ray_address_refuses_a_superlink_that_would_not_join_and_a_deployment(tmp_path, monkeypatch, capsys):
    """--ray-address works through the local SuperLink's environment: one running without that RAY_ADDRESS would
    start its own Ray instance, so the run is refused (exit 2) before anything is submitted."""
    import os
    import subprocess
    import sys
    import time

    from fedvit.app import cli

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", "flower-superlink"]
    env = dict(os.environ, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", FLWR_HOME=str(tmp_path))
    other = subprocess.Popen(sleeper, env=env | {"RAY_ADDRESS": "10.0.0.9:6379"})
    try:
        time.sleep(0.5)
        root = str(Path(__file__).parents[1])
        assert cli.main(["run", root, "--ray-address", "10.0.0.1:6379"]) == 2
        assert f"pid {other.pid}) was started without RAY_ADDRESS=10.0.0.1:6379" in capsys.readouterr().err
        assert cli.main(["run", root, "remote-link", "--ray-address", "10.0.0.1:6379"]) == 2
        assert "--ray-address is for simulations" in capsys.readouterr().err
    finally:
        other.kill()


def test_flower_env_finds_this_environments_flower_commands_without_activation():
    import sys
    from pathlib import Path

    from fedvit.app.flower_processes import flower_env

    env = flower_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert flower_env({"PATH": env["PATH"]})["PATH"] == env["PATH"]  # not added twice


def test_the_local_superlink_is_started_before_flwr_run_with_a_longer_wait_and_its_failure_is_one_line(tmp_path):
    """flwr run waits 15 s for the local SuperLink it starts, which a loaded machine outlasted (CI failed so): fedvit
    starts Flower's own first, with a longer wait, at the same FLWR_HOME and ports, where flwr run then finds it."""
    import httpx

    from fedvit.app.flower_processes import (
        flower_env,
        local_address,
        private_superlink_env,
        start_local_superlink,
        stop_local_superlink,
        superlink_pids,
    )

    home = tmp_path / "home"
    env = flower_env(private_superlink_env(home))
    try:
        start_local_superlink(env, wait=120)
        pids = superlink_pids(home)
        assert pids, "no SuperLink runs for this FLWR_HOME"
        port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).is_success
        start_local_superlink(env, wait=120)  # one answers: none more is started
        assert sorted(superlink_pids(home)) == sorted(pids)
    finally:
        stop_local_superlink(home)
    assert not superlink_pids(home)

    no_flower = flower_env(private_superlink_env(tmp_path / "other")) | {"PATH": "/nonexistent"}
    with pytest.raises(RuntimeError, match="the local SuperLink did not start: Unable to launch `flower-superlink`"):
        start_local_superlink(no_flower, wait=5)

    config = tmp_path / "config"
    assert local_address(config) == ":local:"  # no config: flwr writes its default, a local connection
    config.mkdir()
    (config / "config.toml").write_text('[superlink]\ndefault = "mem"\n[superlink.mem]\naddress = ":local-in-memory:"\n'
                                        '[superlink.lab]\naddress = "10.0.0.1:9093"\n')  # fmt: skip
    assert local_address(config) == ":local-in-memory:"
    assert local_address(config, "lab") is None and local_address(config, "missing") is None


# -c strings that touch the same table: every command path merges them key by key (Flower's own merge drops keys).
BOTH_DATA = ["data.name='bogus-dataset'", "data.partitioner='iid'"]


def test_check_config_keeps_every_key_of_several_overrides(capsys):
    root = Path(__file__).parents[1]
    assert check_config(root, BOTH_DATA) == 2
    assert "data.name='bogus-dataset'" in capsys.readouterr().err
    assert check_config(root, list(reversed(BOTH_DATA))) == 2


def test_merge_is_key_by_key_later_wins_and_files_mix_with_pairs(tmp_path):
    from fedvit.app.run_config import merge_overrides, resolved_run_config

    preset = tmp_path / "preset.toml"
    preset.write_text('lr = 0.5\n[data]\nname = "cifar10"\nclasses-per-client = 3\n')
    merged = merge_overrides([str(preset), "data.partitioner='noniid-k' lr=0.1", "data.name='synthetic'"])
    assert merged == {"lr": 0.1, "data.name": "synthetic", "data.classes-per-client": 3, "data.partitioner": "noniid-k"}
    resolved = resolved_run_config(Path(__file__).parents[1], [str(preset), "data.partitioner='noniid-k'"])
    assert resolved["data.name"] == "cifar10" and resolved["data.partitioner"] == "noniid-k"
    assert resolved["data.synthetic-train-size"] == 1200  # untouched defaults stay


def test_bad_overrides_are_one_line_errors(capsys):
    root = Path(__file__).parents[1]
    assert check_config(root, ["data.name=cifar10"]) == 2  # an unquoted string is not a TOML value
    assert "data.name='text'" in capsys.readouterr().err
    assert check_config(root, ["no-such-key=1"]) == 2
    assert "no-such-key" in capsys.readouterr().err
    assert check_config(root, ["lr 0.1"]) == 2


def test_fedvit_run_hands_flwr_one_merged_file(tmp_path):
    import argparse

    from flwr.common.config import parse_config_args

    from fedvit.app.cli import DEFAULT_FEDERATION, flwr_run_command

    args = argparse.Namespace(app=".", superlink=None, run_config=BOTH_DATA, federation_config=DEFAULT_FEDERATION)
    cmd = flwr_run_command(args, tmp_path / "run-config.toml")
    assert cmd.count("--run-config") == 1
    file = cmd[cmd.index("--run-config") + 1]
    assert parse_config_args([file]) == {"data.name": "bogus-dataset", "data.partitioner": "iid"}  # as Flower reads it


def test_experiment_method_keeps_the_users_table_keys(tmp_path):
    import tomllib

    from fedvit.app.experiments import load_experiment, method_config
    from fedvit.app.run_config import flatten

    root = Path(__file__).parents[1]
    exp = load_experiment(root / "conf/experiments/fat-cpu-quick.toml")
    label = next(iter(exp.methods))
    path = method_config(exp, root, tmp_path, label, ["data.name='imagefolder:/my/images'", exp.methods[label]])
    values = flatten(tomllib.loads(path.read_text()))
    assert values["data.name"] == "imagefolder:/my/images" and values["data.partitioner"] == "iid"
    assert values["data.augment"] == "crop-flip"  # the grid preset's [data] table (conf/fat-cpu.toml) survives too


def test_audit_and_deploy_commands_merge_overrides_key_by_key(tmp_path, capsys):
    from fedvit.app.cli import main

    pairs = [arg for override in BOTH_DATA for arg in ("-c", override)]
    assert main(["audit", "--benchmark", "--out", str(tmp_path / "audit"), *pairs]) == 2
    assert main(["deploy", "loopback", "--workdir", str(tmp_path / "deploy"), *pairs]) == 2
    assert main(["keygen", "--out", str(tmp_path / "key"), *pairs]) == 2
    assert capsys.readouterr().err.count("data.name='bogus-dataset'") == 3
    assert not (tmp_path / "deploy").exists()  # refused before any process started


def test_a_failed_run_prints_the_end_of_its_log_that_the_stream_missed():
    """A SuperLink restart cuts ``flwr run --stream`` before the ServerApp's last lines (the reason it stopped);
    ``fedvit run`` prints the log from the first line it did not relay, matched in order (a repeated line such as an
    empty INFO line must not hide what follows it), and nothing once the stream had it all."""
    from fedvit.app.cli import unprinted_tail

    log = ["INFO :", "[ROUND 1/2]", "INFO :", "[ROUND 2/2]", "INFO :", "ERROR : round 2: all 3 clients failed"]
    printed = ["$ flwr run . --stream", "Successfully started run 7", "INFO : Starting logstream for run_id `7`"]
    printed += log[:4]
    shown = ["Using SuperLink: local (127.0.0.1:39091)", "INFO : Printing logstream for run_id `7`", *log]
    assert unprinted_tail(shown, printed) == log[4:]  # flwr log --show's own header is not the run's
    assert unprinted_tail(log, printed) == log[4:]
    assert unprinted_tail(log, printed + log[4:]) == []
    reattached = printed + ["fedvit: the log stream of run 7 ended while it is running; re-attaching", *log]
    assert unprinted_tail(log, reattached) == []
    assert unprinted_tail(log, []) == log
