"""The ``flwr run`` simulation on a running 2-node Ray cluster (``fedvit run --ray-address``).

Marked ``deployment`` (CI runs ``pytest -m deployment``). Ray's own test utility (``ray.cluster_utils.Cluster``)
starts a head and a worker node on this machine, each with its own raylet and 1 CPU; only the processes it
started are stopped afterwards. With ``client-resources-num-cpus=1`` Ray may run one ClientApp per node at a time,
so a run that completes with ClientApps logged on both nodes shows that the simulation joined the cluster
instead of starting its own Ray instance, and that it placed clients by their resources.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedvit.app.flower_processes import private_superlink_env, stop_local_superlink

# xdist: a running Ray cluster is joined by any local ray.init()
pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("ray")]
ROOT = Path(__file__).parents[1]
PLACEMENT = re.compile(r"round (\d+), partition (\d+): on Ray node ([0-9a-f]+)")


@pytest.fixture
def ray_cluster():
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "num_gpus": 0, "object_store_memory": 150 * 2**20, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)  # Ray's default temp dir, /tmp/ray
    try:
        cluster.add_node(num_cpus=1, num_gpus=0, object_store_memory=150 * 2**20)
        cluster.wait_for_nodes()
        nodes = [cluster.head_node.node_id, *(n.node_id for n in cluster.worker_nodes)]
        yield cluster.address, nodes
    finally:
        cluster.shutdown()


def test_simulation_places_clients_on_both_nodes_of_a_ray_cluster(ray_cluster, tmp_path):
    address, nodes = ray_cluster
    home = tmp_path / "flwr-home"
    env = private_superlink_env(home) | {"FEDVIT_CLIENT_STATE": str(tmp_path / "state")}
    cmd = [sys.executable, "-m", "fedvit.app.cli", "run", str(ROOT), "--ray-address", address,
           "--federation-config", "num-supernodes=4 client-resources-num-cpus=1",
           "-c", f"out-dir='{tmp_path / 'out'}' run-name='ray' num-server-rounds=2"]  # fmt: skip
    try:
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    finally:
        stop_local_superlink(home)
    output = done.stdout + done.stderr
    print(output[-4000:])
    assert done.returncode == 0, output[-6000:]
    assert "finished:completed" in output
    placed = {(int(r), int(p)): node for r, p, node in PLACEMENT.findall(output)}
    assert sorted(placed) == [(r, p) for r in (1, 2) for p in range(4)], placed  # every client logged where it ran
    assert set(placed.values()) == set(nodes), (placed, nodes)  # both nodes ran ClientApps, no other Ray did
