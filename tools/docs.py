"""The docs generated from the code: config/README.md from config/schema.yaml (every configuration key with its
type, default and the description the schema gives it), and the metric definitions of docs/metrics.md from
specsweep/metrics.py's docstrings (the text the report prints).

    .venv/bin/python tools/docs.py            # writes both
    .venv/bin/python tools/docs.py --check    # exits 1, naming each stale file, where one is not what the code gives

tests/unit/test_docs.py regenerates the text and compares it with the files, so a schema or docstring edit without
this command fails the tests. A configuration key without a description is an error naming it: describe it in the
schema.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "config" / "schema.yaml"
README = REPO / "config" / "README.md"
METRICS_PAGE = REPO / "docs" / "metrics.md"
COMMAND = ".venv/bin/python tools/docs.py"
BEGIN = f"<!-- generated from specsweep/metrics.py's docstrings by `{COMMAND}`: edit the docstrings, not this list -->"
END = "<!-- end of the generated definitions -->"


@dataclass(frozen=True)
class Key:
    """One configuration key: its path (``methods[].algorithm``, ``ddtree_builds.<name>.width``), its schema with
    references to scalar shapes resolved, whether its parent requires it, and the shared shape (a ``$defs`` object)
    or top-level section it has the form of, if any."""

    path: str
    schema: dict
    required: bool = False
    shape: str | None = None


def load_schema(path: Path = SCHEMA) -> dict:
    """The configuration schema as a dict."""
    return yaml.safe_load(path.read_text())


def _target(root: dict, ref: str) -> dict:
    """The schema a local ``$ref`` (``#/$defs/name``, ``#/properties/sim``) points to."""
    node = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _resolved(root: dict, node: dict) -> tuple[dict, str | None]:
    """A key's schema with its ``$ref`` merged under the key's own fields (a description or default given beside
    the reference wins), and the name of the shape where the reference is to an object documented on its own: a
    ``$defs`` object (its section under "Shapes") or a top-level section (``engines[].sim`` has the form of
    ``sim``)."""
    ref = node.get("$ref")
    if ref is None:
        return node, None
    target = _target(root, ref)
    merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    if "properties" in target:
        return merged, ref.removeprefix("#/").split("/", 1)[1].removeprefix("properties/")
    return merged, None


def _children(root: dict, node: dict, path: str) -> list[tuple[str, dict, bool]]:
    """(path, schema, required) of the keys below one key: an object's properties (``a.b``), the properties of a
    list's items (``a[].b``) or of a map's values (``a.<name>.b``)."""
    if "properties" in node:
        required = set(node.get("required", []))
        return [(f"{path}.{k}" if path else k, v, k in required) for k, v in node["properties"].items()]
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        required = set(items.get("required", []))
        return [(f"{path}[].{k}", v, k in required) for k, v in items["properties"].items()]
    values = node.get("additionalProperties")
    if isinstance(values, dict):
        shape, _ = _resolved(root, values)
        if "properties" in shape:
            required = set(shape.get("required", []))
            return [(f"{path}.<name>.{k}", v, k in required) for k, v in shape["properties"].items()]
    return []


def keys(root: dict, node: dict | None = None, path: str = "") -> list[Key]:
    """Every key under ``node`` (the whole schema by default), depth first in the schema's order. A key whose
    schema is a shared object shape (``$defs``, or a top-level section) is listed once and not expanded here: the
    shape's own keys are listed under it (``shape_keys``)."""
    found: list[Key] = []
    for child, schema, required in _children(root, root if node is None else node, path):
        resolved, shape = _resolved(root, schema)
        found.append(Key(child, resolved, required, shape))
        if shape is None:
            found += keys(root, resolved, child)
    return found


def shapes(root: dict) -> list[str]:
    """The ``$defs`` objects some key has the form of, in the schema's order."""
    used = {k.shape for k in keys(root) if k.shape}
    return [name for name in root.get("$defs", {}) if name in used]


def every_key(root: dict) -> list[Key]:
    """Every key of the configuration and of the shared shapes (as ``<shape>.key``)."""
    found = keys(root)
    for name in shapes(root):
        found += keys(root, root["$defs"][name], f"<{name}>")
    return found


def paths(root: dict) -> set[str]:
    """Every key's full path as a configuration writes it, shared shapes expanded where they are used
    (``sglang.python``, ``engines[].sglang.python``, ``engines[].sim.gpu``, ``algorithms.ddtree.flags``): what a
    document may name."""
    found: set[str] = set()

    def walk(node: dict, path: str, depth: int) -> None:
        for child, schema, _ in _children(root, node, path):
            found.add(child)
            resolved, _ = _resolved(root, schema)
            if depth < 8:
                walk(resolved, child, depth + 1)

    walk(root, "", 0)
    return found


def undescribed(root: dict) -> list[str]:
    """The keys (and shared shapes) without a description."""
    missing = [k.path for k in every_key(root) if not k.schema.get("description")]
    return missing + [f"$defs.{name}" for name in shapes(root) if not root["$defs"][name].get("description")]


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _bounds(node: dict) -> str:
    parts = []
    if "minimum" in node:
        parts.append(f">= {_number(node['minimum'])}")
    if "exclusiveMinimum" in node:
        parts.append(f"> {_number(node['exclusiveMinimum'])}")
    if "maximum" in node:
        parts.append(f"<= {_number(node['maximum'])}")
    return " " + ", ".join(parts) if parts else ""


def type_of(root: dict, node: dict) -> str:
    """A key's type in words: ``integer >= 1, <= 1024``, ``one of `sim`, `sglang```, ``list of string``."""
    node, shape = _resolved(root, node)
    if shape is not None:
        return _link(root, shape)
    if "oneOf" in node:
        return " or ".join(type_of(root, alternative) for alternative in node["oneOf"])
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(type_of(root, {**node, "type": k}) for k in kind)
    if kind == "array":
        items = node.get("items", {})
        if "properties" in items:
            return "list of objects"
        return f"list of {type_of(root, items)}" if items else "list"
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return "map of name to " + (
                "object" if "properties" in _resolved(root, values)[0] else type_of(root, values)
            )
        return "object"
    if kind in ("integer", "number"):
        return kind + _bounds(node)
    return str(kind or "any")


def _link(root: dict, shape: str) -> str:
    """A shape's type: a link to its section (a shared shape's, or the top-level section it has the form of)."""
    return f"[`{shape}`](#{shape})" if shape in root.get("$defs", {}) else f"as [`{shape}`](#{shape})"


def _value(value) -> str:
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    """Text for one table cell: on one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(root: dict, rows: list[Key]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key in rows:
        default = _value(key.schema["default"]) if "default" in key.schema else ("required" if key.required else "")
        kind = _link(root, key.shape) if key.shape else type_of(root, key.schema)
        lines.append(
            f"| `{key.path}` | {_cell(kind)} | {_cell(default)} | {_cell(key.schema.get('description', ''))} |"
        )
    return lines


def render(root: dict) -> str:
    """config/README.md for this schema (ValueError naming every key without a description)."""
    missing = undescribed(root)
    if missing:
        raise ValueError(
            "config/schema.yaml: no description for " + ", ".join(missing) + "; describe each key in the schema"
        )
    out = [
        "# Configuration keys",
        "",
        f"<!-- Generated from config/schema.yaml by `{COMMAND}`; edit the schema's descriptions, not this file. -->",
        "",
        " ".join(root["description"].split()),
        "",
        "`config/config.yaml` is the default configuration, `config/plan-full.yaml` the full plan; "
        "[docs/configuration.md](../docs/configuration.md) explains the main concepts (methods and their "
        "algorithms, sweeps, engines, DDTree builds). A key below written `a[].b` is key `b` of each entry of the "
        "list `a`; `a.<name>.b` is key `b` of each entry of the map `a`. Keys marked required have no default.",
        "",
    ]
    required = set(root.get("required", []))
    for name, node in root["properties"].items():
        resolved, shape = _resolved(root, node)
        summary = (
            f"Type: {type_of(root, node)}"
            + (f"; default {_value(resolved['default'])}" if "default" in resolved else "")
            + ("; required" if name in required else "")
            + "."
        )
        out += [f"## `{name}`", "", " ".join(resolved["description"].split()), "", summary, ""]
        below = keys(root, resolved, name) if shape is None else []
        if below:
            out += _table(root, below) + [""]
    out += [
        "## Shapes",
        "",
        "Objects several keys share (each key above that names one has these keys).",
        "",
    ]
    for name in shapes(root):
        shape = root["$defs"][name]
        out += [f"### `{name}`", "", " ".join(shape["description"].split()), ""]
        out += _table(
            root,
            [Key(k.path.replace(f"<{name}>.", "", 1), k.schema, k.required) for k in keys(root, shape, f"<{name}>")],
        ) + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def metric_definitions() -> str:
    """The definitions section of docs/metrics.md: each metric's and each statistic's first docstring paragraph, as
    the report prints them."""
    from specsweep import metrics

    def item(name: str, text: str) -> str:
        return f"- `{name}`: " + text.replace("*", "\\*")

    return "\n".join(
        [BEGIN, "", "Metrics:", ""]
        + [item(n, d) for n, d in metrics.definitions()]
        + ["", "Statistics (how each interval is made):", ""]
        + [item(n, d) for n, d in metrics.statistics()]
        + ["", END]
    )


def with_definitions(page: str) -> str:
    """A metrics page with its generated section (between BEGIN's and END's lines) made again."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/metrics.md: no generated section (the lines {BEGIN!r} ... {END!r})")
    return page[:start] + metric_definitions() + page[end + len(END) :]


def main(argv: list[str]) -> int:
    wanted = {README: render(load_schema()), METRICS_PAGE: with_definitions(METRICS_PAGE.read_text())}
    if argv[1:] == ["--check"]:
        stale = [str(path.relative_to(REPO)) for path, text in wanted.items() if path.read_text() != text]
        if stale:
            print(f"{', '.join(stale)}: not what the code gives; run {COMMAND}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
