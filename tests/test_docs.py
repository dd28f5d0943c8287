"""The documentation stays in step with the code: every config key and CLI option documented, everything the docs
name exists, results read from committed data with their provenance, and no page names a file outside the
repository. The drift checks are shown to fail on a key or option added without docs."""

from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from fedvit.app.cli import build_parser
from fedvit.core.config import Config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
REPO_DIRS = ("benchmarks", "conf", "deploy", "docs", "src", "tests")
README_MAX_LINES = 200


# ---------------------------------------------------------------------------- helpers (the checks themselves)


def flat_config(table: dict, prefix: str = "") -> dict:
    """``[tool.flwr.app.config]`` flattened to dotted keys, as Flower and fedvit read them."""
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= flat_config(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def declared_config() -> dict:
    return flat_config(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def documented_config(text: str) -> dict:
    """Key -> default from the rows ``| `key` | `default` | meaning |`` of the configuration page."""
    rows = re.findall(r"^\| `([a-z0-9.-]+)` \| `([^`]*)` \|", text, flags=re.M)
    return {key: tomllib.loads(f"v = {default}")["v"] for key, default in rows}


def config_drift(declared: dict, documented: dict) -> list[str]:
    """What differs between the declared keys (with defaults) and the documented ones."""
    problems = [f"{k}: not documented" for k in declared if k not in documented]
    problems += [f"{k}: documented but not a config key" for k in documented if k not in declared]
    problems += [
        f"{k}: documented default {documented[k]!r}, declared {declared[k]!r}"
        for k in declared
        if k in documented and documented[k] != declared[k]
    ]
    return problems


def cli_options(parser: argparse.ArgumentParser, prefix: str = "fedvit") -> dict[str, set[str]]:
    """Command ("fedvit audit", "fedvit deploy bundle", ...) -> its options and positionals."""
    out: dict[str, set[str]] = {}
    own: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out |= cli_options(sub, f"{prefix} {name}")
        elif not isinstance(action, argparse._HelpAction):
            own |= set(action.option_strings) if action.option_strings else {action.dest}
    if prefix != "fedvit":
        out[prefix] = own
    return out


def documented_cli(text: str) -> dict[str, set[str]]:
    """Command -> the options in the first column of its section's table on the CLI page."""
    out: dict[str, set[str]] = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = section.partition("\n")
        rows = re.findall(r"^\| ([^|]+) \|", body, flags=re.M)
        out[heading.strip()] = {o for row in rows if row.strip() != "option" for o in re.findall(r"`([^`]+)`", row)}
    return out


def cli_drift(actual: dict[str, set[str]], documented: dict[str, set[str]]) -> list[str]:
    problems = [f"{c}: not documented" for c in actual if c not in documented]
    problems += [f"{c}: documented but not a command" for c in documented if c not in actual]
    for command in set(actual) & set(documented):
        problems += [f"{command} {o}: not documented" for o in sorted(actual[command] - documented[command])]
        extra = sorted(documented[command] - actual[command])
        problems += [f"{command} {o}: documented but not an option" for o in extra]
    return problems


def prose(text: str) -> str:
    """The text outside fenced code blocks (commands may name output files; prose may not)."""
    return re.sub(r"^(```|:::).*?^\1", "", text, flags=re.M | re.S)


def ignored_by_git(paths: list[str]) -> set[str]:
    """The paths git would ignore (none when git or the checkout is not there)."""
    if not paths or shutil.which("git") is None or not (ROOT / ".git").exists():
        return set()
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return set(result.stdout.split())


def outside_references(page: Path) -> list[str]:
    """Files a page names that a clone of the repository does not hold: paths outside it, repository paths that
    do not exist or are git-ignored, and relative links to missing files."""
    text = page.read_text()
    problems = [f"names {m!r}" for m in re.findall(r"(?:\.\./)+shared/\S*|\bshared/(?:papers|docs)/\S*", text)]
    named = set(re.findall(rf"`((?:{'|'.join(REPO_DIRS)})/[\w./*-]*)`", prose(text)))
    folders = {p for p in named if p.endswith("/")}  # where commands write: only the folder above must exist
    files = sorted(named - folders)
    problems += [f"names {p}, whose parent is not in the repository" for p in folders if not (ROOT / p).parent.is_dir()]
    problems += [f"names {p}, which is not in the repository" for p in files if not list(ROOT.glob(p))]
    problems += [f"names {p}, which git ignores (a clone does not have it)" for p in sorted(ignored_by_git(files))]
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose(text)):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        if not (page.parent / target).resolve().exists():
            problems.append(f"links to {target}, which does not exist")
    return problems


# ---------------------------------------------------------------------------- the repository's docs


def test_every_config_key_is_documented_with_its_default():
    documented = documented_config((DOCS / "configuration.md").read_text())
    assert config_drift(declared_config(), documented) == []
    assert set(Config().to_dict()) == set(documented), "the config parser's keys differ from the documented ones"


def test_every_cli_command_and_option_is_documented():
    assert cli_drift(cli_options(build_parser()), documented_cli((DOCS / "reference" / "cli.md").read_text())) == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_only_files_of_the_repository(page):
    assert outside_references(page) == []


def test_readme_is_short_and_runs_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    ci = (ROOT / ".ci" / "run").read_text()
    for command in re.findall(r"^(uv run --frozen [^#\n]*?)\s*(?:#.*)?$", readme, flags=re.M):
        if "pytest" in command or "sphinx-build" in command:
            assert command in ci, f"README's test command is not what CI runs: {command}"


def results_tables() -> list[tuple[Path, str, str]]:
    """(page, data file, the text of its section before the table) for every csv-table on the site."""
    found = []
    for page in PAGES:
        for section in re.split(r"^#+ ", page.read_text(), flags=re.M):
            for match in re.finditer(r"```\{csv-table\}[^\n]*\n:file: (\S+)", section):
                found.append((page, match.group(1), section[: match.start()]))
    return found


def test_results_tables_come_from_committed_data_with_provenance():
    tables = results_tables()
    assert tables, "no results table found"
    used = set()
    for page, data, before in tables:
        path = (page.parent / data).resolve()
        assert path.is_file(), f"{page.name}: {data} is missing"
        used.add(path)
        rows = list(csv.reader(path.open()))
        assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows), f"{data}: ragged or empty"
        if page.parent.name == "results":
            for field in ("**Measured**", "**Machine**", "**Reproduce**"):
                assert field in before, f"{page.name}: the table from {data} has no {field} line before it"
            assert re.search(r"\*\*Measured\*\*: \d{4}-\d\d-\d\d, commit `[0-9a-f]{7,40}`", before), data
    unused = {p for p in (DOCS / "results" / "data").glob("*.csv")} - used
    assert not unused, f"data files no page reads: {sorted(p.name for p in unused)}"
    pages = [p for p in (DOCS / "results").glob("*.md") if p.name != "index.md"]  # the index: headlines, links
    typed = [f"{p.name}:{n}" for p in pages
             for n, line in enumerate(prose(p.read_text()).splitlines(), 1) if line.startswith("|")]  # fmt: skip
    assert not typed, f"tables typed into a results page instead of read from committed data: {typed[:5]}"
    # every figure from a tracked file: no console output pasted, no git-ignored JSON cited, every CSV in git
    for page in pages:
        text = page.read_text()
        blocks = re.findall(r"^\s*```(\S*)", text, flags=re.M)[::2]  # each block's opening fence
        assert set(blocks) <= {"bash", "{csv-table}"}, f"{page.name}: a pasted output block ({set(blocks)})"
        assert "benchmarks/results" not in text and "JSON output" not in text, page.name
    if shutil.which("git") and (ROOT / ".git").exists():
        tracked = subprocess.run(["git", "ls-files", "docs/results/data"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()  # fmt: skip
        assert {str(p.relative_to(ROOT)) for p in used} <= set(tracked), sorted(
            str(p.relative_to(ROOT)) for p in used if str(p.relative_to(ROOT)) not in tracked)


# ---------------------------------------------------------------------------- the checks catch drift


def test_config_drift_is_caught():
    declared = declared_config()
    documented = documented_config((DOCS / "configuration.md").read_text())
    added = declared | {"audit.new-knob": 1}
    assert config_drift(added, documented) == ["audit.new-knob: not documented"]
    removed = {k: v for k, v in declared.items() if k != "seed"}
    assert config_drift(removed, documented) == ["seed: documented but not a config key"]
    changed = declared | {"lr": 0.5}
    assert config_drift(changed, documented) == ["lr: documented default 0.02, declared 0.5"]


def test_cli_drift_is_caught():
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    subcommands.choices["audit"].add_argument("--new-flag", help="undocumented")
    subcommands.add_parser("new-command", help="undocumented")
    documented = documented_cli((DOCS / "reference" / "cli.md").read_text())
    assert sorted(cli_drift(cli_options(parser), documented)) == [
        "fedvit audit --new-flag: not documented",
        "fedvit new-command: not documented",
    ]
    documented["fedvit audit"].add("--gone")
    assert "fedvit audit --gone: documented but not an option" in cli_drift(cli_options(build_parser()), documented)


def test_outside_references_are_caught():
    page = DOCS / "_probe-outside.md"
    page.write_text(
        "See `../shared/papers/x.md`, `src/fedvit/core/no_such_module.py`, `benchmarks/results/x.json`"
        " and [a](missing.md).\n"
    )
    try:
        problems = outside_references(page)
    finally:
        page.unlink()
    assert any("shared/papers" in p for p in problems)
    assert any("src/fedvit/core/no_such_module.py" in p for p in problems)
    assert any("missing.md" in p for p in problems)
    if ignored_by_git(["benchmarks/results/x.json"]):
        assert any("git ignores" in p for p in problems)



def test_the_worked_verdict_example_quotes_the_committed_tables():
    """docs/audit.md's worked example: its membership and ε figures are the committed benchmark rows'."""
    text = " ".join((DOCS / "audit.md").read_text().split())
    example = text[text.index("**A worked example**") : text.index("**The frontier's verdict**")]
    power = {(r["data"], r["partition"], r["local epochs"]): r
             for r in csv.DictReader((DOCS / "results" / "data" / "membership-power.csv").open())}  # fmt: skip
    early, late = power[("textures", "IID", "3")], power[("textures", "IID", "30")]
    assert early["observed clears"] == "False" == early["simulated clears"] and late["observed clears"] == "True"
    for row, keys in ((early, ("observed AUC", "observed null AUC", "simulated AUC")),
                      (late, ("observed AUC", "observed null AUC", "simulated AUC"))):  # fmt: skip
        for key in keys:
            assert f"{float(row[key]):.3f}" in example, (key, row[key])
    for row, key in ((early, "observed TPR@1% FPR"), (late, "observed TPR@1% FPR"), (late, "simulated TPR@1% FPR")):
        assert f"{float(row[key]):.1%}" in example, (key, row[key])
    epsilon = list(csv.DictReader((DOCS / "results" / "data" / "dp-epsilon.csv").open()))
    noisy = [float(r["empirical ε ≥ (95%)"]) for r in epsilon if r["noise multiplier"] == "35.0"]
    noiseless = [float(r["empirical ε ≥ (95%)"]) for r in epsilon if r["noise multiplier"] == "0.0"]
    claimed = {r["claimed ε (δ 1e-5)"] for r in epsilon if r["noise multiplier"] == "35.0"}
    spread = f"{min(noisy):.2f} on both seeds" if min(noisy) == max(noisy) else f"{min(noisy):.2f} to {max(noisy):.2f}"
    assert f"ε ≥ {spread}" in example and f"ε ≥ {min(noiseless):.1f}" in example
    assert claimed == {"1.073"} and "claims ε 1.07" in example


def tutorial_script():
    """docs/build_tutorial.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_tutorial", DOCS / "build_tutorial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tutorial_shows_what_its_script_ran_and_wrote():
    """docs/tutorial.md includes only what docs/build_tutorial.py wrote, and those files agree with each other and
    with the script: the commands are the script's for the nodes the capture held, the verdict and the report's
    head are the committed audit.json's, the cost sentence is its facts'; every fedvit command parses; the page
    types no node id."""
    script = tutorial_script()
    text = (DOCS / "tutorial.md").read_text()
    static = DOCS / "_static" / "tutorial"
    for name in ("commands.sh", "facts.md", "audit-head.md"):
        assert f"_static/tutorial/{name}" in text, name
    for picture in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (DOCS / picture).is_file(), picture
    assert {"membership-roc.png", "labels.png"} <= {Path(p).name for p in re.findall(r"\]\(([^)]+)\)", text)}
    facts = json.loads((static / "facts.json").read_text())
    report = json.loads((static / "audit.json").read_text())
    nodes = {int(node): p for node, p in facts["nodes"].items()}
    assert (static / "commands.sh").read_text() == script.commands_text(facts["sizes"], nodes,
                                                                       script.LOADERS[facts["sizes"]])  # fmt: skip
    assert facts["sizes"] == script.SIZES and facts["verdict"] == report["verdict"]
    assert facts["update-seconds"] == [u["seconds"] for u in report["updates"]]
    assert {str(u["node"]): u["partition"] for u in report["updates"]} == facts["nodes"]
    assert (static / "facts.md").read_text() == script.facts_text(facts)
    head = (static / "audit-head.md").read_text()
    assert head.startswith("**Verdict**\n\n" + "".join(f"> {line}  \n" for line in report["verdict"].splitlines()))
    assert "| client | updates | labels | membership | images | DP claim |" in head
    assert not re.search(r"\d{10,}", text), "the page types a node id"
    parser = build_parser()
    fedvit_lines = [line for line in (static / "commands.sh").read_text().splitlines() if line.startswith("fedvit ")]
    assert len(fedvit_lines) == 2
    for line in fedvit_lines:
        parser.parse_args(shlex.split(line)[1:])
