"""Two engine builds side by side (configuration ``engines``) through real Snakemake runs on the simulated backend:
servers and cells per (engine, method), the engine in every cell's method and key, and the report's comparison
finding the difference the two runtime profiles model, not one between engines alike."""

from __future__ import annotations

import json
import re

import pandas as pd

from conftest import fast_config, report_text, snakemake, write_config
from specsweep import layout
from specsweep.modelling.profiles import profiles

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


def test_an_engine_whose_every_request_failed_is_not_compared_and_the_report_says_why(workflow):
    """failures.keep_going keeps an engine's cells in which every request failed: the comparison says that side is
    not final and shows no ratio and no "differs" (it showed "Differs: no" over 0 pairs), in engines.csv and in the
    PDF. The failing engine sets its own sim keys, some of them in the top-level block's acceptance and profiles:
    the top-level ones reach its server too (its block is merged key by key, not replaced)."""
    config = fast_config(requests=12, max_new_tokens=32)
    config["concurrency"] = [1]
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["failures"] = {"keep_going": True}
    mine = {**profiles()["gpus"]["H200"], "hbm_bandwidth": 4.0e12}  # a GPU profile of the configuration's own
    config["sim"].update(gpu="mine", profiles={"gpus": {"mine": mine}}, acceptance={"base": 0.7})
    config["engines"] = [
        {"name": "base"},
        {"name": "twin"},  # compared as before, beside the row that is not
        {
            "name": "broken",
            "sim": {
                "faults": {"error_rate": 1.0},
                "runtime": "slow",
                "profiles": {"runtimes": {"slow": SLOW}},
                "acceptance": {"gain": 0.5},
            },
        },
    ]
    write_config(workflow, config)
    # one job at a time: the twin's job finds base's cell in the cache (jobs at once would each measure it)
    snakemake(workflow, "results/report/report.pdf", cores=1)

    broken = json.loads((workflow / "results/cells/tp1/ar@broken/short/c1.json").read_text())
    assert {r["error"] for r in broken["requests"]} == {"http_status"}
    started = broken["provenance"]["sim_profile"]  # the settings its server was started with (launcher.launch_command)
    assert (started["gpu"], started["runtime"]) == ("mine", "slow")
    assert started["profiles"] == {"gpus": {"mine": mine}, "runtimes": {"slow": SLOW}}
    assert started["acceptance"] == {"base": 0.7, "gain": 0.5}
    log = (workflow / "logs" / "bench" / layout.server_log_name(1, "ar@broken")).read_text()
    assert "qwen3-8b on mine x1" in log  # the server found the top-level GPU profile beside the engine's runtime

    table = pd.read_csv(workflow / "results" / "engines.csv").set_index("engine")
    assert list(table.index) == ["twin", "broken"] and set(table["reference"]) == {"base"}
    broken, twin = table.loc["broken"], table.loc["twin"]
    assert broken["engine_final"] == False and broken["reference_final"] == True  # noqa: E712 (read from CSV)
    assert broken["reason"] == (
        "broken's cell is not final: 12 of 12 requests failed (http_status 12; failures.max_failed_share: 0.01)"
    )
    for column in ("output_throughput_ratio", "tpot_p50_ratio", "ttft_p50_ratio", "differs", "pairs"):
        assert pd.isna(broken[column]), column
    assert twin["engine_final"] == True and twin["reference_final"] == True  # noqa: E712
    # the twin is base's build with base's settings: its cells have base's keys, so it is served base's measurement
    # (the cell key holds what changes a measurement, not an engine's name) and compares as exactly alike
    assert twin["pairs"] == 12 and twin["output_throughput_ratio"] == 1.0 and twin["differs"] == False  # noqa: E712
    assert twin["reason"].startswith("one measurement: both engines run the same build")
    summary = pd.read_csv(workflow / "results" / "summary.csv").set_index("method")
    assert not summary.loc["ar@broken", "final"] and summary.loc["ar@base", "final"]

    text = report_text(workflow).replace("–", "--").replace("’", "'")
    assert "1 of the rows are not compared (no ratio, no differs)" in text
    assert "1 of the rows compare one measurement with itself" in text
    assert "ar short 1 broken base -- -- -- -- -- (2)" in text  # no ratio, no differs, its note
    # the twin's row: three ratios of 1 (one measurement; no interval), differs no, every reply alike, its note
    assert "ar short 1 twin base 1.000 1.000 1.000 no 100% (1)" in text
    assert (
        "(1) one measurement: both engines run the same build with the same settings (one cell key); (2) broken's "
        "cell is not final: 12 of 12 requests failed (http_status 12; failures.max_failed_share: 0.01)."
    ) in text
