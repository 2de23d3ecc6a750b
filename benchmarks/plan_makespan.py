"""The plan's predicted makespan against a measured run, on a simulated 8-GPU host.

    .venv/bin/python benchmarks/plan_makespan.py [--runs 2]

Twelve TP-1 servers (4 AR, 4 DFlash, 4 DDTree budgets; tests/conftest.py eight_gpu_host_config) run through
Snakemake with `--resources gpu=8`, taking GPUs from the pool in the plan's order. Prints, per run, the plan's
predicted makespan, the measured one (first server start to last server stop, from the bench jobs' journals) and the
packing lower bound from the measured server durations (max(sum / 8, longest)). Figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import Journal, copy_workflow, eight_gpu_host_config, snakemake, write_config  # noqa: E402


def run_once(folder: Path) -> dict:
    workflow = copy_workflow(folder / "wf")
    write_config(workflow, eight_gpu_host_config(workflow))
    snakemake(workflow, "plan")
    md = (workflow / "results" / "plan" / "plan.md").read_text()
    predicted = float(md.split("predicted makespan: ")[1].split("(")[1].split(" s)")[0])
    snakemake(workflow, "--cores", "12", "--resources", "gpu=8", timeout=900)
    spans: dict = {}
    for event in Journal(workflow).new_events():
        if event["event"] in ("server_start", "server_stop"):
            spans.setdefault(event["server"], {})[event["event"]] = event["time"]
    measured = max(s["server_stop"] for s in spans.values()) - min(s["server_start"] for s in spans.values())
    durations = [s["server_stop"] - s["server_start"] for s in spans.values()]
    bound = max(sum(durations) / 8, max(durations))
    return {
        "predicted_s": predicted,
        "measured_s": round(measured, 1),
        "measured_over_predicted": round(measured / predicted, 3),
        "lower_bound_s": round(bound, 1),
        "measured_over_bound": round(measured / bound, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="specsweep-makespan-") as tmp:
            print(json.dumps(run_once(Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
