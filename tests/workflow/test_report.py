"""The report through real Snakemake runs: reduced plans compile with no empty chart, and every table number comes from
the aggregated CSVs.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from conftest import copy_workflow, load_default_config, server_processes_under, snakemake, write_config


def tiny(config: dict) -> dict:
    config.setdefault("warmup", 0)
    config["sim"] = {"startup_seconds": 0.1}
    for w in config["workloads"]:
        w.setdefault("requests", 4)  # two waves at concurrency 2
        w.setdefault("max_new_tokens", 48)
    return config


PLANS = {
    "no-ddtree-one-concurrency": dict(
        methods=[{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}],
        workloads=[{"name": "short", "family": "short"}], concurrency=[2]),
    "two-tp-budgets-agentic": dict(
        tp=[1, 2], concurrency=[1, 2],
        methods=[{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"},
                 {"name": "ddtree", "algorithm": "ddtree", "budget": [8, 16]}],
        workloads=[{"name": "short", "family": "short"},
                   {"name": "agent", "family": "agentic_1", "source": "builtin", "turns": 3}]),
    "no-ar": dict(
        methods=[{"name": "dflash", "algorithm": "dflash"}, {"name": "ddtree", "algorithm": "ddtree", "budget": 8}],
        workloads=[{"name": "short", "family": "short"}], concurrency=[1, 2]),
}


EXPECTED_TEXT = {
    "no-ddtree-one-concurrency": ["fewer than two DDTree budgets", "one tensor-parallel size",
                                  "one concurrency level", "No multi-turn workload"],
    "two-tp-budgets-agentic": ["Scaling efficiency", "Session completion time", "Prefix-cache hits per turn"],
    "no-ar": ["No AR baseline in this plan", "No comparison possible"],
}


def reduced_plan(root, name: str):
    """The results folder of a reduced plan's report, run in ``root``."""
    workdir = copy_workflow(root / "wf")
    config = load_default_config()
    config.update(PLANS[name])
    write_config(workdir, tiny(config))
    snakemake(workdir, "results/report/report.pdf", "results/report/figures/setup", cores=4)
    assert server_processes_under(root) == [], "a server was left running"
    return workdir / "results"


def figures_have_data(tex: str, report_dir):
    """Every chart's CSV has at least one number for each series it draws (no empty chart)."""
    plots = re.findall(r"table\[col sep=comma,(.*?)\]\{(data/[^}]+\.csv)\}", tex.replace("\n", " "))
    assert plots
    for options, csv in plots:
        frame = pd.read_csv(report_dir / csv)
        y = re.search(r"(?:^|,)y=([^,]+)", options).group(1)
        assert frame[y].notna().any(), f"{csv}: series {y} has no data"


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.long(2.6)) if name == "two-tp-budgets-agentic"
                                  else name for name in PLANS])
def test_reduced_plans_compile_and_say_what_has_no_data(tmp_path, name):
    results = reduced_plan(tmp_path, name)
    pdf = results / "report" / "report.pdf"
    assert pdf.read_bytes().startswith(b"%PDF")
    tex = (results / "report" / "report.tex").read_text()
    for text in EXPECTED_TEXT[name]:
        assert text in tex, text
    figures_have_data(tex, results / "report")
    assert "SIMULATED BACKEND" in tex
    # the appendix sets each server's run against the plan's prediction for the cells that run measured
    prediction = pd.read_csv(results / "report" / "data" / "prediction.csv")
    cells = pd.read_csv(results / "summary.csv")
    assert len(prediction) == cells.groupby(["tp", "method"]).ngroups
    assert (prediction["cells"] == len(cells) // len(prediction)).all() and (prediction["predicted_s"] > 0).all()
    if name == "two-tp-budgets-agentic":  # budget 8 runs the pull request's chain, 16 its tree of width 2
        modes = pd.read_csv(results / "report" / "data" / "ddtree_modes.csv").set_index("budget")
        assert modes.loc[8, "tree_mode"] == "chain" and modes.loc[16, "tree_mode"] == "tree"
        assert modes.loc[16, "tree_width"] == 2 and "What each DDTree budget runs" in tex
        sweep = pd.read_csv(next((results / "report" / "data").glob("budget-throughput-*.csv")))
        assert sweep.filter(like="s").shape[1] >= 2  # the chain and the tree are two marked series
        every_table_number_comes_from_the_aggregated_csv(results, tex)


def every_table_number_comes_from_the_aggregated_csv(results, tex: str):
    # tables are typeset from CSV files only: no number is typed into the document
    tables = re.findall(r"\\pgfplotstabletypeset\[.*?\]\s*\{([^}]+)\}", tex, flags=re.S)
    assert len(tables) >= 8 and all(t.startswith("data/") and t.endswith(".csv") for t in tables)
    body = re.sub(r"\\pgfplotstabletypeset\[.*?\]\s*\{[^}]+\}", "", tex, flags=re.S)
    assert not re.search(r"&\s*\d", body), "a hand-typed tabular row"
    summary = pd.read_csv(results / "summary.csv")
    key = ["tp", "method", "workload", "concurrency"]
    cells = pd.read_csv(results / "report" / "data" / "cells.csv")
    merged = cells.merge(summary.assign(method=summary["method"], workload=summary["workload"]), on=key,
                         suffixes=("", "_agg"))
    assert len(merged) == len(cells) == len(summary)
    pd.testing.assert_series_equal(merged["output_throughput"], merged["output_throughput_agg"], check_names=False)
    pd.testing.assert_series_equal(merged["speedup"], merged["speedup_agg"], check_names=False)
    pd.testing.assert_series_equal(merged["ttft_p50_ms"], merged["ttft_p50"] * 1000, check_names=False)
    pd.testing.assert_series_equal(merged["itl_p99_ms"], merged["itl_p99"] * 1000, check_names=False)
    for name in ("best_budget", "break_even"):
        shown = pd.read_csv(results / "report" / "data" / f"{name}.csv")
        source = pd.read_csv(results / f"{name}.csv")
        pd.testing.assert_frame_equal(shown.reset_index(drop=True), source.reset_index(drop=True))
    acceptance = pd.read_csv(results / "report" / "data" / "acceptance.csv").merge(
        summary[summary["concurrency"] == 1], on=["tp", "method", "workload"], suffixes=("", "_agg"))
    assert (acceptance["acceptance_length"] == acceptance["acceptance_length_agg"]).all()
    assert len(acceptance) > 0
