"""fedvit: privacy-preserving and adversarially robust federated learning of Vision Transformers with Flower, and an
attack audit for any Flower app.

The public API (stable within a minor version; docs/reference/api.md) is what ``__all__`` names:

- :func:`capture_mod` and :class:`CapturingStrategy` record a Flower app's exchanges for the audit
  (light: importing them loads Flower and NumPy, never torch);
- :func:`audit_captures` runs the audit from Python with plain types and returns an :class:`AuditResult` (torch
  loads when it runs, not at import);
- :func:`audit_app` runs a Flower app as a captured simulation and audits it with what its code states.

Everything else under ``fedvit`` is internal and may change between releases.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any


def _version() -> str:
    """The one version source, pyproject.toml's [project] version: from the installed metadata, or (a checkout's
    ``src/`` on the path, not installed) from the checkout's pyproject.toml."""
    try:
        return version("fedvit")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"] if pyproject.is_file() else "unknown"


__version__ = _version()

__all__ = ["AuditResult", "CapturingStrategy", "__version__", "audit_app", "audit_captures", "capture_mod"]

# name -> module that defines it; imported on first use, so `import fedvit` stays cheap
_PUBLIC = {
    "capture_mod": "fedvit.capture.writer",
    "CapturingStrategy": "fedvit.capture.writer",
    "audit_captures": "fedvit.audit.api",
    "AuditResult": "fedvit.audit.api",
    "audit_app": "fedvit.app.audit_app",
}

if TYPE_CHECKING:
    from fedvit.app.audit_app import audit_app
    from fedvit.audit.api import AuditResult, audit_captures
    from fedvit.capture.writer import CapturingStrategy, capture_mod


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedvit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
