"""docs/build_tutorial.py at a size CI affords: it runs the tutorial page's commands (a SuperLink, the tap, two
SuperNodes, ``flwr run``, ``fedvit audit``) and writes the same files the page includes, with the same commands
apart from the sizes, the loader and the node ids the capture held."""

from __future__ import annotations

import json
import re

import pytest

from tests.report_checks import check_markdown
from tests.test_docs import DOCS, tutorial_script

# the page's fixed ports: one run at a time
pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("tutorial")]


def normalised(commands: str, facts: dict, loader: str) -> str:
    text = commands.replace(facts["sizes"], "<sizes>").replace(loader, "<loader>")
    for node in facts["nodes"]:
        text = text.replace(node, "<node>")
    return text


def test_the_tutorial_script_runs_the_pages_commands_and_writes_its_files(tmp_path):
    script = tutorial_script()
    out, work = tmp_path / "out", tmp_path / "work"
    assert script.main(["--sizes", "100,120", "--out", str(out), "--work", str(work),
                        "--audit-app-args=--iterations 20 --restarts 1"]) == 0
    committed = DOCS / "_static" / "tutorial"
    assert {f.name for f in out.iterdir()} == {f.name for f in committed.iterdir()}
    facts = json.loads((out / "facts.json").read_text())
    page = json.loads((committed / "facts.json").read_text())
    assert sorted(facts["nodes"].values()) == [0, 1] and facts["capture-bytes"] > 0
    mine = normalised((out / "commands.sh").read_text(), facts, script.LOADERS["100,120"])
    theirs = normalised((committed / "commands.sh").read_text(), page, script.LOADERS[script.SIZES])
    assert mine == theirs
    assert not re.search(r"\d{10,}", mine)  # every node id came from the capture
    report = check_markdown(work / "app" / "audit")
    assert report["verdict"].startswith("LEAKS: labels (2 of 2 clients)"), report["verdict"]
    assert facts["verdict"] == report["verdict"]
    reads = lambda text: [line.split(" (")[0] for line in text.splitlines() if ": model:" in line or ": mean:" in  # noqa: E731
                          line or ": clients' data:" in line or ": input:" in line]  # fmt: skip
    assert reads((out / "audit-app.txt").read_text()) == reads((committed / "audit-app.txt").read_text()) != []
