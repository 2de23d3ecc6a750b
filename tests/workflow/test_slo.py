"""Service-level objectives through real Snakemake runs: the SLO is analysis only, in no cell's key, so an edit
aggregates and reports again and measures nothing."""

from __future__ import annotations

import pandas as pd

from conftest import fast_config, report_text, snakemake, write_config

from .test_processes import planned_jobs

REPORT = "results/report/report.pdf"


def test_an_slo_edit_aggregates_and_reports_again_and_measures_nothing(workflow):
    config = fast_config()
    config.pop("slo", None)  # the defaults
    write_config(workflow, config)
    snakemake(workflow, REPORT)
    cells = sorted((workflow / "results" / "cells").rglob("*.json"))
    stamps = {p: p.stat().st_mtime_ns for p in cells}
    assert len(cells) == 4 and set(pd.read_csv(workflow / "results" / "slo.csv")["slo"]) == {"interactive", "fast"}

    # writing the defaults out is no edit
    config["slo"] = {
        "objectives": [
            {"name": "interactive", "ttft_ms": 2000, "tpot_ms": 50},
            {"name": "fast", "ttft_ms": 1000, "tpot_ms": 10},
        ],
        "attainment": 0.9,
    }
    write_config(workflow, config)
    assert planned_jobs(workflow, REPORT) == {}

    config["slo"] = {"objectives": [{"name": "strict", "ttft_ms": 0.001}], "attainment": 0.5}
    write_config(workflow, config)
    assert planned_jobs(workflow, REPORT) == {"aggregate": 1, "report_data": 1, "report_pdf": 1}
    assert planned_jobs(workflow, "results/summary.csv") == {"aggregate": 1}
    snakemake(workflow, REPORT)
    assert {p: p.stat().st_mtime_ns for p in cells} == stamps  # nothing measured again, nothing restored
    summary = pd.read_csv(workflow / "results" / "combined.csv")
    assert "slo_strict_share" in summary and "slo_interactive_share" not in summary
    # no first token comes within a microsecond: every cell misses it, every share 0
    assert (summary["slo_strict_share"] == 0).all() and (summary["slo_strict_goodput"] == 0).all()
    assert set(summary["slo_strict_state"]) == {"missed"}  # 0 of 4 sessions: the Wilson upper bound is 0.49
    table = pd.read_csv(workflow / "results" / "slo.csv")
    assert set(table["slo"]) == {"strict"} and table["highest_concurrency"].isna().all()
    assert "Service-level objectives" in report_text(workflow) and "strict (TTFT" in report_text(workflow)
    assert planned_jobs(workflow, REPORT) == {}
