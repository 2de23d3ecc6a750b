"""Carry calibration cache entries written before shapes were named (CALIBRATION_VERSION 1) to today's key.

    .venv/bin/python benchmarks/gpu/rekey_calibration.py OLD_CACHE NEW_CACHE ENVIRONMENT CONFIG...

Version 1 keyed one server's measurements by the calibration settings, shapes included, and its rows kept the
measured context only; version 2 keys them without the shapes (a calibration with more shapes measures only those
it lacks), names each row's shape (``shape_context``) and marks the skips that a rerun would repeat (``lasting``:
the KV cache, the context length). For each entry of OLD_CACHE (cache_dir/calibration of the run that wrote it)
this checks that version 1's key, recomputed here from ENVIRONMENT (that run's results/env record) and CONFIG (the
configuration files it ran, config/config.yaml first, in order), is the entry's own, so that this configuration is
that run's; then names each row's shape (the configured context nearest to the measured one: a prefill's is its
prompt, a step's its prompt plus half its output) and writes it under today's key in NEW_CACHE. Rows are carried
as they were measured; nothing else changes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from conftest import validated  # noqa: E402  (the schema's defaults, as the workflow fills them)

from specsweep.calibration import choose  # noqa: E402
from specsweep.calibration import run as calibration  # noqa: E402
from specsweep.cache import CellCache  # noqa: E402
from specsweep.canon import digest  # noqa: E402


def version_1_key(job: dict, method: dict) -> str:
    """Version 1's key: every calibration setting but in_default_target, shapes included."""
    settings = {k: v for k, v in job["settings"].items() if k != "in_default_target"}
    return calibration.server_key(job, method, settings, version=1)


def merge(base: dict, over: dict) -> None:
    """Snakemake's merge of configuration files: mappings key by key, anything else replaced."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def main() -> None:
    old, new, environment_path, *config_files = sys.argv[1:]
    merged: dict = {}
    for path in config_files:
        merge(merged, yaml.safe_load(Path(path).read_text()))
    config = validated(merged)
    environment = json.loads(Path(environment_path).read_text())
    job = calibration.calibration_job(choose.resolve(config, environment), environment, config["tp"][0])
    methods = {m["name"]: m for m in job["methods"]}
    contexts = job["settings"]["contexts"]
    target = CellCache(Path(new))
    for path in sorted(Path(old).rglob("*.json")):
        entry = json.loads(path.read_text())
        method = methods[entry["method"]["name"]]
        if entry["key"] != version_1_key(job, method) or entry["method"] != method:
            raise SystemExit(f"{path}: not an entry of this configuration's calibration (its key differs)")
        for row in entry["rows"]:
            row["shape_context"] = min(contexts, key=lambda c: abs(c - row["context"]))
            if "model.context_length" in row.get("skipped", "") or "tokens of KV cache" in row.get("skipped", ""):
                row["lasting"] = True  # skipped for what the server and model are (version 2 says so)
        entry["key"] = calibration.entry_key(job, method)
        entry["digest"] = digest({k: v for k, v in entry.items() if k != "digest"})
        target.put(entry["key"], entry)
        print(f"{path.name[:12]} ({method['name']}, {len(entry['rows'])} rows) -> {entry['key'][:12]}")


if __name__ == "__main__":
    main()
