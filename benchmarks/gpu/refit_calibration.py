"""Fit a GPU calibration's profile again from its cached measurements, after a change of the cost model.

    .venv/bin/python benchmarks/gpu/refit_calibration.py RECORD CONFIG...

RECORD holds what benchmarks/gpu/device.sh `calibrate` brought back: environment.json (the host's record),
cache/calibration/ (each server's cache entry) and calibration/ (the profile and table, written again here).
CONFIG: the configuration files the calibration ran (config/config.yaml first, in order). `snakemake calibrate`
does the same fit, and measures the shapes the entries lack (those the time bound skipped): this fits what was
measured and starts no server (specsweep.calibration.run.calibrate with measure=False).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import validated  # noqa: E402  (the schema's defaults, as the workflow fills them)
from rekey_calibration import merge  # noqa: E402

from specsweep.calibration import choose  # noqa: E402
from specsweep.calibration import run as calibration  # noqa: E402


def main() -> None:
    record, *config_files = sys.argv[1:]
    folder = Path(record)
    merged: dict = {}
    for path in config_files:
        merge(merged, yaml.safe_load(Path(path).read_text()))
    config = validated({**merged, "cache_dir": str(folder / "cache")})
    environment = json.loads((folder / "environment.json").read_text())
    job = calibration.calibration_job(choose.resolve(config, environment), environment, config["tp"][0])
    out = folder / "calibration"
    profile, table = (str(out / f"{job['digest']}.{suffix}") for suffix in ("yaml", "csv"))
    calibration.calibrate(job, environment, profile, table, out, measure=False)


if __name__ == "__main__":
    main()
