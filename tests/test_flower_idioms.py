"""The audit on apps written in the idioms of Flower's own PyTorch examples (tests/flower_idioms, each app our own
code in an example's shape): the quickstart's aliased loop and ``x.view`` CNN, the legacy ``client_fn`` with a
``NumPyClient``, a LightningModule autoencoder, central DP under SecAgg+ as fl-dp-sa sets it up. Each recipe value
is read from the code alone, with its source line; a model the audit cannot simulate is one line, not a
traceback."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn

from fedvit.attacks import simulation
from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.simulation import (
    LOWEST_COSINE_BOUND,
    ModelInputError,
    RecipeFit,
    fed_to_model,
    simulate,
    takes_channels_last,
)
from fedvit.audit.entries import UpdateAudit
from fedvit.audit.evidence import NOT_MEASURED, MembershipEvidence
from fedvit.audit.pipeline import probe_model
from fedvit.audit.secagg import BroadcastGap, gap_text, gap_to_broadcast
from fedvit.audit.summary import dp_finding
from fedvit.observed.app_code import App, app_sources, central_dp, load_app, read_code
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe, read_recipe
from tests.idiom_harness import (
    LEGACY,
    LIGHTNING,
    QUICKSTART,
    SHAPES,
    STATEFUL,
    audit,
    fl_dp_sa_app,
    run_app,
    run_fl_dp_sa,
)
from tests.test_app_code import exchange  # a captured exchange that carries only records


def line_of(app: Path, file: str, text: str) -> str:
    """``file:N`` of the first line of ``app``'s ``file`` that holds ``text``."""
    path = next(app.rglob(file))
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{file}:{number}"


# ---------------------------------------------------------------------------- the code, read as Python resolves it


def test_the_quickstarts_aliased_loop_gives_sgd_its_momentum_and_the_records_lr_and_epochs():
    """``from qsapp.task import train as train_fn`` called with the run config's epochs and the ConfigRecord's lr."""
    records = {"run config": {"batch-size": 16, "local-epochs": 2}, "ConfigRecord": {"lr": 0.01}}
    code = read_code(load_app(QUICKSTART), records)
    sgd, call = line_of(QUICKSTART, "task.py", "torch.optim.SGD("), line_of(QUICKSTART, "client_app.py", "train_fn(")
    assert (code.optimiser.value, code.optimiser.source) == ("sgd", sgd)
    assert code.momentum.value == 0.9 and code.momentum.source == sgd
    assert code.lr.value == 0.01 and code.lr.how == f"lr ← {call} ConfigRecord 'lr'"
    assert code.epochs.value == 2 and code.epochs.how == f"epochs ← {call} run config 'local-epochs'"
    assert code.batch_size.value == 16 and "run config 'batch-size'" in code.batch_size.how
    assert code.batch_size.source == line_of(QUICKSTART, "task.py", "trainloader = DataLoader(")
    assert code.loss.value == "cross-entropy" and code.trained.value == "the whole model"


def test_the_legacy_clients_fit_and_client_fn_give_the_optimiser_it_builds_and_the_loaders_batch_size():
    """``client_fn`` → ``load_data`` → ``DataLoader(batch_size=32, shuffle=True)``; the SGD built in ``fit`` from
    the server's fit config and handed to the loop."""
    records = {"run config": {}, "ConfigRecord": {"lr": 0.05, "momentum": 0.9, "local_epochs": 3}}
    code = read_code(load_app(LEGACY), records)
    sgd = line_of(LEGACY, "client_app.py", "torch.optim.SGD(")
    assert (code.optimiser.value, code.optimiser.source) == ("sgd", sgd)
    fit_config = f"on_fit_config ({line_of(LEGACY, 'server_app.py', 'return {')})"
    assert code.lr.value == 0.05 and code.lr.how == f"ConfigRecord 'lr', set by {fit_config}"
    assert code.momentum.value == 0.9 and code.momentum.how == f"ConfigRecord 'momentum', set by {fit_config}"
    assert code.epochs.value == 3 and "ConfigRecord 'local_epochs'" in code.epochs.how
    assert code.batch_size.value == 32  # the shuffled training loader's, not the test loader's
    assert code.batch_size.source == line_of(LEGACY, "task.py", "trainloader = DataLoader(")
    assert code.trained.value == "the whole model"  # ``self.model.parameters()`` of a NumPyClient
    client = read_recipe(exchange({}, records["ConfigRecord"], {"num-examples": 40}), "weights", {}, code)
    assert client.batch == 32 and client.epochs == 3 and client.steps == 6
    assert "whole local dataset" not in client.described()


def test_a_lightning_autoencoder_is_read_and_said_not_to_be_a_classifier_in_one_line():
    code = read_code(load_app(LIGHTNING), {"run config": {"max-epochs": 2}})
    adam = line_of(LIGHTNING, "task.py", "torch.optim.Adam(")
    assert (code.optimiser.value, code.optimiser.source, code.lr.value) == ("adam", adam, 0.001)
    assert code.epochs.value == 2 and code.epochs.how == "run config 'max-epochs'"
    assert code.batch_size.value == 32
    assert (code.loss.value, code.loss.source) == ("mse", line_of(LIGHTNING, "task.py", "F.mse_loss("))
    model = AutoEncoderStandIn()  # the module's own forward (its LightningModule: below), flat input only
    with pytest.raises(ModelInputError) as raised:
        probe_model(model, ModelSpec("aeapp.task:LitAutoEncoder", (1, 28, 28), (0.5,), (0.5,)), code)
    message = str(raised.value)
    assert "\n" not in message and "[2, 1, 28, 28] float32 images, contiguous in memory" in message
    assert "AutoEncoderStandIn" in message and "mse loss (task.py:" in message and "not a classifier" in message
    assert "Label counts do not apply" in message
    # a forward that does give [B, K] is no classifier either when the code trains it on a reconstruction loss
    flat = AutoEncoderStandIn()
    flat.encoder.insert(0, nn.Flatten())
    flat.pretrained_cfg = {"mean": (0.5,), "std": (0.5,)}  # as ModelSpec.build attaches them
    with pytest.raises(ModelInputError, match=r"^aeapp.task:LitAutoEncoder: the app's training code computes a mse"):
        probe_model(flat, ModelSpec("aeapp.task:LitAutoEncoder", (1, 28, 28), (0.5,), (0.5,)), code)
    probe_model(flat, ModelSpec("aeapp.task:LitAutoEncoder", (1, 28, 28), (0.5,), (0.5,)), None)  # nothing read


class AutoEncoderStandIn(nn.Module):
    """The LightningModule's ``forward`` (the encoder on flattened pixels), without Lightning."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def test_partials_module_imports_keywords_and_tuple_assignments_are_followed(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "task.py").write_text(textwrap.dedent("""
        import torch

        def fit(model, loader, optimiser, epochs):
            for _ in range(epochs):
                for x, y in loader:
                    optimiser.zero_grad()
                    optimiser.step()

        def make_loader(data, size):
            return torch.utils.data.DataLoader(data, batch_size=size, shuffle=True)
    """))
    (package / "client_app.py").write_text(textwrap.dedent("""
        import functools
        from torch import optim
        from flwr.clientapp import ClientApp
        from . import task

        app = ClientApp()

        @app.train()
        def train(msg, context):
            lr, size = msg.content["config"]["lr"], context.run_config["batch"]
            run = functools.partial(task.fit, epochs=context.run_config["epochs"])
            opt = optim.AdamW(msg.model.parameters(), lr, weight_decay=0.05)
            run(msg.model, task.make_loader(msg.data, size=size), optimiser=opt)
    """))
    code = read_code(App(*app_sources(tmp_path)), {"run config": {"batch": 8, "epochs": 4},
                                                   "ConfigRecord": {"lr": 3e-4}})  # fmt: skip
    assert code.optimiser.value == "adamw" and code.optimiser.source == "client_app.py:13"
    assert code.lr.value == 3e-4 and code.weight_decay.value == 0.05
    assert code.epochs.value == 4 and "run config 'epochs'" in code.epochs.how
    assert code.batch_size.value == 8 and "size ← client_app.py:14" in code.batch_size.how


# ---------------------------------------------------------------------------- central DP under SecAgg+


def test_central_dp_is_read_from_the_server_with_its_sources_and_said_of_every_update(tmp_path):
    config = {"noise-multiplier": 0.5, "clipping-norm": 4.0, "num-sampled-clients": 3}
    assert central_dp(load_app(LEGACY), {"run config": config}) is None  # its ServerApp component adds no noise
    app = load_app(fl_dp_sa_app(tmp_path / "app"))
    found = central_dp(app, {"run config": config})
    built = line_of(LEGACY, "dpsa_server_app.py", "DifferentialPrivacyClientSideFixedClipping(")
    assert (found.wrapper, found.source) == ("DifferentialPrivacyClientSideFixedClipping", built)
    assert found.noise_multiplier.value == 0.5 and found.noise_multiplier.how == "run config 'noise-multiplier'"
    assert found.clipping_norm.value == 4.0 and found.sampled_clients.value == 3
    assert math.isclose(found.noise_std, 0.5 * 4.0 / 3)
    assert found.client_mods == (f"fixedclipping_mod ({line_of(LEGACY, 'dpsa_client_app.py', 'ClientApp(')})",)
    assert central_dp(load_app(QUICKSTART), {}) is None
    code = read_code(app, {"run config": config, "ConfigRecord": {"lr": 0.05, "momentum": 0.9, "local_epochs": 1}})
    client = read_recipe(exchange(config, {"clipping_norm": 4.0}, {"num-examples": 40}), "weights", {}, code)
    sources = dict(client.sources)
    assert sources["central DP"].startswith(f"central DP: DifferentialPrivacyClientSideFixedClipping ({built})")
    assert "std 0.667 per entry" in sources["central DP"] and client.update_clip == 4.0
    unmeasured = {"membership": MembershipEvidence(NOT_MEASURED, "not in this test")}
    update = UpdateAudit("u", recipe_sources=list(client.sources), leakage=unmeasured)
    assert "central DP in the app's code" in dp_finding([update]).why
    assert dp_finding([UpdateAudit("u", leakage=unmeasured)]).why == "no DP claim on record"


def test_an_aggregates_gap_to_the_next_broadcast_is_said_as_the_noise_it_is():
    rng = np.random.default_rng(0)
    rebuilt = [rng.standard_normal((40, 30)), rng.standard_normal(30)]
    noised = [a + 0.2 * rng.standard_normal(a.shape) for a in rebuilt]
    entry = gap_to_broadcast(rebuilt, noised, 0.2)
    text = gap_text(entry)
    assert "central-DP noise, of expected std σ·C/N = 0.2" in text and "equals" not in text
    assert 0.9 < entry.next_broadcast_rms_difference / 0.2 < 1.1
    largest = max(float(np.abs(b - a).max()) for a, b in zip(rebuilt, noised, strict=True))
    assert entry.next_broadcast_max_difference == largest
    unexplained = gap_text(gap_to_broadcast(rebuilt, noised, None))
    assert "the server changed the aggregate" in unexplained and "equals" not in unexplained
    quantised = [a + 1e-6 for a in rebuilt]
    assert "equals the next round's broadcast" in gap_text(gap_to_broadcast(rebuilt, quantised, None))
    assert gap_to_broadcast(rebuilt, rebuilt[:1], None) == BroadcastGap(None)  # the shapes differ


# ---------------------------------------------------------------------------- the user's model, fed as it accepts


def view_observation() -> tuple[Observation, Auxiliary]:
    """A FedAvg update of the quickstart's CNN (``x.view`` after the convolutions), 12 images in batches of 4."""
    torch.manual_seed(0)
    spec = ModelSpec("qsapp.task:Net", app_dir=str(QUICKSTART))
    model = spec.build()
    state = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(12, 4, 1, 0.05, 0.9, 0.0, 0, False, optimiser="sgd")
    obs = Observation(state, state, 10, spec=spec, skeleton=model, client=client, head_bias="fc3.bias")
    rng = np.random.default_rng(1)
    aux = Auxiliary(rng.random((30, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 30), "generated")
    return obs, aux


def test_a_view_model_is_simulated_in_the_default_layout_with_the_same_figures():
    from qsapp.task import Net  # on sys.path through tests.idiom_harness

    obs, aux = view_observation()
    counts = np.array([2, 1, 1, 2, 1, 1, 1, 1, 1, 1])
    assert not takes_channels_last(Net(), (3, 32, 32))
    found = simulate(obs, aux, counts, 0.9, 3, keep_weights=True)
    # the fallback is the default layout exactly: the same simulation with the layout pinned to it
    with mock.patch.object(simulation, "takes_channels_last", lambda model, shape: False):
        plain = simulate(obs, aux, counts, 0.9, 3, keep_weights=True)
    np.testing.assert_array_equal(found.system, plain.system)
    for name, value in found.weights.items():
        np.testing.assert_array_equal(value, plain.weights[name], err_msg=name)
    # without the check (channels-last forced on) the user's model raises: the check is what keeps it running
    with mock.patch.object(simulation, "takes_channels_last", lambda model, shape: True), pytest.raises(
            RuntimeError, match="view size is not compatible"):  # fmt: skip
        simulate(obs, aux, counts, 0.9, 3)


def test_a_model_that_reads_memory_order_silently_is_also_given_the_default_layout():
    class ReadsMemory(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3 * 8 * 8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # strides as written, not the logical order
            return self.fc(torch.as_strided(x, (x.shape[0], 3 * 8 * 8), (3 * 8 * 8, 1)))

    class Flattens(ReadsMemory):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.flatten(1))

    assert not takes_channels_last(ReadsMemory(), (3, 8, 8))
    assert takes_channels_last(Flattens(), (3, 8, 8))  # a layout-agnostic model keeps the faster path


def test_a_model_that_fails_on_the_audits_input_is_one_line_naming_what_was_fed():
    from legacyapp.task import Net as GreyNet
    model = ModelSpec("legacyapp.task:Net", (1, 28, 28), (0.5,), (0.5,), app_dir=str(LEGACY)).build()
    assert isinstance(model, GreyNet)
    with pytest.raises(ModelInputError) as raised:
        fed_to_model(model, torch.rand(2, 3, 32, 32), "contiguous")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("the model legacyapp.task.Net failed on [2, 3, 32, 32] float32")
    assert "expecting logits [2, classes]" in message and "RuntimeError" in message
    assert fed_to_model(model, torch.rand(2, 1, 28, 28), "contiguous").shape == (2, 10)
    identity = nn.Identity()
    identity.pretrained_cfg = {"mean": (0.5,), "std": (0.5,)}  # as ModelSpec.build attaches them
    with pytest.raises(ModelInputError, match=r"returned \[2, 1, 28, 28\] for .*, not logits"):
        fed_to_model(identity, torch.rand(2, 1, 28, 28), "contiguous")


# ---------------------------------------------------------------------------- a fit bound that can fail


@pytest.mark.parametrize("own", [0.999, 0.9, 0.6, 0.2, -0.5])
def test_every_cosine_bound_can_fail(own):
    """However much two simulations of a recipe differ, some update fails the direction check; where they differ
    so much that the bound would fall below LOWEST_COSINE_BOUND, the direction is unresolved and nothing fits."""
    fitting = RecipeFit("SGD β 0.9", 1.0, 0.999, (0.3, 0.3), own)
    opposite = RecipeFit("SGD β 0.9", 1.0, -0.999, (0.3, 0.3), own)
    assert not opposite.fits
    if fitting.direction_unresolved:
        assert fitting.cosine_bound < LOWEST_COSINE_BOUND and not fitting.fits and "unresolved" in (
            fitting.described())  # fmt: skip
    else:
        assert fitting.cosine_bound >= LOWEST_COSINE_BOUND and fitting.fits


def test_a_head_kept_in_the_clients_state_and_crops_with_padding_are_named():
    """advanced-pytorch's shape: the head restored from ``context.state`` before training, ``RandomCrop`` with
    padding: both are said in the recipe, and a recipe that does not fit says the state it could not restore."""
    stateful = STATEFUL
    records = {"run config": {"batch-size": 32, "local-epochs": 1}, "ConfigRecord": {"lr": 0.1}}
    code = read_code(load_app(stateful), records)
    restored = line_of(stateful, "client_app.py", "net.fc2.load_state_dict(")
    assert (code.kept_state.value, code.kept_state.source) == ("net.fc2", restored)
    assert code.optimiser.value == "sgd" and code.lr.value == 0.1 and code.batch_size.value == 32
    assert [t.name for t in code.transforms] == ["RandomCrop", "RandomHorizontalFlip"]
    client = read_recipe(exchange({}, records["ConfigRecord"]), "weights", {}, code)
    sources = dict(client.sources)
    assert sources["client state"].startswith(f"net.fc2 restored from the client's context.state (app code: "
                                              f"{restored})")  # fmt: skip
    crop = line_of(stateful, "task.py", "TRAIN_TRANSFORMS = ")
    assert sources["augmentation"] == (f"random crop with padding 4 + horizontal flip (app code: RandomCrop(28, "
                                       f"padding=4) {crop}, RandomHorizontalFlip() {crop})")  # fmt: skip
    assert client.augment.padding == 4 and client.augment.flip and client.augment.crop_scale is None
    assert read_code(load_app(QUICKSTART), {}).kept_state is None


# ---------------------------------------------------------------------------- the apps' own ClientApps, audited


@pytest.mark.parametrize("name", ["quickstart", "legacy"])
def test_the_apps_own_clientapps_are_captured_and_audited_with_the_recipe_from_their_code(tmp_path, name):
    """The quickstart-shaped app (Message API, ``x.view``, ``{"img", "label"}`` batches) and the legacy one
    (``client_fn`` + NumPyClient, grey ``{"image", "label"}`` batches, the batch size only in its DataLoader): each
    ClientApp trains for real, capture_mod records it, and the audit reads the recipe from the code alone and gives
    label counts, judged, without a traceback."""
    shape = SHAPES[name]
    run_app(shape, tmp_path / "cap")
    report = audit(shape, tmp_path / "cap", tmp_path / "out")
    assert len(report["updates"]) == 2
    for update in report["updates"]:
        sources = dict(update["recipe-sources"])
        assert sources["optimiser"].startswith("sgd (app code: ") and update["batch"] == shape.batch
        assert update["examples"] == shape.examples and update["steps"] == math.ceil(shape.examples / shape.batch)
        assert sources["batch-size"].startswith(f"{shape.batch} (app code: task.py:")
        assert sources["momentum"].startswith("0.9 (app code: ") and sources["lr"].startswith("0.05 (app code: ")
        assert not [a for a in update["assumptions"] if a.startswith(("batch-size", "epochs", "lr", "momentum"))]
        labels = update["leakage"]["labels"]
        assert labels["status"] == "measured", labels
        assert labels["error"] <= labels["null-error"], labels  # the counts beat the prior on every client
    assert "central DP" not in dict(report["updates"][0]["recipe-sources"])  # its own ServerApp adds no noise


def test_a_client_that_keeps_its_head_is_audited_and_its_second_round_says_so(tmp_path):
    """advanced-pytorch's shape over two rounds: from round 2 each client trains from the head in its
    ``context.state``, not the one it received; every update's recipe says so, and where a recipe does not fit,
    the withheld figure names that state."""
    shape = SHAPES["stateful"]
    run_app(shape, tmp_path / "cap", rounds=2)
    report = audit(shape, tmp_path / "cap", tmp_path / "out")
    assert len(report["updates"]) == 4
    restored = line_of(STATEFUL, "client_app.py", "net.fc2.load_state_dict(")
    for update in report["updates"]:
        sources = dict(update["recipe-sources"])
        assert sources["client state"].startswith(f"net.fc2 restored from the client's context.state (app code: "
                                                  f"{restored})")  # fmt: skip
        assert "RandomCrop(28, padding=4)" in sources["augmentation"]
        labels = update["leakage"]["labels"]
        if labels["status"] == "not measured" and "does not fit" in labels.get("why", ""):
            assert "net.fc2 restored from the client's context.state" in labels["why"], labels


def test_the_fl_dp_sa_shaped_app_is_audited_with_its_central_dp_and_noise_said(tmp_path):
    """fl-dp-sa's combination run in this process: the clients clip (``fixedclipping_mod``) and mask
    (``secaggplus_mod``), the server unmasks the sum and ``DifferentialPrivacyClientSideFixedClipping`` adds its
    noise. The report names σ, C and N with their source and states the aggregate's gap to the next broadcast as
    that noise, measured beside its expected std σ·C/N."""
    from fedvit.audit.pipeline import AuditOptions, run_audit
    from fedvit.core.budget import AuditConfig

    folder = fl_dp_sa_app(tmp_path / "app")
    run_config = {"num-server-rounds": 2, "noise-multiplier": 0.1, "clipping-norm": 1.0, "num-sampled-clients": 3}
    run_fl_dp_sa(tmp_path / "cap", run_config)
    spec = ModelSpec("legacyapp.task:Net", (1, 28, 28), (0.5,), (0.5,), app_dir=str(LEGACY))
    options = AuditOptions(spec=spec, budget=AuditConfig(iterations=5, restarts=1, max_seconds=20), app=folder)
    report = run_audit(tmp_path / "cap", tmp_path / "out", options)
    first = report["secure-aggregation"]["rounds"][0]
    assert first["aggregate"].startswith("rebuilt") and math.isclose(first["central-dp-std"], 0.1 * 1.0 / 3)
    assert 0.8 < first["next-broadcast-rms-difference"] / first["central-dp-std"] < 1.2, first  # the noise, measured
    text = (tmp_path / "out" / "audit.md").read_text()
    assert "the server's central-DP noise, of expected std σ·C/N = 0.0333" in text and "equals" not in text
    built = line_of(folder, "dpsa_server_app.py", "DifferentialPrivacyClientSideFixedClipping(")
    aggregate = report["updates"][0]
    central = dict(aggregate["recipe-sources"])["central DP"]
    assert central.startswith(f"central DP: DifferentialPrivacyClientSideFixedClipping ({built})")
    assert "σ 0.1 (" in central and "run config 'noise-multiplier'" in central and "C 1 (" in central
    assert "clipping" in dict(aggregate["recipe-sources"])["update clipping"]
    dp_cell = next(f for f in report["findings"] if f["client"] == "the aggregate (SecAgg+)")["dp-claim"]
    assert "central DP in the app's code" in dp_cell["why"], dp_cell


def test_weights_set_from_the_received_parameters_are_no_kept_state():
    """The legacy client's ``set_weights`` builds its state dict from ``net.state_dict()`` and the received
    parameters: that is not the client's own state."""
    assert read_code(load_app(LEGACY), {}).kept_state is None


def failing_loader(partition_id: int):
    raise KeyError(f"no partition {partition_id} in this split")


def tiny_loader(partition_id: int):
    """Images of the wrong size for the quickstart CNN (28 px grey)."""
    return np.zeros((4, 1, 28, 28), np.float32), np.zeros(4, np.int64)


@pytest.mark.parametrize(("loader", "message"), [
    ("failing_loader", r"--data tests.test_flower_idioms:failing_loader\(0\) raised KeyError: 'no partition 0"),
    ("tiny_loader", r"gives images \[1, 28, 28\] \(C, H, W\), the model takes \[3, 32, 32\] \(--input\)"),
])  # fmt: skip
def test_a_loader_that_fails_or_does_not_fit_the_model_is_one_line(tmp_path, loader, message):
    from fedvit.audit.pipeline import AuditOptions, run_audit
    from fedvit.audit.user_data import UserData
    from fedvit.capture.reader import AuditInputError
    from fedvit.core.budget import AuditConfig

    shape = SHAPES["quickstart"]
    run_app(shape, tmp_path / "cap", partitions=(0,))
    data = UserData(f"tests.test_flower_idioms:{loader}", {"21": 0}, (), str(QUICKSTART))
    options = AuditOptions(spec=shape.spec(), budget=AuditConfig(iterations=1, restarts=1), data=data, app=QUICKSTART)
    with pytest.raises(AuditInputError, match=message) as raised:
        run_audit(tmp_path / "cap", tmp_path / "out", options)
    assert "\n" not in str(raised.value)


def test_the_legacy_servers_fit_config_names_where_the_clients_lr_is_set():
    """``on_fit_config_fn`` is read with its line: beside the captured ConfigRecord's value, and in its place
    where the capture lacks it (a code-only read)."""
    set_at = line_of(LEGACY, "server_app.py", 'return {"lr": 0.05')
    captured = read_code(load_app(LEGACY), {"ConfigRecord": {"lr": 0.05, "momentum": 0.9, "local_epochs": 2}})
    assert captured.lr.how == f"ConfigRecord 'lr', set by on_fit_config ({set_at})"
    code_only = read_code(load_app(LEGACY), {})
    assert code_only.lr.value == 0.05 and code_only.lr.how == f"ConfigRecord 'lr' as on_fit_config ({set_at}) sets it"
    assert code_only.epochs.value == 1 and code_only.momentum.value == 0.9


def test_the_lightning_autoencoder_trains_is_captured_and_the_audit_refuses_it_in_one_line(tmp_path, capsys):
    """quickstart-pytorch-lightning's shape, run for real: Lightning's Trainer fits the module inside the ClientApp,
    capture_mod records it; ``fedvit audit`` exits 2 with one line that says why nothing of it is measured."""
    from fedvit.app.cli import main

    shape = SHAPES["lightning"]
    run_app(shape, tmp_path / "cap")
    argv = ["audit", str(tmp_path / "cap"), "--out", str(tmp_path / "out"), "--model", shape.factory, "--app-dir",
            str(LIGHTNING), "--app", str(LIGHTNING), "--input", "1,28,28", "--mean", "0", "--std", "1"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    stderr = capsys.readouterr().err
    (error,) = [line for line in stderr.splitlines() if line.startswith("fedvit audit: ")]  # beside the progress bar
    assert "Traceback" not in stderr and error.startswith("fedvit audit: the model aeapp.task.LitAutoEncoder failed")
    assert f"mse loss ({line_of(LIGHTNING, 'task.py', 'F.mse_loss(')})" in error and "not a classifier" in error


def test_counts_on_an_assumed_batch_size_rest_on_it_and_on_a_stated_one_do_not():
    """New weights whose batch size no record and no code states (the whole local dataset assumed): the label
    counts rest on that assumption and are never judged; stated in a record, nothing is assumed."""
    import dataclasses

    from fedvit.audit.registry import counts_rest_on

    obs, _ = view_observation()
    assumed = read_recipe(exchange({}, {"lr": 0.05, "local-epochs": 1}, {"num-examples": 12}), "weights", {})
    assert "assumed" in assumed.source_of("batch-size")
    why = counts_rest_on(dataclasses.replace(obs, client=dataclasses.replace(assumed, optimiser="sgd")))
    assert why.startswith("values no record and no code states (batch-size 12 (assumed: the whole local dataset)")
    stated = read_recipe(exchange({"batch-size": 4}, {"lr": 0.05, "local-epochs": 1}, {"num-examples": 12}),
                         "weights", {})  # fmt: skip
    assert counts_rest_on(dataclasses.replace(obs, client=dataclasses.replace(stated, optimiser="sgd"))) is None
