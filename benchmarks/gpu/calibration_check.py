"""A GPU calibration against the real run made after it: the simulated backend and the plan, both with that
calibration, against the real cells and servers (config/gpu-check.yaml's AR and DFlash cells).

    .venv/bin/python benchmarks/gpu/calibration_check.py benchmarks/gpu/calibrate-2026-12-01 [--simulated DIR]

RECORD holds what benchmarks/gpu/device.sh `calibrate` and `cells` brought back: calibration/ (the profile and its
table), environment.json (the host's record), cells/ and runs/ (the real run). In a fresh copy of the workflow
with the calibration in results/calibration/ (chosen automatically: sim.calibration auto):

- the simulated backend runs the same cells (`--config backend=sim`, one server at a time as on the one-GPU
  host, real time); every cell's output throughput and TPOT p50 against the real cell's (simulated / real - 1);
- `snakemake plan`, with the host's environment record in results/env/ and its GPU count, predicts each server's
  duration; against the real server job's (runs/<server>.json). The plan packs the longest server first; the
  real run started AR first, on a host whose kernel caches were cleared (`cells --cold`), and DFlash after it, so
  each server is given the plan's cold start-up where it started first on the host and the warm one otherwise.

--simulated DIR reads the simulated cells of an earlier run (DIR/results/cells) instead of running them; --keep DIR
runs in DIR and keeps it.
Prints markdown tables; figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from conftest import copy_workflow, snakemake  # noqa: E402

CONFIG = "config/gpu-check.yaml"


def real_cells(record: Path) -> dict[str, dict]:
    """{"tp1/ar/short/c1": cell JSON} of the record's real run."""
    folder = record / "cells"
    return {str(p.relative_to(folder).with_suffix("")): json.loads(p.read_text()) for p in folder.rglob("*.json")}


def workflow_with(record: Path, where: Path) -> Path:
    """A fresh copy of the workflow with the record's calibration and the host's environment record."""
    workflow = copy_workflow(where)
    (workflow / "results" / "calibration").mkdir(parents=True)
    for path in (record / "calibration").iterdir():
        shutil.copy2(path, workflow / "results" / "calibration" / path.name)
    (workflow / "results" / "env").mkdir()
    shutil.copy2(record / "environment.json", workflow / "results" / "env" / "sglang.json")
    return workflow


def simulate(workflow: Path, cells: list[str]) -> Path:
    """The cells on the simulated backend (one server at a time); returns the results folder."""
    targets = [f"results/cells/{c}.json" for c in cells]
    snakemake(workflow, *targets, "--configfile", CONFIG, "--config", "backend=sim", cores=1, timeout=3600)
    return workflow / "results"


def cell_table(real: dict[str, dict], simulated: Path) -> list[str]:
    lines = [
        "| cell | cost model | real tok/s | simulated tok/s | deviation | real TPOT p50 | simulated TPOT p50 "
        "| deviation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for name in sorted(real, key=lambda n: (n.split("/")[1], n.split("/")[2], int(n.split("/c")[-1]))):
        sim = json.loads((simulated / "cells" / f"{name}.json").read_text())
        assert sim["simulated"] is True and real[name]["simulated"] is False, name
        r, s = real[name]["metrics"], sim["metrics"]
        throughput = s["output_throughput"] / r["output_throughput"] - 1
        tpot = s["tpot"]["p50"] / r["tpot"]["p50"] - 1
        worst = max(worst, abs(throughput), abs(tpot))
        label = str(sim["provenance"].get("cost_model"))
        lines.append(
            f"| {name} | {label.split(',')[0]} | {r['output_throughput']:.1f} | {s['output_throughput']:.1f} | "
            f"{throughput:+.1%} | {1000 * r['tpot']['p50']:.2f} ms | {1000 * s['tpot']['p50']:.2f} ms | {tpot:+.1%} |"
        )
    lines.append(f"\nlargest deviation: {worst:.1%}")
    return lines


def plan_table(record: Path, workflow: Path, real: dict[str, dict]) -> list[str]:
    gpus = len(json.loads((record / "environment.json").read_text())["hardware"]["gpus"])
    snakemake(workflow, "plan", "--configfile", CONFIG, "--config", f"gpu_pool={{devices: {gpus}}}", cores=1)
    plan_md = (workflow / "results" / "plan" / "plan.md").read_text()
    rows = list(csv.DictReader((workflow / "results" / "plan" / "plan.csv").open()))
    runs = {p.stem: json.loads(p.read_text())["latest_run"] for p in (record / "runs" / "tp1").glob("*.json")}
    started = {
        server: min(
            real[c.removeprefix("results/cells/").removesuffix(".json")]["provenance"]["started_at"]
            for c in run["cells"]
        )
        for server, run in runs.items()
    }
    first = min(started, key=started.get)
    lines = [
        "| server | start-up charged | predicted start-up | measured start-up | predicted cells | measured cells | "
        "predicted duration | measured duration | deviation |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for server in sorted(runs, key=started.get):
        mine = [r for r in rows if r["server"] == f"tp1/{server}"]
        kind = "cold" if server == first else "warm"
        startup = float(mine[0][f"{kind}_startup_s"])
        cells = sum(float(r["warmup_s"]) + float(r["measure_s"]) for r in mine)
        predicted = startup + cells
        measured = runs[server]["seconds"]
        cell_names = [c.removeprefix("results/cells/").removesuffix(".json") for c in runs[server]["cells"]]
        measured_startup = real[cell_names[0]]["provenance"]["startup_seconds"]
        measured_cells = sum(_cell_seconds(real[c]) for c in cell_names)
        lines.append(
            f"| tp1/{server} | {kind} | {startup:.0f} s | {measured_startup:.0f} s | {cells:.0f} s | "
            f"{measured_cells:.0f} s | {predicted:.0f} s | {measured:.0f} s | {predicted / measured - 1:+.1%} |"
        )
    head = [line for line in plan_md.splitlines() if line.startswith(("- cost model", "- start-up"))]
    return head + [""] + lines


def _cell_seconds(cell: dict) -> float:
    p = cell["provenance"]
    return (datetime.fromisoformat(p["finished_at"]) - datetime.fromisoformat(p["started_at"])).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", type=Path)
    parser.add_argument("--simulated", type=Path, help="a workflow folder whose results/cells are the simulated run")
    parser.add_argument("--keep", type=Path, help="run in this (new) folder and keep it (for --simulated later)")
    args = parser.parse_args()
    real = real_cells(args.record)
    with tempfile.TemporaryDirectory(prefix="specsweep-calibration-check-") as tmp:
        workflow = workflow_with(args.record, args.keep or Path(tmp) / "wf")
        print("\n".join(plan_table(args.record, workflow, real)), flush=True)
        simulated = args.simulated / "results" if args.simulated else simulate(workflow, sorted(real))
        print("\n" + "\n".join(cell_table(real, simulated)))


if __name__ == "__main__":
    main()
