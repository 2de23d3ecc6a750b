"""Engines: named builds of the server compared side by side (configuration ``engines``).

Without ``engines`` a configuration has one engine, the build its ``sglang`` block (and on the simulated backend its
``sim`` block) describes, and nothing is named after it. With engines, each method runs on every engine unless its
``engines`` lists some, and each (method, engine) is a method of its own, named ``<method>@<engine>``: its servers,
cells, cache keys and run records are that method's, built from the engine's view of the configuration (its
``sglang`` block in place of the top-level one, its ``sim`` keys over the top-level ones).
"""

from __future__ import annotations

import copy

from .calibration import choose

SEPARATOR = "@"  # between a method's name and its engine's (neither name may hold it)


def names(config: dict) -> list[str]:
    """The configured engines' names, in order (none: the one engine of the top-level blocks)."""
    return [e["name"] for e in config.get("engines") or []]


def split(method_name: str) -> tuple[str, str | None]:
    """(the configured method's name, its engine's name or None) of an expanded method's name."""
    base, _, engine = method_name.partition(SEPARATOR)
    return base, engine or None


def qualified(method_name: str, engine: str | None) -> str:
    return method_name if engine is None else f"{method_name}{SEPARATOR}{engine}"


def runs_on(entry: dict, engine: str, config: dict) -> bool:
    """Whether a configured method runs on this engine (its ``engines``, default every one)."""
    return engine in (entry.get("engines") or names(config))


def merged(base, over):
    """``over`` merged into ``base`` key by key at every depth (a copy; neither is changed): where both hold a mapping
    each key of ``over`` is merged into ``base``'s, anything else in ``over`` replaces ``base``'s value."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if key in base else copy.deepcopy(value)
    return out


def views(config: dict) -> list[dict]:
    """The configuration and every engine's view of it (``view``)."""
    return [config] + [view(config, name) for name in names(config)]


def view(config: dict, engine: str | None) -> dict:
    """The configuration as one engine's servers see it: that engine's ``sglang`` block, its ``sim`` block merged over
    the top-level one key by key at every depth (``merged``: a top-level acceptance parameter or profile stays unless
    the engine sets that one), no engines, and only the methods that run on it (``engine`` None: the configuration
    itself)."""
    if engine is None:
        return config
    build = next((e for e in config.get("engines") or [] if e["name"] == engine), None)
    if build is None:
        raise KeyError(engine)
    out = {k: v for k, v in config.items() if k not in ("engines", "methods", "sglang", "sim")}
    out = copy.deepcopy(out)
    out["engines"] = []
    out["methods"] = [copy.deepcopy(m) for m in config["methods"] if runs_on(m, engine, config)]
    out["sglang"] = copy.deepcopy(build.get("sglang") or config["sglang"])
    out["sim"] = merged(config["sim"], build.get("sim") or {})
    if "cost_model" in config:  # a resolved configuration: this engine's own cost models (its build, its sim)
        out = choose.resolve(out, choose.recorded_environment(out["backend"], engine))
    return out
