"""``fedvit audit-app``: what it reads from an app's code (model, arguments, Normalize, the clients' loader), the
loader's results as the audit's arrays, the staged copy that captures the app's own ClientApp, the CI gate, and an
audit of a capture whose figures equal those of the flag-driven audit of the same capture."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fedvit.app.audit_app import (
    AuditAppError,
    Discovered,
    audit_app,
    discover,
    discover_normalisation,
    read_project,
    stage_with_capture,
)
from fedvit.audit.app_loader import pick_split, to_arrays
from fedvit.audit.gate import judge, parse_fail_on
from fedvit.audit.summary import LEAKS, NO_EVIDENCE, UNSEEABLE, ClientFinding, Finding
from fedvit.capture.reader import AuditInputError, Exchange
from fedvit.observed.app_code import load_app
from fedvit.observed.app_facts import LoaderCall, read_loader, read_model, read_normalisation
from tests.idiom_harness import LEGACY, QUICKSTART, SHAPES, STATEFUL, run_app
from tests.test_flower_idioms import line_of

HEADAPP = Path(__file__).parent / "headapp"
BUDGET = {"iterations": 5, "restarts": 1, "max_seconds": 20}


# ---------------------------------------------------------------------------- read from the code


def test_the_model_its_arguments_and_normalize_are_read_with_their_sources():
    """quickstart-pytorch's ``Net()`` and ``Normalize((0.5, 0.5, 0.5), …)``; the legacy app's ``Net(num_classes=10)``
    and grey ``Normalize((0.5,), (0.5,))``; the head example's ``get_model(int(context.run_config["num-classes"]))``
    read from the run config; ``Normalize(*FM_NORMALIZATION)`` through its module constant."""
    model = read_model(load_app(QUICKSTART), {})
    assert model.read and model.factory.value == "qsapp.task:Net" and model.args == {}
    assert model.factory.source == line_of(QUICKSTART, "client_app.py", "model = Net()")
    mean, std = read_normalisation(load_app(QUICKSTART), {})
    assert mean.value == std.value == (0.5, 0.5, 0.5) and mean.source == line_of(QUICKSTART, "task.py", "Normalize(")

    legacy = read_model(load_app(LEGACY), {})
    assert legacy.factory.value == "legacyapp.task:Net" and legacy.args["num_classes"].value == 10
    assert read_normalisation(load_app(LEGACY), {})[0].value == (0.5,)

    head = read_model(load_app(HEADAPP), {"num-classes": 7})
    assert head.factory.value == "vithead.task:get_model"
    assert head.args["num_classes"].value == 7 and "num-classes" in head.args["num_classes"].how
    assert read_normalisation(load_app(STATEFUL), {})[0].value == (0.286,)


def test_a_normalisation_written_out_and_constants_unpacked_from_a_tuple_are_read(tmp_path):
    """The head app writes its normalisation out, ``(x - torch.tensor(MEAN).view(…)) / torch.tensor(STD).view(…)``
    with ``MEAN, STD = (…), (…)``: read with its line (it was read as no normalisation at all: mean 0, std 1). An
    arithmetic ``(n - 1) / 2`` is not pixels; a written-out pair that disagrees with a Normalize is refused."""
    mean, std = read_normalisation(load_app(HEADAPP), {})
    assert mean.value == (0.485, 0.456, 0.406) and std.value == (0.229, 0.224, 0.225) and "written out" in mean.how
    assert mean.source == line_of(HEADAPP, "task.py", "return (x - torch.tensor(MEAN)")
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "pyproject.toml").write_text((QUICKSTART / "pyproject.toml").read_text())
    shutil.copytree(QUICKSTART / "qsapp", folder / "qsapp", ignore=shutil.ignore_patterns("__pycache__"))
    task = folder / "qsapp" / "task.py"
    text = task.read_text()
    task.write_text(text + "\n\ndef middle(n):\n    return (n - 1) / 2\n")
    assert read_normalisation(load_app(folder), {})[0].value == (0.5, 0.5, 0.5)
    task.write_text(text + "\n\ndef norm(x):\n    return (x - np.array([0.4, 0.4, 0.4])) / np.array([0.2, 0.2, 0.2])\n")
    mean, _ = read_normalisation(load_app(folder), {})
    assert mean.value is None and "several Normalize settings" in mean.how


def test_a_normalisation_through_local_tensors_of_module_constants_is_read(tmp_path):
    """The third-party app binds ``mean = torch.tensor(MEAN).view(1, 3, 1, 1)`` (and ``std``) in a function and
    returns ``(x - mean) / std``: read as MEAN and STD with that line (it was read as no normalisation: mean 0,
    std 1, and every figure of its audit-app run moved). A local name bound to different constants in two places
    of the module is not guessed."""
    app = Path(__file__).parent / "thirdparty_app"
    mean, std = read_normalisation(load_app(app), {})
    assert mean.value == std.value == (0.5, 0.5, 0.5) and "written out" in mean.how
    assert mean.source == line_of(app, "task.py", "return (x - mean) / std")
    folder = tmp_path / "app"
    shutil.copytree(app, folder, ignore=shutil.ignore_patterns("__pycache__"))
    task = folder / "cnnapp" / "task.py"
    task.write_text(task.read_text() + "\n\ndef other():\n    mean = torch.tensor((0.4, 0.4, 0.4))\n    return mean\n")
    mean, _ = read_normalisation(load_app(folder), {})
    assert mean.value is None and "(x - mean) / std: its values are not read" in mean.how
    assert line_of(folder, "task.py", "return (x - mean) / std") + ": (x - mean)" in mean.how
    with pytest.raises(AuditAppError, match="give --mean and --std"):
        discover_normalisation(Discovered({}), load_app(folder), {}, {})


def test_the_clients_loader_is_the_call_that_takes_the_partition():
    quickstart = read_loader(load_app(QUICKSTART))
    assert isinstance(quickstart, LoaderCall) and quickstart.function == "qsapp.task:load_data"
    assert quickstart.source == line_of(QUICKSTART, "client_app.py", "load_data(partition_id")
    args, _ = quickstart.arguments(1, 4, {"batch-size": 16})
    assert args == [1, 4, 16]
    head = read_loader(load_app(HEADAPP))  # local_data(context): the Context is built per partition
    assert isinstance(head, LoaderCall) and head.function == "vithead.client_app:local_data" and head.context_params


def test_a_loader_that_takes_the_context_is_called_with_one_built_per_partition():
    """The head example's ``local_data(context)`` (partition from the node config, sizes and seed from the run
    config): the auditor's call gives the images the user's own loader gives, in [0, 1]."""
    import tomllib

    from fedvit.audit.app_loader import AppLoader

    sys.path.insert(0, str(HEADAPP))
    from vithead_data import partition

    run_config = tomllib.loads((HEADAPP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    loader = AppLoader(read_loader(load_app(HEADAPP)), str(HEADAPP), run_config, 2, (0.0,), (1.0,))
    for p in (0, 1):
        images, labels = loader(p)
        want, want_labels = partition(p)
        np.testing.assert_allclose(images, want.numpy(), rtol=0, atol=1e-7)
        assert labels.tolist() == want_labels
    with pytest.raises(AuditInputError, match="no held-out split"):
        loader(2)
    # its normalisation is written out for the batches it trains on: the loader's images are raw, not undone
    mean, std = (m.value for m in read_normalisation(load_app(HEADAPP), {}))
    raw = AppLoader(read_loader(load_app(HEADAPP)), str(HEADAPP), run_config, 2, mean, std, undo=False)
    np.testing.assert_allclose(raw(1)[0], partition(1)[0].numpy(), rtol=0, atol=1e-7)


def app_copy(tmp_path: Path, old: str, new: str) -> Path:
    folder = tmp_path / "app"
    shutil.copytree(QUICKSTART, folder, ignore=shutil.ignore_patterns("__pycache__"))
    client = folder / "qsapp" / "client_app.py"
    assert old in client.read_text()
    client.write_text(client.read_text().replace(old, new))
    return folder


def test_a_model_built_behind_a_helper_is_one_line_naming_model(tmp_path):
    """The model comes out of a helper that takes the Context: what it builds is decided at run time, so the
    audit refuses in one line that names --model instead of guessing."""
    folder = app_copy(tmp_path, "    model = Net()\n", "    model = build_model(context)\n")
    found = read_model(load_app(folder), {})
    assert not found.read and "context" in found.unread_reason()
    run_app(SHAPES["quickstart"], tmp_path / "cap")
    with pytest.raises(AuditAppError, match="give --model package.module:factory"):
        discover(folder, tmp_path / "cap", {})
    assert discover(folder, tmp_path / "cap", {"model": "qsapp.task:Net"}).keywords["model"] == "qsapp.task:Net"


# ---------------------------------------------------------------------------- the loader's results as arrays


class Items(Dataset):
    def __init__(self, n: int = 6):
        self.x = torch.rand(n, 3, 8, 8)
        self.y = torch.arange(n) % 3

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"img": self.x[i], "label": int(self.y[i])}


def test_dataloaders_datasets_and_arrays_become_the_audits_images_and_labels():
    items = Items()
    for data in (DataLoader(items, batch_size=4, shuffle=True), items):
        images, labels = to_arrays(data, "test")
        np.testing.assert_allclose(images, items.x.numpy(), rtol=0, atol=1e-7)  # in order, never shuffled
        assert labels.tolist() == items.y.tolist()
    pairs = DataLoader(list(zip(items.x, items.y, strict=True)), batch_size=4)  # (x, y) batches
    assert to_arrays(pairs, "test")[1].tolist() == items.y.tolist()
    images, labels = to_arrays((items.x.numpy(), items.y.numpy()), "test")
    assert images.shape == (6, 3, 8, 8) and labels.dtype == np.int64
    loaders = (DataLoader(items), DataLoader(Items(2)))
    assert pick_split(loaders, 1, "test") is loaders[1]
    with pytest.raises(AuditInputError, match="no held-out split"):
        pick_split((items.x, items.y), 1, "test")
    with pytest.raises(AuditInputError, match="cannot read images"):
        to_arrays(42, "test")


# ---------------------------------------------------------------------------- the staged copy


def test_the_staged_copy_wraps_the_users_clientapp_and_leaves_the_users_files_alone(tmp_path):
    """The copy's clientapp component is a module that wraps the user's ClientApp; it answers a train message
    through capture_mod (recorded) and the app's own handler (the reply the user's app gives)."""
    before = {p: p.read_bytes() for p in QUICKSTART.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    staged = stage_with_capture(read_project(QUICKSTART), tmp_path / "stage")
    assert {p: p.read_bytes() for p in before} == before
    project = read_project(staged)
    assert project.clientapp == "fedvit_audited_clientapp:app" and "fedvit-capture-dir" in project.config
    spec = importlib.util.spec_from_file_location("wrapped", staged / "fedvit_audited_clientapp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from flwr.clientapp import ClientApp

    assert isinstance(module.app, ClientApp)
    sys.modules["tests.staged_wrapper"] = module
    run_app(SHAPES["quickstart"], tmp_path / "cap", client=module.app)
    assert len(list((tmp_path / "cap").rglob("node-*.json"))) == 4  # capture_mod in run_app, and the wrapper's


def test_the_supernodes_come_from_the_apps_federation_else_flowers_default(tmp_path):
    assert read_project(QUICKSTART).supernodes == (2, "pyproject.toml [tool.flwr.federations.local-simulation]")
    folder = tmp_path / "bare"
    folder.mkdir()
    with pytest.raises(AuditAppError, match="no pyproject.toml"):
        read_project(folder)


# ---------------------------------------------------------------------------- the gate


def findings(labels: str, membership: str = NO_EVIDENCE) -> list[ClientFinding]:
    cell = lambda word: Finding(word)  # noqa: E731
    return [ClientFinding("partition 0", ("u",), cell(labels), cell(membership), cell(NO_EVIDENCE),
                          Finding("not measured", why="no DP claim on record"))]  # fmt: skip


def test_fail_on_fails_on_a_named_leak_and_on_unverified_only_when_asked():
    assert judge(parse_fail_on("labels"), findings(LEAKS), {})[0]
    assert not judge(parse_fail_on("membership"), findings(LEAKS), {})[0]
    assert judge(parse_fail_on("any"), findings(NO_EVIDENCE, LEAKS), {})[0]
    failed, lines = judge(parse_fail_on("labels"), findings(UNSEEABLE), {})
    assert not failed and lines == ["not verified: labels: partition 0: could not have seen"]
    assert judge(parse_fail_on("labels,unverified"), findings(UNSEEABLE), {})[0]
    assert not judge(parse_fail_on("dp,unverified"), findings(NO_EVIDENCE), {})[0]  # no claim: nothing to verify
    with pytest.raises(ValueError, match="--fail-on takes"):
        parse_fail_on("labels,pixels")


# ---------------------------------------------------------------------------- the audit, read from the app


def test_an_audit_of_a_capture_read_from_the_app_equals_the_flag_driven_audit(tmp_path):
    """The quickstart-shaped app's capture, audited by ``audit_app(captures=…)`` with no other input, gives the
    figures of ``audit_captures`` with every flag written out (the model, its input, Normalize's mean and std, a
    hand-written loader of the same images, the decoys), and its report lists each read value with its source."""
    from fedvit.audit.api import audit_captures

    run_app(SHAPES["quickstart"], tmp_path / "cap")
    found = audit_app(QUICKSTART, captures=tmp_path / "cap", out=tmp_path / "read", **BUDGET)
    flags = audit_captures(
        tmp_path / "cap", out=tmp_path / "flags", model="qsapp.task:Net", input_shape=[3, 32, 32],
        mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], app_dir=QUICKSTART, data="tests.idiom_harness:qs_partition",
        decoy_partitions="2-3", app=QUICKSTART, **BUDGET,
    )  # fmt: skip
    assert found.report["findings"] == flags.report["findings"]
    for mine, theirs in zip(found.report["updates"], flags.report["updates"], strict=True):
        assert mine["labels"] == theirs["labels"] and mine["recipe"] == theirs["recipe"]
        for kind in ("labels", "membership", "images"):
            a, b = mine["leakage"][kind], theirs["leakage"][kind]
            assert a.keys() == b.keys()
            for key in a:
                if isinstance(a[key], float):
                    assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (kind, key)
    facts = {f["what"]: f for f in found.report["read-from-app"]}
    assert facts["model"]["source"] == line_of(QUICKSTART, "client_app.py", "model = Net()")
    assert facts["mean"]["source"].startswith(line_of(QUICKSTART, "task.py", "Normalize("))
    assert facts["clients' data"]["source"] == line_of(QUICKSTART, "client_app.py", "load_data(partition_id")
    assert facts["input"]["value"] == "3×32×32"
    markdown = (tmp_path / "read" / "audit.md").read_text()
    assert "Read from the app" in markdown and facts["model"]["source"] in markdown
    assert json.loads((tmp_path / "flags" / "audit.json").read_text())["read-from-app"] == []


# ---------------------------------------------------------------------------- nodes without partition ids (a tap)


def trained_exchange(node: int, images: torch.Tensor, labels: torch.Tensor, seed: int) -> Exchange:
    """One client's FedAvg update of quickstart's Net (1 epoch, batch 8, SGD lr 0.05 with momentum), as a tap would
    record it: the arrays and the reply's metrics, no node config."""
    from qsapp.task import Net

    torch.manual_seed(seed)
    model = Net()
    received = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for start in range(0, len(labels), 8):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(images[start:start + 8]), labels[start:start + 8]).backward()
        optimiser.step()
    sent = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return Exchange(Path(f"node-{node}"), 1, 1, node, None, None, received, sent, {}, {"num-examples": len(labels)},
                    {})  # fmt: skip


def client_data(labels_of: list[np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {p: (rng.random((len(y), 3, 32, 32)).astype(np.float32), y) for p, y in enumerate(labels_of)}


def test_four_tapped_nodes_with_dirichlet_partitions_are_each_matched_to_their_own():
    """4 clients of 32 images with Dirichlet(0.3) class shares, captured without partition ids and shuffled:
    every node is matched to the partition it trained on, each with its fit and runner-up."""
    from fedvit.audit.node_matching import match_nodes

    rng = np.random.default_rng(3)
    data = client_data([rng.choice(10, 32, p=rng.dirichlet([0.3] * 10)) for _ in range(4)])
    truth = {100 + 7 * p: p for p in data}
    exchanges = [trained_exchange(n, torch.from_numpy(data[p][0]), torch.from_numpy(data[p][1]), seed=p)
                 for n, p in reversed(list(truth.items()))]  # fmt: skip
    matches = match_nodes(exchanges, "fc3.bias", list(data), lambda p: data[p])
    assert {m.node: m.partition for m in matches} == {str(n): p for n, p in truth.items()}
    assert all(m.fit > m.runner_up_fit for m in matches)
    assert "inferred, fit" in matches[0].described() and "runner-up partition" in matches[0].described()


def test_iid_partitions_of_equal_size_are_said_to_be_ambiguous_instead_of_guessed():
    """Each partition holds the same count of every class (IID, equal size): the updates cannot tell them apart,
    and the audit refuses in one line that names --partition."""
    from fedvit.audit.node_matching import match_nodes

    rng = np.random.default_rng(4)
    data = client_data([rng.permutation(np.repeat(np.arange(10), 3)) for _ in range(4)])
    exchanges = [trained_exchange(200 + p, torch.from_numpy(x), torch.from_numpy(y), seed=p)
                 for p, (x, y) in data.items()]  # fmt: skip
    with pytest.raises(AuditInputError, match="cannot be told apart.*give --partition NODE=PARTITION"):
        match_nodes(exchanges, "fc3.bias", list(data), lambda p: data[p])


def strip_partition_ids(captures: Path) -> None:
    """Take every partition id and node config out of a capture_mod capture: what a ``fedvit tap`` records."""
    for manifest in captures.rglob("node-*.json"):
        head = json.loads(manifest.read_text())
        head["partition"] = None
        head["node-config"] = {}
        for side in ("received", "sent"):
            if isinstance(head.get(side), dict):
                head[side].pop("node-config", None)
        manifest.write_text(json.dumps(head))


def test_audit_app_matches_the_nodes_of_a_capture_without_partition_ids(tmp_path):
    """The quickstart-shaped app's capture with every partition id taken out (what a tap records): the nodes are
    matched by their updates, and the report says the map was inferred."""
    run_app(SHAPES["quickstart"], tmp_path / "cap")
    strip_partition_ids(tmp_path / "cap")
    found = audit_app(QUICKSTART, captures=tmp_path / "cap", out=tmp_path / "out", leakage="labels", **BUDGET)
    assert [u["partition"] for u in found.report["updates"]] == [0, 1]  # run_app's nodes 21 + p
    row = next(f for f in found.report["read-from-app"] if f["what"] == "node → partition")
    assert "matched by the audit" in row["value"] and "label fit" in row["source"]
    (note,) = [n for n in found.report["notes"] if n.startswith("node → partition inferred")]
    assert "21 → 0 (inferred, fit" in note and "22 → 1 (inferred, fit" in note


def test_the_flag_driven_audit_matches_a_tap_captures_nodes_to_the_loaders_partitions(tmp_path):
    """``fedvit audit --data LOADER`` with no --partition, on a capture that records no partition ids: each node is
    matched to its partition by its update (said in the notes, with its fit and runner-up) and scored against it,
    with the figures of the same audit given the map by hand; a node --partition maps is left as given."""
    from fedvit.audit.api import audit_captures

    run_app(SHAPES["quickstart"], tmp_path / "cap")
    strip_partition_ids(tmp_path / "cap")
    flags = {"model": "qsapp.task:Net", "input_shape": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3,
             "app_dir": QUICKSTART, "app": QUICKSTART, "data": "tests.idiom_harness:qs_partition",
             "decoy_partitions": "2-3", "leakage": "labels"} | BUDGET  # fmt: skip
    inferred = audit_captures(tmp_path / "cap", out=tmp_path / "inferred", **flags).report
    (note,) = [n for n in inferred["notes"] if n.startswith("node → partition inferred")]
    assert "21 → 0 (inferred, fit" in note and "22 → 1 (inferred, fit" in note and "runner-up partition" in note
    assert [u["partition"] for u in inferred["updates"]] == [0, 1]
    given = audit_captures(tmp_path / "cap", out=tmp_path / "given", partitions={"21": 0, "22": 1}, **flags).report
    assert not any(n.startswith("node → partition") for n in given["notes"])
    for mine, theirs in zip(inferred["updates"], given["updates"], strict=True):
        assert mine["labels"] == theirs["labels"] and mine["label-accuracy"] == theirs["label-accuracy"]
    half = audit_captures(tmp_path / "cap", out=tmp_path / "half", partitions={"22": 1}, **flags).report
    assert "21 → 0 (inferred" in next(n for n in half["notes"] if n.startswith("node → partition"))
    assert "22 →" not in next(n for n in half["notes"] if n.startswith("node → partition"))


def test_fail_on_fails_where_only_the_clients_together_leak():
    """No client's own labels leak but their pooled evidence does: the gate fails on it, and says nothing of the
    clients' own unresolvable figures (the type was found)."""
    joint = {"labels": "0 of 3 images misplaced"}  # audit.json's "together"
    failed, lines = judge(parse_fail_on("labels"), findings("not resolvable"), joint)
    assert failed and lines == ["fail: labels leak for the clients together (0 of 3 images misplaced)"]
    assert not judge(parse_fail_on("membership"), findings("not resolvable"), joint)[0]
    assert not judge(parse_fail_on("labels"), findings("not resolvable"), {})[0]


def test_a_flag_driven_audit_without_mean_and_std_checks_the_defaults_against_the_apps_code(tmp_path):
    """``fedvit audit --model`` with no --mean/--std: where the app's code normalises with other values the audit
    refuses in one line naming them (it assumed 0.5 silently before, and every figure moved with it); where the code
    agrees nothing is said; where it states no Normalize the report says the defaults were assumed."""
    from fedvit.audit.api import audit_captures

    run_app(SHAPES["quickstart"], tmp_path / "cap")
    folder = tmp_path / "app"
    shutil.copytree(QUICKSTART, folder, ignore=shutil.ignore_patterns("__pycache__"))
    task = folder / "qsapp" / "task.py"
    text = task.read_text()
    written = "Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))"
    assert written in text
    flags = {"model": "qsapp.task:Net", "input_shape": [3, 32, 32], "app_dir": QUICKSTART, "leakage": "labels"}
    task.write_text(text.replace(written, "Normalize((0.4, 0.4, 0.4), (0.2, 0.2, 0.2))"))
    with pytest.raises(AuditInputError, match=r"normalises with mean 0.4,0.4,0.4 and std 0.2,0.2,0.2 \(task.py:\d+, "
                       r"Normalize\(mean, std\)\).*give --mean 0.4,0.4,0.4 --std 0.2,0.2,0.2"):  # fmt: skip
        audit_captures(tmp_path / "cap", out=tmp_path / "out", app=folder, **flags, **BUDGET)
    given = audit_captures(tmp_path / "cap", out=tmp_path / "out", app=folder, mean=[0.4] * 3, std=[0.2] * 3,
                           **flags, **BUDGET).report  # fmt: skip
    agreed = audit_captures(tmp_path / "cap", out=tmp_path / "out", app=QUICKSTART, **flags, **BUDGET).report
    assert not [n for r in (given, agreed) for n in r["notes"] if n.startswith("mean and std not given")]
    task.write_text(text.replace(written, "Lambda(lambda x: x)"))
    unread = audit_captures(tmp_path / "cap", out=tmp_path / "out", app=folder, **flags, **BUDGET).report
    (note,) = [n for n in unread["notes"] if n.startswith("mean and std not given")]
    assert "[0.5, 0.5, 0.5] / [0.5, 0.5, 0.5] assumed" in note and "give --mean and --std" in note
