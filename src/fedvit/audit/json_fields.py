"""How the audit's types become JSON, in one place (:func:`as_json`, for ``audit.json`` and ``frontier.json``): a
field is named by its name in kebab case unless it says otherwise (:func:`named`: the statistic's own name, such as
``tpr@0.01``), or its fields are merged into its parent's (:func:`flattened`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

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


def as_json(value: Any) -> Any:
    """``value`` as ``audit.json`` holds it, the one place the audit's types become JSON: a dataclass (a leakage
    type's evidence) an object of its fields, named in kebab case (``null_error`` → ``null-error``) unless the field
    names itself (:mod:`fedvit.audit.json_fields`), a flattened field's beside its parent's; numpy scalars
    and arrays numbers and lists; mappings, lists and tuples element by element; anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if (kind := f.metadata.get(FLATTEN)) is None:
                out[json_key(f)] = as_json(item)
            else:  # its fields beside the parent's (None where it is None: one schema)
                out |= as_json(item) if item is not None else {json_key(g): None for g in dataclasses.fields(kind)}
        return out
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(item) for item in value]
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value
