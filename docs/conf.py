"""Sphinx configuration of fedvit's documentation site (Markdown sources read by MyST).

Build (strict, as CI does): ``uv run --frozen --group docs sphinx-build -W --keep-going -b html docs docs/_build/html``
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the API reference imports fedvit's packages from the checkout

project = "fedvit"
author = "fedvit developers"
copyright = "2026, fedvit developers"  # noqa: A001 — Sphinx's name for it

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_static/tutorial/*.md"]  # fragments the tutorial includes
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked like any cross-reference

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_member_order = "bysource"

html_theme = "furo"
html_title = "fedvit"
html_static_path: list[str] = []
