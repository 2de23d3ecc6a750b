"""A trace workload in a real Snakemake run on the simulated backend: its cells replay the trace's window at its
scaled times, keep each request's trace line, and the report's workload line and the verdict page state the trace,
its window and its time scale."""

from __future__ import annotations

import json
from importlib import resources

from conftest import fast_config, pdf_text, snakemake, write_config

MOONCAKE = str(resources.files("specsweep").joinpath("data/traces/sample-mooncake.jsonl"))
STATED = "trace sample-mooncake.jsonl (mooncake), lines 1-12, time scale 4x"


def test_a_trace_window_is_replayed_and_the_report_states_it(workflow):
    config = fast_config()
    config["workloads"] = [
        {
            "name": "mooncake",
            "family": "short",
            "source": "trace",
            "path": MOONCAKE,
            "window": {"first_line": 1, "last_line": 12},
            "time_scale": 4,
        }
    ]
    config["concurrency"] = [4]
    write_config(workflow, config)
    snakemake(workflow, "results/report/report.pdf", "results/report/verdict.html", timeout=300)
    cell = json.loads((workflow / "results/cells/tp1/dflash/mooncake/c4.json").read_text())
    trace = cell["workload"]["trace"]
    assert (trace["requests"], trace["lines"], trace["time_scale"]) == (12, [1, 12], 4)
    sessions = sorted({r["session"] for r in cell["requests"]})
    assert sessions == sorted(f"mooncake-line{n}" for n in range(1, 13))  # each request keeps its trace line
    assert all(r["expected_tokens"] == r["output_tokens"] for r in cell["requests"])  # outputs as traced
    assert cell["load"]["model"] == "trace"
    text = pdf_text(workflow / "results/report/report.pdf").replace("- ", "-")  # words LaTeX broke at a hyphen
    assert STATED in text, text[:3000]
    assert STATED in (workflow / "results/report/verdict.html").read_text()
