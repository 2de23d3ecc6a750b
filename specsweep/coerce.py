"""--config strings to the schema's types (Snakemake parses nested --config values as strings)."""

from __future__ import annotations

import re
from typing import Any

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _coerce_scalar(value: Any, types: list[str]) -> Any:
    if not isinstance(value, str):
        if isinstance(value, int) and not isinstance(value, bool) and "integer" not in types and "number" in types:
            return float(value)
        if isinstance(value, float) and "integer" in types and "number" not in types and value.is_integer():
            return int(value)
        return value
    if "string" in types:
        return value
    if "integer" in types and _INT.match(value):
        return int(value)
    if "integer" in types and "number" not in types and _FLOAT.match(value) and float(value).is_integer():
        return int(float(value))
    if "number" in types and _FLOAT.match(value):
        return float(value)
    if "boolean" in types and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def coerce_to_schema(instance: Any, schema: dict, root: dict | None = None) -> Any:
    """Return a copy of ``instance`` with strings converted to the schema's scalar types.

    ``snakemake --config tp=[1,4]`` yields ``['1', '4']``; this turns it into
    ``[1, 4]`` so that validation and rerun triggers see the same values as
    a YAML file would give. Numbers where the schema wants a float become floats
    (``temperature: 0`` and ``0.0`` are the same setting), and whole numbers written as floats become integers
    where it wants an integer (``requests: 8.0``, ``--config seed=1e3``): JSON Schema counts 4.0 as an integer,
    so without this a float would pass validation and reach a server's flags or a loop as 4.0. A float with a
    fraction stays one, and the schema refuses it naming its key.
    """
    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref.startswith("#/"):
            node = root
            for part in ref[2:].split("/"):
                node = node[part]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    for key in ("oneOf", "anyOf"):
        if key in schema:
            for option in schema[key]:
                candidate = coerce_to_schema(instance, option, root)
                if _matches_type(candidate, option):
                    return candidate
            return instance
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if "enum" in schema and not types:
        return instance
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in instance.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            out[k] = coerce_to_schema(v, sub, root) if sub else v
        return out
    if isinstance(instance, list):
        items = schema.get("items")
        return [coerce_to_schema(v, items, root) if items else v for v in instance]
    return _coerce_scalar(instance, types)


def _matches_type(value: Any, schema: dict) -> bool:
    if "enum" in schema and "type" not in schema:
        return value in schema["enum"]
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    checks = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return not types or any(checks[t](value) for t in types if t in checks)
