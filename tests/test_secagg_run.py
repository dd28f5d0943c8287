"""fedvit's own runs through SecAgg+ (``secagg.enabled``), in one process: Flower's legacy workflow with its
``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` in front of fedvit's train handler on the clients.

The aggregate equals plain FedAvg's within the stated quantisation bound; a client that drops out mid-round is
survived above the reconstruction threshold, and below it the run stops with one line; central DP composes as in
Flower's example; what cannot compose is refused with one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Error
from flwr.app.message import make_message
from safetensors.numpy import load_file

from fedvit.clients import runner
from fedvit.core.config import Config, ConfigError, parse_config
from fedvit.core.model import build_model, get_weights
from fedvit.strategies.secagg import BOUND_METRIC, DROPPED, SecAggRoundError, quantisation_bound
from tests.helpers import LocalGrid, reply_metadata

BASE = {
    "capture.enabled": False, "strategy": "fedavg", "lr": 0.05, "momentum": 0.9, "num-server-rounds": 1,
    "data.synthetic-train-size": 200, "data.synthetic-test-size": 40, "run-name": "run",
}  # fmt: skip
SECAGG = {"secagg.enabled": True}
COLLECT = "collect_masked_vectors"


class DropoutGrid(LocalGrid):
    """A LocalGrid on which the nodes of ``drop`` (partition id -> SecAgg+ stage) stop answering from that stage on,
    as a crashed SuperNode: the SuperLink's error reply, and the node gone from the grid's nodes."""

    def __init__(self, run_config: dict, num_nodes: int, drop: dict[int, str]) -> None:
        super().__init__(run_config, num_nodes)
        self.drop = {100 + p: stage for p, stage in drop.items()}
        self.gone: set[int] = set()

    def get_node_ids(self):
        return [n for n in self.contexts if n not in self.gone]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            secagg = msg.content.config_records.get("secaggplus_configs", {}) if msg.has_content() else {}
            if node in self.drop and secagg.get("stage") == self.drop[node]:
                self.gone.add(node)
            if node in self.gone:
                error = Error(code=5, reason="node unavailable (dropped out in the test)")
                replies.append(make_message(reply_metadata(node, msg.metadata.message_type), error=error))
            else:
                replies.extend(super().send_and_receive([msg], timeout=timeout))
        return replies


def run(tmp_path, config: dict, nodes: int, drop: dict[int, str] | None = None):
    """(run dir, metrics by round) of the whole ServerApp in this process."""
    from flwr.app import Context, RecordDict

    from fedvit.app.server_app import run as server_run

    config = BASE | {"out-dir": str(tmp_path), "min-nodes": nodes} | config
    grid = DropoutGrid(config, nodes, drop or {})
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    run_dir = server_run(grid, context)
    return run_dir, {e["round"]: e for e in json.loads((run_dir / "metrics.json").read_text())["rounds"]}


def max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) for k in a)


def fedavg_of(config: dict, partitions: list[int], nodes: int) -> tuple[dict[str, np.ndarray], list[int]]:
    """FedAvg of one round of the given partitions' training, computed here from the run's initial model."""
    parsed = parse_config(BASE | config)
    model = build_model(parsed.model, parsed.data.synthetic_num_classes, parsed.seed)
    start = get_weights(model)
    replies = [runner.train(parsed, p, nodes, start, 1, parsed.lr) for p in partitions]
    counts = [int(metrics["num-examples"]) for _, metrics in replies]
    total = sum(counts)
    pairs = list(zip(replies, counts, strict=True))
    mean = {k: sum(n / total * r["arrays"][k].astype(np.float64) for (r, _), n in pairs) for k in start}
    return mean, counts


def bound_for(config: dict, counts: list[int], largest: int) -> float:
    """The stated bound (one round) plus float32's rounding of the models compared."""
    return quantisation_bound(parse_config(BASE | SECAGG | config).secagg, counts, largest) + 1e-6


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])  # FedProx: FedAvg's aggregate, a proximal term per client
def test_the_aggregate_equals_fedavg_within_the_stated_quantisation_bound(tmp_path, strategy):
    plain_dir, _ = run(tmp_path / "plain", {"strategy": strategy}, 4)
    secure_dir, rounds = run(tmp_path / "secagg", SECAGG | {"strategy": strategy}, 4)
    plain, secure = load_file(plain_dir / "model.safetensors"), load_file(secure_dir / "model.safetensors")
    difference = max_difference(plain, secure)
    first = rounds[1]
    assert first["aggregated"] == [0, 1, 2, 3] and first["rejected"] == {}
    assert "bytes-up" not in first  # the masked vectors are not counted: said, not written as 0
    assert first["messages"] == 4 * 4 + 4  # four SecAgg+ stages per client, then fedvit's evaluation
    assert 0 < difference <= first[BOUND_METRIC] + 1e-6, (difference, first[BOUND_METRIC])  # quantised, within bound
    assert first[BOUND_METRIC] < 1e-4 and first["secagg-clipped-entries"] == 0
    assert 0 <= first["central-accuracy"] <= 1 and 0 <= first["eval-accuracy"] <= 1


@pytest.mark.parametrize(
    ("stage", "in_aggregate"),
    [("share_keys", False), (COLLECT, False), ("unmask", True)],  # unmask: its masked vector is in already
)
def test_a_client_dropping_out_mid_round_is_survived_above_the_threshold(tmp_path, stage, in_aggregate):
    run_dir, rounds = run(tmp_path, SECAGG | {"num-server-rounds": 2, "min-nodes": 4}, 5, drop={2: stage})
    first, second = rounds[1], rounds[2]
    survivors = [0, 1, 3, 4]
    aggregated = [0, 1, 2, 3, 4] if in_aggregate else survivors
    assert first["sampled"] == [0, 1, 2, 3, 4] and first["aggregated"] == aggregated
    assert first["rejected"] == ({} if in_aggregate else {"2": DROPPED})
    assert second["sampled"] == survivors and second["aggregated"] == survivors
    # round 1's model is FedAvg over exactly the aggregated clients, within the stated bound
    expected, counts = fedavg_of({}, aggregated, 5)
    round_one = load_file(run_dir / "checkpoints" / "round-0001.safetensors")
    largest = max(runner.describe(parse_config(BASE), p, 5)["num-train"] for p in range(5))
    assert max_difference(expected, round_one) <= bound_for({}, counts, largest)


def test_below_the_reconstruction_threshold_the_run_stops_with_one_line(tmp_path):
    with pytest.raises(SecAggRoundError) as stopped:
        run(tmp_path, SECAGG | {"secagg.reconstruction-threshold": 1.0}, 4, drop={1: COLLECT})
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("SecAgg+ round 1 stopped at its collect masked vectors stage: 3 of 4 sampled clients")
    assert "fewer than the 4 share holders (reconstruction threshold)" in message


def test_accept_failures_false_stops_a_secagg_round_that_lost_a_client(tmp_path):
    from fedvit.strategies.base import ClientsFailedError

    with pytest.raises(ClientsFailedError, match="3 of 4 sampled clients completed SecAgg"):
        run(tmp_path, SECAGG | {"accept-failures": False}, 4, drop={1: COLLECT})


def test_central_dp_composes_with_secagg_as_in_flowers_example(tmp_path):
    dp = {"dp.mode": "central", "dp.noise-multiplier": 0.0, "dp.clipping-norm": 0.05}  # no noise: comparable
    plain_dir, _ = run(tmp_path / "plain", dp, 4)
    secure_dir, rounds = run(tmp_path / "secagg", SECAGG | dp, 4)
    difference = max_difference(load_file(plain_dir / "model.safetensors"), load_file(secure_dir / "model.safetensors"))
    assert difference <= rounds[1][BOUND_METRIC] + 1e-6
    assert rounds[1]["dp-clipped"] == 1.0 and rounds[1]["dp-update-norm"] > 0.05  # clipped under the masks
    assert rounds[1]["dp-central-noise-std"] == 0.0
    report = json.loads((secure_dir / "dp-privacy.json").read_text())
    assert report["releases"] == 1 and report["clients-per-round"] == 4


@pytest.mark.parametrize(
    ("override", "key", "reason"),
    [
        ({"strategy": "masked-fedsgd"}, "strategy", "needs every client's mask"),
        ({"strategy": "fedwavg"}, "strategy", "each client's last layer"),
        ({"strategy": "fedsgd"}, "strategy", "mean gradient"),
        ({"strategy": "scaffold"}, "strategy", "control-variate"),
        ({"encryption.mode": "paper", "centralized-evaluation": False}, "encryption.mode", "key handshake"),
        ({"dp.mode": "central", "dp.canaries": 2}, "dp.canaries", "canaries"),
        ({"secagg.num-shares": 4, "secagg.reconstruction-threshold": 4}, "secagg.reconstruction-threshold",
         "less than secagg.num-shares"),
        ({"secagg.num-shares": 2.5}, "secagg.num-shares", "(0, 1]"),
    ],
)
def test_what_cannot_compose_with_secagg_is_refused_with_one_line(override, key, reason):
    with pytest.raises(ConfigError) as refused:
        parse_config(BASE | SECAGG | override)
    assert refused.value.key == key and reason in str(refused.value) and "\n" not in str(refused.value)


def test_secagg_settings_are_refused_while_it_is_off():
    with pytest.raises(ConfigError, match="secagg.num-shares"):
        parse_config(BASE | {"secagg.num-shares": 0.5})
    assert Config().secagg.enabled is False


def test_a_fedvit_secagg_capture_keeps_every_stage_and_audits_as_the_aggregate(tmp_path):
    import fedvit

    config = SECAGG | {"capture.enabled": True, "capture.ground-truth": True, "data.synthetic-train-size": 150}
    run_dir, _ = run(tmp_path / "run", config, 3)
    stems = sorted(p.name for p in run_dir.glob("run-*/captures/round-0001/node-*.json"))
    assert len(stems) == 3 * 4 and sum("~" not in s for s in stems) == 3  # four stages of each node, none lost
    result = fedvit.audit_captures(run_dir, out=tmp_path / "audit", iterations=5, restarts=1, max_seconds=5)
    assert result.verdict.startswith("SecAgg+: the 3 clients' updates are masked"), result.verdict
    (update,) = result.report["updates"]
    assert update["node"] == "aggregate" and update["examples"] == 120  # the three members' 40 images each
    assert update["leakage"]["membership"]["members"] == 120  # scored against the members' recorded batches
    assert sorted(update["membership-members"]) == ["partition 0", "partition 1", "partition 2"]
    assert all(e["members"] == 40 for e in update["membership-members"].values())
