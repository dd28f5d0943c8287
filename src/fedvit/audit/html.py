"""``audit.html``: the report's summary, its pictures inline and the recipe with its sources, in one self-contained
page (no network: the figures are embedded PNGs, the style is in the page), rendered with Jinja2 from
``templates/audit.html.j2``."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, NamedTuple

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from fedvit.audit.summary import KINDS, ClientFinding


class Picture(NamedTuple):
    """One embedded figure: its heading, what it shows and its PNG bytes."""

    title: str
    caption: str
    png: bytes


def recipe_values(update: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The update's recipe as (key, value, source) rows: each source text reads "value (source...)"."""
    rows = []
    for key, text in update.get("recipe-sources", []):
        value, sep, source = text.partition(" (")
        rows.append((key, value, source.removesuffix(")") if sep else "—"))
    return rows


def render(report: dict[str, Any], findings: list[ClientFinding], pictures: list[Picture]) -> str:
    """The page for ``report`` (``audit.json``'s content) and its per-client ``findings``, with ``pictures``
    inline."""
    env = Environment(
        loader=PackageLoader("fedvit.audit", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,  # a key the template names and the report lacks is an error, not a blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    rows = [{"client": f.client, "updates": f.updates, "cells": list(f.by_kind().values())} for f in findings]
    figures = [{"title": p.title, "caption": p.caption, "data": base64.b64encode(p.png).decode()} for p in pictures]
    recipes = [{"update": u["update"], "rows": recipe_values(u)} for u in report["updates"] if recipe_values(u)]
    return env.get_template("audit.html.j2").render(
        report=report, findings=rows, kinds=KINDS, figures=figures, recipes=recipes
    )


def write_html(report: dict[str, Any], findings: list[ClientFinding], pictures: list[Picture], path: Path) -> None:
    """Write the page atomically."""
    from fedvit.core.results import atomic_write

    atomic_write(path, render(report, findings, pictures).encode())
