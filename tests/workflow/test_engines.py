"""Two engine builds side by side (configuration ``engines``) through real Snakemake runs on the simulated backend:
servers and cells per (engine, method), the engine in every cell's method and key, and the report's comparison
finding the difference the two runtime profiles model, not one between engines alike."""

from __future__ import annotations

import json

import pandas as pd

from conftest import fast_config, report_text, snakemake, write_config
from specsweep.sim.model import profiles

# the "slow" build: the generic runtime reading the weights at half its bandwidth (a step about 1.8 times as long)
GENERIC = profiles()["runtimes"]["sglang"]
SLOW = {**GENERIC, "bandwidth_efficiency": GENERIC["bandwidth_efficiency"] / 2}


def test_two_engines_run_side_by_side_and_the_report_compares_them(workflow):
    config = fast_config(requests=12, max_new_tokens=48, time_scale=1)  # real time: the steps, not the host
    config["concurrency"] = [1]
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "dflash", "algorithm": "dflash", "engines": ["base"]},
    ]
    config["engines"] = [
        {"name": "base"},
        {"name": "slow", "sim": {"runtime": "slow", "profiles": {"runtimes": {"slow": SLOW}}}},
        {"name": "twin"},  # the same build as base under another name: nothing to find
    ]
    write_config(workflow, config)
    snakemake(workflow, "results/report/report.pdf")

    cells = {p.parent.parent.name for p in (workflow / "results" / "cells" / "tp1").rglob("c1.json")}
    assert cells == {"ar@base", "ar@slow", "ar@twin", "dflash@base"}  # dflash runs on base alone
    base = json.loads((workflow / "results/cells/tp1/ar@base/short/c1.json").read_text())
    slow = json.loads((workflow / "results/cells/tp1/ar@slow/short/c1.json").read_text())
    assert base["method"]["engine"] == "base" and slow["method"]["engine"] == "slow" and base["key"] != slow["key"]
    assert slow["provenance"]["sim_profile"]["runtime"] == "slow"

    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert set(summary["engine"]) == {"base", "slow", "twin"}
    assert summary.loc[summary["method"] == "dflash@base", "speedup"].notna().all()  # against ar@base
    table = pd.read_csv(workflow / "results" / "engines.csv").set_index("engine")
    assert list(table.index) == ["slow", "twin"] and set(table["reference"]) == {"base"}
    assert table.loc["slow", "pairs"] == 12
    # the slower steps: lower throughput, longer TPOT, both intervals excluding 1. The twin's ratios stay near 1; its
    # intervals, narrow for AR, may still exclude 1 by a few percent: two cells measured in real time minutes apart
    # on a shared host drift apart by the host's load, not by their build (the flag's rate for twins is checked in
    # virtual time, benchmarks/ci_coverage.py and tests/unit/test_ci_coverage.py)
    assert table.loc["slow", "output_throughput_ratio_hi"] < 0.8 and table.loc["slow", "tpot_p50_ratio_lo"] > 1.3
    assert table.loc["slow", "differs"]
    for metric in ("output_throughput_ratio", "tpot_p50_ratio"):
        assert abs(table.loc["twin", metric] - 1) < 0.1, (metric, table.loc["twin", metric])
    assert table.loc["slow", "exact_match_rate"] == 1.0  # greedy AR on both: the same replies

    builds = pd.read_csv(workflow / "results" / "engine_builds.csv", dtype=str, keep_default_na=False)
    assert list(builds.columns) == ["item", "base", "slow", "twin", "differs"]
    assert "commit or wheel" in set(builds["item"])  # the simulated builds alike: nothing differs but what is reported
    assert set(builds.loc[~builds["item"].str.contains(r"\("), "differs"]) == {"False"}

    text = report_text(workflow)
    assert "Engines compared cell by cell" in text and "Simulated: the engines are simulated servers." in text
    assert "What differs between the builds" in text


def test_a_ddtree_build_of_the_configurations_own_runs_through_the_workflow(workflow):
    """ddtree_builds: every job that reads DDTree methods (the servers, the aggregate, the report) knows the
    configuration's own build by its name, and its tree is the one the build describes."""
    config = fast_config(requests=4, max_new_tokens=48)
    config["concurrency"] = [1]
    config["ddtree_builds"] = {
        "mine": {
            "source": "a fork",
            "spine_mode": False,
            "width": "topk",
            "max_topk": 4,
            "depth_bonus": 0.0,
            "early_stop_margin": None,
        }
    }
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "ddtree", "algorithm": "ddtree", "budget": 8, "topk": "uncapped", "tree_build": "mine"},
    ]
    write_config(workflow, config)
    snakemake(workflow, "results/report/report.pdf")
    cell = json.loads((workflow / "results/cells/tp1/ddtree/short/c1.json").read_text())
    assert cell["method"]["params"]["tree_build"] == "mine" and "topk" not in cell["method"]["params"]
    summary = pd.read_csv(workflow / "results" / "summary.csv").set_index("method")
    assert summary.loc["ddtree", "tree_build"] == "mine" and summary.loc["ddtree", "tree_width"] == 4
