"""The app's files as ``flwr run`` bundles them (its FAB), found without walking the directories none can come from.

Flower 1.41/1.42's ``flwr run <app>`` lists every file under the app folder (``flwr.cli.utils.collect_files``)
before it filters them: with a virtual environment inside the folder that is ~110,000 files and ~8 s per run here,
for a FAB of ~200. :func:`staged_app` walks the folder the same way but skips a directory where no file beneath it can
pass Flower's filters, copies the files that pass into a staging folder, and ``fedvit run`` hands that folder to
``flwr run``: Flower builds the same FAB, byte for byte (tested), from its own filters. Skipped are

- directories Flower's non-overridable FAB excludes remove whole (``flwr.common.constant.FAB_EXCLUDE_PATTERNS``:
  ``.venv/``, ``build/``, ... at the top, ``__pycache__/`` anywhere);
- directories the app's ``.gitignore`` ignores whole, where no negation (``!pattern``) can re-include a file beneath
  them: every negation must be an anchored literal path (``!docs/results/data/``) outside the directory, else the
  ``.gitignore`` prunes nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from flwr.cli.utils import build_pathspec, filter_paths_for_publish, load_gitignore_patterns
from flwr.common.constant import FAB_EXCLUDE_PATTERNS

GLOB = set("*?[\\")


def builtin_excluded_dirs() -> tuple[set[str], set[str]]:
    """(top-level names, names anywhere) of the directories Flower's FAB excludes remove with everything beneath."""
    top, anywhere = set(), set()
    for pattern in FAB_EXCLUDE_PATTERNS:
        if not pattern.endswith("/**"):
            continue
        stem = pattern.removesuffix("/**")
        if stem.startswith("**/") and not GLOB & set(stem[3:]) and "/" not in stem[3:]:
            anywhere.add(stem[3:])
        elif not GLOB & set(stem) and "/" not in stem:
            top.add(stem)
    return top, anywhere


def negated_paths(patterns: list[str]) -> list[str] | None:
    """The literal paths the ``.gitignore``'s negations (``!pattern``) re-include, or None where one is not an
    anchored literal path (a glob, or a bare name that matches at any depth): then nothing is pruned for it."""
    literal = []
    for pattern in patterns:
        if pattern.startswith("!"):
            path = pattern[1:].rstrip("/")
            if GLOB & set(path) or "/" not in path:  # a slash at the start or in the middle anchors it
                return None
            literal.append(path.lstrip("/"))
    return literal


def related(directory: str, path: str) -> bool:
    """Whether ``directory`` is ``path``, lies above it or beneath it."""
    return directory == path or path.startswith(directory + "/") or directory.startswith(path + "/")


def app_files(app_dir: Path) -> dict[str, Path]:
    """Relative POSIX path → file of every file Flower's publish filter keeps (``.gitignore``, include and exclude
    rules), as ``collect_files`` then ``filter_paths_for_publish`` would give them, without entering the directories
    the module docstring lists. Symlinks are skipped and so are paths that resolve outside the folder (as Flower's)."""
    root = app_dir.expanduser().resolve()
    gitignore = root / ".gitignore"
    patterns = load_gitignore_patterns(gitignore) if gitignore.is_file() else []
    ignored = build_pathspec(patterns)
    negated = negated_paths(patterns)
    top, anywhere = builtin_excluded_dirs()

    def prunable(relative: str) -> bool:
        name = relative.rsplit("/", 1)[-1]
        if name in anywhere or relative in top:
            return True
        return negated is not None and ignored.match_file(relative + "/") and not any(
            related(relative, path) for path in negated)  # fmt: skip

    files: dict[str, Path] = {}
    for current, dirs, names in os.walk(root, followlinks=False):
        base = Path(current).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = [d for d in dirs if not prunable(prefix + d)]
        for name in names:
            path = Path(current) / name
            if path.is_symlink() or not path.resolve().is_relative_to(root):
                continue
            files[prefix + name] = path
    return {relative: Path(path) for relative, path in filter_paths_for_publish(files).items()}


def staged_app(app_dir: Path, into: Path) -> Path:
    """A copy under ``into`` of the app's files that its FAB can hold (:func:`app_files`): ``flwr run`` on it builds
    the FAB that ``flwr run`` on ``app_dir`` builds. Returns the copy's folder (named as ``app_dir``)."""
    staged = into / app_dir.expanduser().resolve().name
    for relative, path in app_files(app_dir).items():
        target = staged / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return staged
