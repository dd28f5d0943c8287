"""``fedvit run`` hands ``flwr run`` a staged copy of the app's bundle files (fedvit.app.app_files): Flower builds the
same FAB, byte for byte, without walking the virtual environments and ignored folders beside the app's code."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from fedvit.app import app_files
from fedvit.app.app_files import negated_paths, staged_app

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "thirdparty_app"


def write(path: Path, text: str = "x = 1\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """The test app with what a user's folder holds beside it: a virtual environment, ignored folders (one with a
    negation that re-includes a folder beneath an ignored name), caches, a symlink."""
    folder = tmp_path / "app"
    shutil.copytree(APP, folder, ignore=shutil.ignore_patterns("__pycache__"))
    write(folder / ".gitignore", "data/\nenv-*/\n*.log\n!docs/results/data/\n")
    write(folder / ".venv" / "lib" / "site.py")  # Flower's own FAB excludes: never bundled
    write(folder / "env-gpu" / "lib" / "torch.py")  # ignored whole by .gitignore
    write(folder / "data" / "cached.json", "{}")
    write(folder / "docs" / "results" / "data" / "table.json", "{}")  # re-included by the negation
    write(folder / "cnnapp" / "__pycache__" / "task.py")
    write(folder / "cnnapp" / "extra.py")
    write(folder / "run.log", "ignored")
    (folder / "linked.py").symlink_to(folder / "cnnapp" / "extra.py")
    return folder


def test_the_staged_copy_bundles_to_the_same_fab_and_skips_what_no_fab_holds(app, tmp_path, monkeypatch):
    walked = []
    real_walk = os.walk

    def recording_walk(top, **kwargs):
        for current, dirs, names in real_walk(top, **kwargs):
            walked.append(Path(current).relative_to(app.resolve()).as_posix())
            yield current, dirs, names

    with monkeypatch.context() as patched:
        patched.setattr(app_files.os, "walk", recording_walk)
        staged = staged_app(app, tmp_path / "stage")
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    assert not [d for d in walked if d.split("/")[0] in (".venv", "env-gpu", "data") or "__pycache__" in d], walked
    assert "docs/results/data" in walked  # beneath an ignored name, but re-included: walked
    bundled = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert "docs/results/data/table.json" in bundled and "cnnapp/extra.py" in bundled
    assert not {"run.log", "linked.py", "data/cached.json"} & bundled


def test_a_negation_that_is_not_an_anchored_path_prunes_nothing_for_the_gitignore(app, tmp_path):
    assert negated_paths(["data/", "!docs/results/data/"]) == ["docs/results/data"]
    assert negated_paths(["data/", "!/top/"]) == ["top"]
    assert negated_paths(["data/", "!keep"]) is None  # a bare name matches at any depth
    assert negated_paths(["data/", "!data/*.json"]) is None
    write(app / ".gitignore", "data/\n!cached.json\n")  # re-includes data/cached.json: the folder must be walked
    staged = staged_app(app, tmp_path / "stage")
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    assert (staged / "data" / "cached.json").exists()


def test_the_repository_stages_to_its_own_fab(tmp_path):
    """fedvit's own folder, with its virtual environments: the FAB `fedvit run .` submits is Flower's."""
    assert build_fab_from_disk(staged_app(ROOT, tmp_path)) == build_fab_from_disk(ROOT)
