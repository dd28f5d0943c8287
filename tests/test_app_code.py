"""The client's recipe read from an app's Python (fedvit.observed.app_code): parsed, never executed, each value with
its source line; what the code does not fix statically is named as unread. Read into the audit's recipe
(fedvit.observed.recipe.read_recipe) before the records, after ``--recipe``."""

from __future__ import annotations

import io
import math
import textwrap
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedvit.attacks.simulation import SCALE_MARGIN, RecipeFit, flatness
from fedvit.capture.reader import Exchange
from fedvit.observed.app_code import App, AppCodeError, app_sources, load_app, read_code
from fedvit.observed.recipe import read_recipe

HEADAPP = Path(__file__).parent / "headapp"
CNNAPP = Path(__file__).parent / "thirdparty_app"


def run_config(app: Path) -> dict:
    return tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def line_of(app: Path, file: str, text: str) -> str:
    """``file:N`` of the first line of ``app``'s ``file`` that holds ``text``."""
    path = next(app.rglob(file))
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{file}:{number}"


def test_the_head_apps_code_gives_adam_its_lr_the_crop_and_the_head_with_their_lines():
    """Built as Flower's ViT example builds it: Adam constructed in client_app.py and handed into the loop."""
    assert "optimizer" not in run_config(HEADAPP)  # nothing declares the optimiser: the code alone says Adam
    code = read_code(load_app(HEADAPP), {"run config": run_config(HEADAPP)})
    adam = line_of(HEADAPP, "client_app.py", "torch.optim.Adam(")
    assert (code.optimiser.value, code.optimiser.source) == ("adam", adam)
    assert code.lr.value == 0.001 and code.lr.source == adam and code.lr.how == "run config 'lr'"
    assert code.betas.value == (0.9, 0.999) and "default" in code.betas.how
    assert code.epochs.value == 1 and code.epochs.source == line_of(HEADAPP, "task.py", "for _ in range(epochs)")
    assert code.batch_size.value == 16
    assert code.trained.value == "heads" and code.frozen[0].value == "backbone"
    crop, flip = code.transforms
    assert (crop.name, crop.crop_scale, crop.source) == ("RandomResizedCrop", 0.5,
                                                         line_of(HEADAPP, "task.py", "AUGMENT = "))  # fmt: skip
    assert flip.name == "RandomHorizontalFlip"


def test_the_quickstart_shaped_apps_momentum_is_a_module_constant_and_its_lr_the_train_messages():
    code = read_code(load_app(CNNAPP), {"run config": run_config(CNNAPP), "ConfigRecord": {"lr": 0.05,
                                                                                            "local-epochs": 3}})
    assert code.optimiser.value == "sgd" and code.momentum.value == 0.9
    assert code.momentum.how == "MOMENTUM = 0.9"
    assert code.lr.value == 0.05 and "ConfigRecord 'lr'" in code.lr.how
    assert code.epochs.value == 3 and "ConfigRecord 'local-epochs'" in code.epochs.how
    assert code.batch_size.value == 4 and code.trained.value == "the whole model" and not code.transforms
    # the values follow the records of the exchange they are resolved against
    other = read_code(load_app(CNNAPP), {"run config": run_config(CNNAPP), "ConfigRecord": {"lr": 0.5}})
    assert other.lr.value == 0.5
    # a key the captured ConfigRecord lacks: the server's train_config states it, from the run config
    sets = line_of(CNNAPP, "server_app.py", "train_config=ConfigRecord(")
    assert other.epochs.value == run_config(CNNAPP)["local-epochs"]
    assert other.epochs.how.endswith(f"ConfigRecord 'local-epochs' as train_config ({sets}) sets it")
    bare = read_code(load_app(CNNAPP), {"ConfigRecord": {"lr": 0.5}})  # nor the run config: unread, said why
    assert not bare.epochs.read and "does not hold" in bare.epochs.how


def test_a_fab_is_read_as_its_folder_is():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for path in HEADAPP.rglob("*"):
            if path.is_file():
                bundle.write(path, path.relative_to(HEADAPP).as_posix())
    sources, where = app_sources_of(buffer.getvalue())
    assert "vithead/task.py" in sources and "app bundle" in where
    code = read_code(App(sources, where), {"run config": run_config(HEADAPP)})
    assert code.optimiser.value == "adam" and code.lr.value == 0.001


def app_sources_of(data: bytes) -> tuple[dict[str, str], str]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        fab = Path(folder) / "app.fab"
        fab.write_bytes(data)
        return app_sources(fab)


APP_TEMPLATE = '''
import sys
import torch
from flwr.clientapp import ClientApp

sys.exit("this code must never run")
app = ClientApp()

def make(cls, params, lr):
    return cls(params, lr=lr)

def fit_loop(model, loader, epochs, lr):
    optimizer = {optimiser}
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = model(x).sum()
            loss.backward()
            optimizer.step()

@app.train()
def train(msg, context):
    fit_loop(msg.model, msg.loader, context.run_config["epochs"], float(context.run_config["lr"]) * 10)
'''


def write_app(folder: Path, optimiser: str) -> Path:
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "client_app.py").write_text(textwrap.dedent(APP_TEMPLATE.format(optimiser=optimiser)))
    return folder


def test_an_optimiser_whose_class_is_an_argument_is_named_unread_and_the_code_never_runs(tmp_path):
    app = App(*app_sources(write_app(tmp_path, "make(torch.optim.Adam, model.parameters(), lr)")))
    code = read_code(app, {"run config": {"epochs": 2, "lr": 0.01}})
    assert code.optimiser.value is None and "not read statically" in code.optimiser.how
    assert code.optimiser.source == "client_app.py:13"  # the line that builds it
    assert code.epochs.value == 2 and code.lr is None


def test_arithmetic_on_a_run_config_value_is_followed(tmp_path):
    app = App(*app_sources(write_app(tmp_path, "torch.optim.SGD(model.parameters(), lr=lr, weight_decay=5e-4)")))
    code = read_code(app, {"run config": {"epochs": 2, "lr": 0.01}})
    assert code.optimiser.value == "sgd" and math.isclose(code.lr.value, 0.1)
    assert code.weight_decay.value == 5e-4 and code.momentum.value == 0.0 and "default" in code.momentum.how
    missing = read_code(app, {"run config": {"epochs": 2}})
    assert missing.lr.value is None and "run config 'lr', which the capture does not hold" in missing.lr.how


def test_no_python_is_a_clear_error(tmp_path):
    with pytest.raises(AppCodeError, match="holds no Python"):
        app_sources(tmp_path)
    (tmp_path / "not.fab").write_bytes(b"plain bytes")
    with pytest.raises(AppCodeError, match="not a FAB"):
        app_sources(tmp_path / "not.fab")


def exchange(run: dict, config: dict | None = None, metrics: dict | None = None) -> Exchange:
    return Exchange(Path("x"), 1, 1, 5, None, None, {}, {}, config or {}, metrics or {"num-examples": 64}, run)


def test_the_recipe_takes_the_code_before_the_records_and_the_override_before_the_code():
    code = read_code(load_app(HEADAPP), {"run config": run_config(HEADAPP)})
    records = exchange(run_config(HEADAPP) | {"optimizer": "sgd", "momentum": 0.5})
    client = read_recipe(records, "weights", {}, code)
    assert client.optimiser == "adam" and client.lr == 0.001 and client.augment.crop_scale == 0.5
    assert client.augment.flip and client.momentum_known
    sources = dict(client.sources)
    assert sources["optimiser"].startswith("adam (app code: client_app.py:")
    assert sources["augmentation"].startswith("random resized crop (scale 0.5–1) + horizontal flip (app code: ")
    assert sources["trained"].startswith("heads (app code: client_app.py:")
    told = read_recipe(records, "weights", {"optimizer": "adamw", "lr": "0.002", "augment": "none"}, code)
    assert told.optimiser == "adamw" and told.lr == 0.002 and told.augment is None
    # without code and without a record, the optimiser is left open: inferred from the update
    assert read_recipe(exchange(run_config(HEADAPP)), "weights", {}).optimiser is None


def test_the_fit_needs_the_scale_the_flatness_and_where_checked_the_direction():
    rng = np.random.default_rng(0)
    sgd_like = rng.standard_t(2, 2000)  # a few entries carry the change
    adam_like = np.sign(sgd_like) * rng.uniform(0.8, 1.0, 2000)  # every entry moves by about as much
    assert flatness(adam_like) > 0.95 and flatness(sgd_like) < 0.7
    right = RecipeFit("SGD β 0.9", 1.1, 0.999, (0.30, 0.32), own_cosine=0.999)
    assert right.fits and right.cosine_bound == pytest.approx(1 - 3 * 0.001 - 0.02)
    assert not RecipeFit("SGD β 0.9", SCALE_MARGIN * 1.01, 0.999, (0.3, 0.3), 0.999).fits
    assert not RecipeFit("SGD β 0.9", 1.0, 0.93, (0.3, 0.3), 0.999).fits  # 10× lr on the CNN: the direction
    assert not RecipeFit("SGD β 0", 1.0, 0.999, (0.65, 0.90), 0.999).fits  # Adam's update, SGD simulated
    unchecked = RecipeFit("Adam", 1.3, 0.5, (0.96, 0.89))  # Adam: the direction rests on SGD's relation
    assert unchecked.fits and unchecked.mismatch < RecipeFit("SGD β 0", 0.4, 0.9, (0.65, 0.89)).mismatch


def test_a_capture_mod_records_the_folder_of_the_app_whose_module_it_runs_in(tmp_path, monkeypatch):
    """capture_mod and CapturingStrategy record ``app-dir``: the sys.path folder whose pyproject declares the Flower
    app of a module loaded in the process and this run's config keys (a folder with another app's pyproject, or with
    another app loaded whose config is not this run's, is passed over: a test process that had loaded fedvit's own
    app recorded fedvit's folder for a ClientApp built in a test, and the audit read the wrong recipe); the reader
    hands it to the audit as the app's code."""
    import importlib
    import sys

    from fedvit.capture.reader import _app_code, _run_file
    from fedvit.capture.writer import app_folder

    other = tmp_path / "other"
    (other / "otherpkg").mkdir(parents=True)
    (other / "otherpkg" / "__init__.py").write_text("")
    (other / "otherpkg" / "client_app.py").write_text("app = None\n")
    (other / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nclientapp = "otherpkg.client_app:app"\n[tool.flwr.app.config]\nlr = 0.1\n'
    )
    app = write_app(tmp_path / "app", "torch.optim.SGD(model.parameters(), lr=lr)")
    (app / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nclientapp = "pkg.client_app:app"\n[tool.flwr.app.config]\nlr = 0.1\n'
        'train.epochs = 1\n'
    )
    (app / "pkg" / "__init__.py").write_text("")
    (app / "pkg" / "client_app.py").write_text("app = None\n")  # importable stand-in: loaded, not parsed here
    # only these two apps on the path (the checkout's own pyproject declares fedvit's app, whose modules may be loaded)
    kept = [p for p in sys.path if not (Path(p or ".") / "pyproject.toml").is_file()]
    monkeypatch.setattr(sys, "path", [str(other), str(app), *kept])
    for name in ("pkg", "pkg.client_app", "otherpkg", "otherpkg.client_app"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    run_config = {"lr": 0.05, "train.epochs": 2}  # Flower's fused run config: the app's keys, flattened
    assert app_folder(run_config) is None  # no module of either app loaded yet
    importlib.import_module("otherpkg.client_app")
    assert app_folder(run_config) is None  # another app is loaded: its config is not this run's
    assert app_folder({}) == str(other.resolve())  # no config to compare (run_simulation without a FAB)
    importlib.import_module("pkg.client_app")
    assert app_folder(run_config) == str(app.resolve())  # looked up per call: not the first answer kept
    assert app_folder({"lr": 0.05}) == str(other.resolve())
    assert app_folder({"batch-size": 4}) is None  # a ClientApp built outside any app on the path
    stem = tmp_path / "run-1" / "captures" / "round-0001" / "node-1"  # a capture mod's: no run.json beside it
    assert _app_code(*_run_file(stem), {"app-dir": str(app)}) == app
    assert _app_code(*_run_file(stem), {"app-dir": "/no/such"}) is None


def test_code_that_would_fail_or_loop_is_named_unread_not_raised(tmp_path):
    app = App(*app_sources(write_app(tmp_path, "torch.optim.SGD(model.parameters(), lr=lr / 0, momentum=m)")))
    code = read_code(app, {"run config": {"epochs": 2, "lr": 0.01}})
    assert code.optimiser.value == "sgd"
    assert code.lr.value is None and "ZeroDivisionError" in code.lr.how
    assert code.momentum.value is None and "`m` is not bound" in code.momentum.how
