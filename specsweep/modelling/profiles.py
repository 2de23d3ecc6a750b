"""The simulator's profiles: GPUs, models, runtimes (what the cost model prices a step with) and draft models'
acceptance (drafters), shipped in specsweep/data/sim_profiles.yaml, with a configuration's overrides
(``sim.profiles``)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from ..canon import yaml_data


@lru_cache(maxsize=1)
def default_profiles() -> dict:
    """Hardware, model and runtime profiles shipped in specsweep/data/sim_profiles.yaml."""
    return yaml_data(resources.files("specsweep").joinpath("data/sim_profiles.yaml").read_text())


def profiles(overrides: dict | None = None) -> dict:
    """Shipped profiles with config overrides (sim.profiles) merged in, entry by entry."""
    base = default_profiles()
    out = {kind: {name: dict(entry) for name, entry in base[kind].items()} for kind in base}
    for kind, entries in (overrides or {}).items():
        for name, entry in entries.items():
            out.setdefault(kind, {}).setdefault(name, {}).update(entry)
    return out
