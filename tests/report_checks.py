"""Checks of the audit's report as a person reads it (audit.md's first screen, audit.html in a real browser), shared
by the tests that audit captures."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from fedvit.audit.summary import AGGREGATE_ROW

# a figure no report may print: an AUC above 1 or a TPR above 100% (a null is a threshold, printed as one)
IMPOSSIBLE = (
    (re.compile(r"\bAUC (?:[<>≥≤=] )?(\d+(?:\.\d+)?)"), 1.0),
    (re.compile(r"\bnull:? (\d\.\d{3})\b"), 1.0),  # an AUC's null as the old text printed it
    (re.compile(r"\bTPR(?:@[\d.]+% FPR)? (?:[<>≥≤=] )?(\d+(?:\.\d+)?)%"), 100.0),
)
VERDICT_CHARS = 400  # the verdict a person reads at a glance
TABLE_WITHIN = 40  # the summary table starts within audit.md's first lines
NOT_APPLICABLE_PER_UPDATE = 2


def check_markdown(out: Path, not_applicable_per_update: int = NOT_APPLICABLE_PER_UPDATE) -> dict:
    """audit.md opens with a short verdict and the per-client table, says each non-applying attack once per reason
    (at most ``not_applicable_per_update`` such lines per update), and its per-client rows agree with the update
    rows; returns audit.json."""
    report = json.loads((out / "audit.json").read_text())
    lines = (out / "audit.md").read_text().splitlines()
    verdict = report["verdict"]
    assert len(verdict) <= VERDICT_CHARS and 1 <= len(verdict.splitlines()) <= 3, verdict
    header = next(i for i, line in enumerate(lines) if line.startswith("| client | updates | labels | membership |"))
    assert header < TABLE_WITHIN, lines[:TABLE_WITHIN]
    section = lines.index("### Attacks that did not apply") if "### Attacks that did not apply" in lines else None
    grouped = 0 if section is None else len(list(_until_blank(lines[section + 2 :])))
    elsewhere = sum("not applicable" in line for line in lines)
    assert grouped + elsewhere <= not_applicable_per_update * len(report["updates"]), (grouped, elsewhere)
    rows = {}  # the table's client → its updates, as audit.json's findings give them
    for finding in report["findings"]:
        rows[finding["client"]] = set(finding["updates"])
    for update in report["updates"]:  # each update row's partition (or node) is the client its finding sits under
        client = (AGGREGATE_ROW if update["node"] == "aggregate" else f"partition {update['partition']}"
                  if update["partition"] is not None else f"node {update['node']}")  # fmt: skip
        assert update["update"] in rows[client], (client, update["update"], rows)
    table = [line for line in lines[header + 2 :] if line.startswith("| ")][: len(rows)]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table] == list(rows)
    return report


def impossible_figures(text: str) -> list[str]:
    """Every AUC above 1 and TPR above 100% in a report's text (HTML entities read as characters)."""
    import html

    text = html.unescape(text)
    return [m.group(0) for pattern, most in IMPOSSIBLE for m in pattern.finditer(text) if float(m.group(1)) > most]


def _until_blank(lines: list[str]):
    for line in lines:
        if not line.strip():
            return
        yield line


def chromium() -> str:
    """Debian's chromium, installed (apt-get, as root) where it is missing: CI installs everything itself."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("chromium is missing and this is not root: apt-get install chromium")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]):
        subprocess.run(cmd, check=True, capture_output=True, timeout=900, env=os.environ | {
            "DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip
    return shutil.which("chromium") or "/usr/bin/chromium"


def open_in_chromium(page: Path, screenshot: Path) -> list[str]:
    """Open ``page`` in headless Chromium with no network; returns the console messages it logged and its failed
    loads and leaves a screenshot of the first 1280×2400 pixels."""
    profile = screenshot.parent / "chromium-profile"
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--proxy-server=127.0.0.1:9", "--window-size=1280,2400",
         f"--screenshot={screenshot}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert screenshot.is_file(), done.stderr[-3000:]
    # the report has no scripts: any console message (an error, a warning, a log) or failed load is a fault
    return [line for line in done.stderr.splitlines() if "CONSOLE" in line or "net::ERR" in line]


def not_blank(screenshot: Path) -> float:
    """The share of the screenshot's pixels that are not the page's white background."""
    from matplotlib.image import imread

    pixels = imread(screenshot)[..., :3]
    return float(np.mean(np.abs(pixels - 1.0).max(axis=-1) > 0.05))


def check_html(out: Path, pictures: int = 2) -> None:
    """audit.html: self-contained (nothing fetched: no http(s) or relative src/href), at least ``pictures`` inline
    figures, opens in Chromium without console errors, and its screenshot is not blank. The detector itself is
    checked: a page that logs an error is caught."""
    html = (out / "audit.html").read_text()
    assert html.count('src="data:image/png;base64,') >= pictures
    links = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert all(link.startswith("data:") for link in links), links
    errors = open_in_chromium(out / "audit.html", out / "audit-html.png")
    assert errors == [], errors
    assert not_blank(out / "audit-html.png") > 0.02
    broken = out / "broken.html"
    broken.write_text("<html><body><p>x</p><script>console.error('planted failure'); undefinedCall();</script></body>"
                      "</html>")  # fmt: skip
    assert open_in_chromium(broken, out / "broken.png"), "the console check misses a planted error"
