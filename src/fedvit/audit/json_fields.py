"""How a type of the audit's names its fields in ``audit.json``: the field's name in kebab case unless it says
otherwise (:func:`named`: the statistic's own name, such as ``tpr@0.01``), or its fields merged into its parent's
(:func:`flattened`). :func:`fedvit.audit.report.as_json` reads these."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

JSON, FLATTEN = "json", "flatten"


def named(name: str, default: Any = None) -> Any:
    """A dataclass field that ``audit.json`` calls ``name``."""
    return dataclasses.field(default=default, metadata={JSON: name})


def flattened(kind: type) -> Any:
    """A field holding a ``kind`` (or None) whose fields ``audit.json`` puts beside its parent's (all None where the
    field is None, so the schema does not depend on what was measured)."""
    return dataclasses.field(default=None, metadata={FLATTEN: kind})


def json_key(field: dataclasses.Field) -> str:
    """The key ``audit.json`` gives ``field``."""
    return field.metadata.get(JSON, field.name.replace("_", "-"))


def from_keys(kind: type, values: Mapping[str, Any]) -> Any:
    """A ``kind`` from a mapping keyed as ``audit.json`` keys its fields (fields the mapping lacks: defaults)."""
    fields = {json_key(f): f.name for f in dataclasses.fields(kind)}
    return kind(**{fields[key]: value for key, value in values.items() if key in fields})


def keyed(value: Any) -> dict[str, Any]:
    """A dataclass's own fields keyed as ``audit.json`` keys them (not recursive)."""
    return {json_key(f): getattr(value, f.name) for f in dataclasses.fields(value)}


def json_keys(kind: type) -> tuple[str, ...]:
    """The keys ``audit.json`` gives an object of ``kind``, in order (a flattened field's own keys in its place): the
    schema the type defines."""
    keys: list[str] = []
    for f in dataclasses.fields(kind):
        inner = f.metadata.get(FLATTEN)
        keys += json_keys(inner) if inner is not None else [json_key(f)]
    return tuple(keys)
