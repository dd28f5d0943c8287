"""The test apps written in the idioms of Flower's own examples (tests/flower_idioms), run in this process: each
app's own ClientApp object answers real train messages through ``capture_mod``, as ``ClientApp(mods=[capture_mod])``
would record them, and the audit reads the capture with the recipe from the app's code. For the idiom tests and
``benchmarks/flower_idioms.py``; no Ray, no network."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

IDIOMS = Path(__file__).parent / "flower_idioms"
QUICKSTART, LEGACY, LIGHTNING, STATEFUL = (IDIOMS / n for n in ("quickstart", "legacy", "lightning", "stateful"))
for folder in (QUICKSTART, LEGACY, STATEFUL, LIGHTNING):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def qs_partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The quickstart-shaped app's partition as the audit's loader returns it: pixels in [0, 1], labels."""
    from qsapp.task import Pictures

    found = Pictures(partition_id)
    return found.pixels.transpose(0, 3, 1, 2).astype(np.float32) / 255, found.labels


def legacy_partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    from legacyapp.task import Digits

    found = Digits(partition_id)
    return found.pixels[:, None].astype(np.float32) / 255, found.labels


def stateful_partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    from advapp.task import Garments

    found = Garments(partition_id)
    return found.pixels[:, None].astype(np.float32) / 255, found.labels


def ae_partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    from aeapp.task import Digits

    found = Digits(partition_id)
    return found.pixels, np.zeros(len(found.pixels), np.int64)  # an autoencoder's data carry no labels


@dataclasses.dataclass(frozen=True)
class Shape:
    """One test app: where it is, its model as ``--model`` names it, its input and normalisation, the loader the
    audit scores with, the records its clients need and what one client trains (examples, batch)."""

    name: str
    example: str  # the Flower example whose idioms it uses
    folder: Path
    factory: str
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    loader: str
    run_config: dict[str, Any]
    examples: int
    batch: int

    def spec(self) -> Any:
        from fedvit.observed.model_spec import ModelSpec

        return ModelSpec(self.factory, self.input_shape, self.mean, self.std, app_dir=str(self.folder))


SHAPES = {
    "quickstart": Shape("quickstart", "quickstart-pytorch", QUICKSTART, "qsapp.task:Net", (3, 32, 32), (0.5,) * 3,
                        (0.5,) * 3, "qs_partition", {"batch-size": 16, "local-epochs": 1}, 24, 16),
    "legacy": Shape("legacy", "flower-simulation-step-by-step-pytorch", LEGACY, "legacyapp.task:Net", (1, 28, 28),
                    (0.5,), (0.5,), "legacy_partition", {}, 40, 32),
    "stateful": Shape("stateful", "advanced-pytorch", STATEFUL, "advapp.task:Net", (1, 28, 28), (0.2860,),
                      (0.3530,), "stateful_partition", {"batch-size": 16, "local-epochs": 1}, 48, 16),
    "lightning": Shape("lightning", "quickstart-pytorch-lightning", LIGHTNING, "aeapp.task:LitAutoEncoder",
                       (1, 28, 28), (0.0,), (1.0,), "ae_partition", {"max-epochs": 1}, 40, 32),
}  # fmt: skip
LR = 0.05
LEGACY_CONFIG = {"lr": LR, "momentum": 0.9, "local_epochs": 1}  # legacyapp's server's on_fit_config_fn


def instruction(shape: Shape, weights: dict[str, torch.Tensor], server_round: int) -> Any:
    """The train message's content as the app's server sends it: Message API records, or the legacy FitIns."""
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    if shape.name != "legacy":
        return RecordDict({"arrays": ArrayRecord(weights), "config": ConfigRecord({"lr": LR,
                                                                                    "server-round": server_round})})
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.compat.common.recorddict_compat import fitins_to_recorddict

    parameters = ndarrays_to_parameters([v.numpy() for v in weights.values()])
    return fitins_to_recorddict(FitIns(parameters, LEGACY_CONFIG | {"server_round": server_round}), keep_input=True)


def client_app(shape: Shape) -> Callable:
    if shape.name == "quickstart":
        from qsapp.client_app import app
    elif shape.name == "legacy":
        from legacyapp.client_app import app
    elif shape.name == "lightning":
        from aeapp.client_app import app
    else:
        from advapp.client_app import app
    return app


def reply_arrays(shape: Shape, reply: Any) -> dict[str, torch.Tensor]:
    """The weights a client sent back, by the model's state-dict names."""
    if shape.name != "legacy":
        return reply.content["arrays"].to_torch_state_dict()
    names = list(shape.spec().build().state_dict())
    arrays = reply.content.array_records["fitres.parameters"].to_numpy_ndarrays()
    return {n: torch.as_tensor(a) for n, a in zip(names, arrays, strict=True)}


def run_app(shape: Shape, out: Path, partitions: tuple[int, ...] = (0, 1), rounds: int = 1, seed: int = 0,
            client: Any = None) -> None:  # fmt: skip
    """``rounds`` FedAvg rounds of ``shape``'s own ClientApp (or ``client``) on ``partitions`` (node 21 + p), each
    train message answered through ``capture_mod`` into ``out``; the server's part (FedAvg of the replies by their
    examples) is done here. Each client keeps its own Context across rounds (its ``context.state``)."""
    from flwr.app import Context, Message, RecordDict

    from fedvit.capture.writer import capture_mod

    torch.manual_seed(seed)
    weights = shape.spec().build().state_dict()
    run_config = shape.run_config | {"fedvit-capture-dir": str(out)}
    contexts = {p: Context(run_id=9 + seed, node_id=21 + p, state=RecordDict(), run_config=run_config,
                           node_config={"partition-id": p, "num-partitions": len(partitions)})
                for p in partitions}  # fmt: skip
    app = client or client_app(shape)
    for server_round in range(1, rounds + 1):
        replies = []
        for p in partitions:
            message = Message(instruction(shape, weights, server_round), dst_node_id=21 + p, message_type="train")
            message.metadata.__dict__.update(_message_id=f"m{server_round}-{p}", _run_id=9 + seed,
                                             _group_id=str(server_round))  # fmt: skip
            torch.manual_seed(seed * 1000 + server_round * 10 + p)  # the client's own shuffles and crops
            reply = capture_mod(message, contexts[p], app)
            assert not reply.has_error(), reply.error
            replies.append(reply_arrays(shape, reply))
        weights = {n: sum(r[n].double() for r in replies).div(len(replies)).to(weights[n].dtype) for n in weights}


def audit(shape: Shape, captures: Path, out: Path, app: Path | None = None, partitions: tuple[int, ...] = (0, 1),
          **options: Any) -> dict[str, Any]:  # fmt: skip
    """``fedvit audit --model … --app … --data …`` of the capture, with a small image budget (the label and
    membership figures do not depend on it)."""
    from fedvit.audit.pipeline import AuditOptions, run_audit
    from fedvit.audit.user_data import UserData
    from fedvit.core.budget import AuditConfig

    data = UserData(f"tests.idiom_harness:{shape.loader}", {str(21 + p): p for p in partitions},
                    tuple(range(len(partitions), len(partitions) + 4)), str(shape.folder))  # fmt: skip
    budget = AuditConfig(iterations=5, restarts=1, max_seconds=20)
    return run_audit(captures, out, AuditOptions(spec=shape.spec(), budget=budget, data=data,
                                                 app=app or shape.folder, **options))  # fmt: skip


def fl_dp_sa_app(folder: Path) -> Path:
    """The legacy app with fl-dp-sa's components (central DP and SecAgg+) in its pyproject.toml."""
    shutil.copytree(LEGACY, folder, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("legacyapp.server_app:app", "legacyapp.dpsa_server_app:app")
                         .replace("legacyapp.client_app:app", "legacyapp.dpsa_client_app:app"))  # fmt: skip
    return folder


def run_fl_dp_sa(captures: Path, run_config: dict[str, Any]) -> None:
    """fl-dp-sa's combination in this process: 3 clients clip (``fixedclipping_mod``) and mask
    (``secaggplus_mod``), ``capture_mod`` outermost; the server app's own ``main`` unmasks the sum and adds the
    noise of ``DifferentialPrivacyClientSideFixedClipping``."""
    from flwr.app import Context, RecordDict
    from flwr.client.mod import fixedclipping_mod, secaggplus_mod
    from flwr.clientapp import ClientApp
    from legacyapp import dpsa_server_app
    from legacyapp.client_app import client_fn

    from fedvit.capture.writer import capture_mod
    from tests.secagg_harness import InProcessGrid

    app = ClientApp(client_fn=client_fn, mods=[capture_mod, secaggplus_mod, fixedclipping_mod])
    grid = InProcessGrid(app, 3, captures, 32)
    for context in grid.contexts.values():
        context.node_config["num-partitions"] = 3
        context.run_config.update(run_config)
    torch.manual_seed(0)
    dpsa_server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                       run_config=run_config))  # fmt: skip
