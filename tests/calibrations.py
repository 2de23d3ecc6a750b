"""Calibration files as `snakemake calibrate` writes them (the format specsweep/calibration/choose.py reads), and the
environment record of the host they fit, for the tests of which cost model a configuration uses."""

from __future__ import annotations

from pathlib import Path

import yaml

from specsweep.calibration.choose import calibration_text, host_fingerprint
from specsweep.modelling.profiles import profiles

# a runtime measured on a slower engine than the generic roofline: every step costs more
MEASURED_RUNTIME = {
    **profiles()["runtimes"]["sglang"],
    "bandwidth_efficiency": 0.5,
    "layer_overhead": 60.0e-6,
    "cpu_step": 2.0e-3,
}
HOST = {"gpu": "NVIDIA H200", "gpu_count": 1, "driver": "570.86.15", "engine_version": "0.5.16", "engine_commit": None}
LABEL = "measured on NVIDIA H200 on 2026-12-01, largest deviation 4.2%"


def write_calibration(
    folder: Path,
    name: str = "cal.yaml",
    *,
    tp: int = 1,
    model: str = "Qwen/Qwen3-8B",
    date: str = "2026-12-01",
    runtime: dict | None = None,
    **host,
) -> Path:
    """One calibration of ``HOST`` (changed by ``host``; its fingerprint as `snakemake calibrate` writes it) for a
    model and TP size, measured on ``date``: the runtime MEASURED_RUNTIME (or ``runtime``), start-ups of 150 s cold
    and 60 s warm, a largest deviation of 4.2%; its content digest as `snakemake calibrate` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    fingerprint = {**host_fingerprint(environment_of({**HOST, **host})), "model": model, "tp": tp}
    profile = {
        "fingerprint": fingerprint,
        "measured_on": {"gpu": fingerprint["gpu"], "date": date},
        "largest_deviation": 0.042,
        "runtime": MEASURED_RUNTIME if runtime is None else runtime,
        "startup": {"cold_s": 150.0, "warm_s": 60.0},
        "table": name.replace(".yaml", ".csv"),
    }
    path.write_text(calibration_text(profile))
    return path


def edit_calibration(path: Path, change) -> None:
    """Change a calibration file's content by hand (``change`` is given its parsed content), its digest kept."""
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def environment_of(host: dict) -> dict:
    """An environment record (the parts of environment.probe's that a fingerprint reads) of a host with these
    GPUs, driver and engine."""
    return {
        "hardware": {
            "gpus": [{"index": i, "name": host["gpu"], "driver": host["driver"]} for i in range(host["gpu_count"])],
            "driver": host["driver"],
        },
        "server": {"name": "sglang", "version": host["engine_version"], "commit": host["engine_commit"]},
    }
