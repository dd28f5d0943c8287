"""The public API (docs/reference/api.md): what ``fedvit`` exports, and that the capture path and the command line
stay light (no torch at import)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import fedvit

HEAVY = ("torch", "timm", "sklearn", "torchvision", "scipy", "matplotlib")


def loaded_after(code: str) -> list[str]:
    """The heavy packages a fresh interpreter holds after running ``code``."""
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_public_names_resolve_to_their_homes():
    from fedvit.app.audit_app import audit_app
    from fedvit.audit.api import AuditResult, audit_captures
    from fedvit.capture.writer import CapturingStrategy, capture_mod

    assert sorted(fedvit.__all__) == ["AuditResult", "CapturingStrategy", "__version__", "audit_app",
                                      "audit_captures", "capture_mod"]  # fmt: skip
    assert fedvit.audit_app is audit_app
    assert fedvit.capture_mod is capture_mod and fedvit.CapturingStrategy is CapturingStrategy
    assert fedvit.audit_captures is audit_captures and fedvit.AuditResult is AuditResult
    assert fedvit.__version__ == version("fedvit")
    for name in ("capture_mod", "CapturingStrategy", "audit_captures", "AuditResult", "audit_app"):
        assert getattr(fedvit, name).__doc__, name


def test_an_unknown_name_is_an_attribute_error():
    try:
        fedvit.no_such_thing  # noqa: B018
    except AttributeError as err:
        assert "no_such_thing" in str(err)
    else:
        raise AssertionError("fedvit.no_such_thing resolved")


def test_the_capture_path_and_the_command_line_import_no_torch():
    assert loaded_after("import fedvit") == []
    assert loaded_after("from fedvit import capture_mod, CapturingStrategy") == []
    assert loaded_after("import fedvit.capture.wire_tap, fedvit.capture.reader, fedvit.app.tap") == []
    assert loaded_after("from fedvit.app.cli import build_parser; build_parser()") == []
    assert loaded_after("from fedvit import audit_captures, AuditResult, audit_app") == []  # torch: when it runs
    # `fedvit run`'s config check and staging, before flwr run (the run's own processes import torch)
    root = str(Path(__file__).resolve().parents[1])
    assert loaded_after(f"from pathlib import Path; from fedvit.app.run_config import check_config; "
                        f"from fedvit.app.app_files import app_files; assert check_config(Path({root!r}), []) == 0; "
                        f"app_files(Path({root!r}))") == []  # fmt: skip
    # the probe sees torch where it is imported
    assert "torch" in loaded_after("import fedvit.audit.pipeline")


def test_version_flag_names_fedvit_and_flower():
    from fedvit.app.cli import build_parser

    done = subprocess.run([sys.executable, "-m", "fedvit.app.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.strip() == f"fedvit {version('fedvit')} (Flower {version('flwr')})"
    assert build_parser().parse_args(["audit", "x", "--out", "y"]).command == "audit"


def test_the_audits_defaults_are_one_set_for_the_command_line_the_api_and_the_attacks():
    import inspect

    from fedvit.app.cli import build_parser
    from fedvit.attacks.membership import REFERENCES
    from fedvit.audit.api import audit_captures
    from fedvit.audit.pipeline import AuditOptions
    from fedvit.core.budget import DEFAULT_DECOYS, MEMBERSHIP_REFERENCES

    args = build_parser().parse_args(["audit", "x", "--out", "y"])
    api = inspect.signature(audit_captures).parameters
    options = AuditOptions()
    references = options.measures.references
    assert args.membership_references == api["membership_references"].default == references == REFERENCES
    assert REFERENCES == MEMBERSHIP_REFERENCES
    assert args.decoys == api["decoys"].default == options.decoys == DEFAULT_DECOYS
