"""budget: verdict through a real Snakemake run on the simulated backend: AR's server is measured before the
speculative one (a DAG edge), whose cell stops at its first decided look and aborts the sessions under way, and the
tables carry its sequential interval."""

from __future__ import annotations

import json

import pandas as pd

from conftest import PLUMBING_CLOCK, Journal, load_default_config, snakemake, write_config
from specsweep import sequential


def test_a_cell_under_budget_verdict_stops_once_decided_against_ar_measured_first(workflow):
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 40, "max_new_tokens": 48}]
    config["concurrency"] = [4]
    config["warmup"] = 0
    config["sim"] = {"startup_seconds": 0.1, "time_scale": PLUMBING_CLOCK}
    config["budget"] = "verdict"
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv", timeout=240)

    events = Journal(workflow).new_events()
    starts = {e["server"]: e["time"] for e in events if e["event"] == "server_start"}
    stops = {e["server"]: e["time"] for e in events if e["event"] == "server_stop"}
    assert stops["tp1/ar"] <= starts["tp1/dflash"]  # AR measured first: the speculative job waits for its cells

    cells = workflow / "results" / "cells" / "tp1"
    ar = json.loads((cells / "ar" / "short" / "c4.json").read_text())
    dflash = json.loads((cells / "dflash" / "short" / "c4.json").read_text())
    assert len(ar["requests"]) == 40 and ar["precision"].get("budget") is None  # AR always measures every session
    p = dflash["precision"]
    assert p["budget"] == "verdict" and p["decision"] == sequential.FASTER, p
    look = p["looks_taken"][-1]
    assert look["look"] < len(p["looks_planned"]) and look["sessions"] < 40  # stopped before its cap
    # once decided, the three other slots' sessions were under way: aborted, not waited for (no record of them)
    assert p["stopped"] == f"decided faster at look {look['look']} of 4; 3 sessions under way aborted", p
    assert p["sessions_aborted"] == p["turns_aborted"] == 3
    # the cell holds exactly the look's sessions, each finished: sessions not started or aborted are not measured
    assert sorted(r["session"] for r in dflash["requests"]) == sorted(p["look_sessions"])
    assert len(p["look_sessions"]) == look["sessions"] and all(r["error"] is None for r in dflash["requests"])
    assert p["requests"] == look["sessions"] + p["sessions_aborted"] + p["sessions_set_aside"] < 40

    summary = pd.read_csv(workflow / "results" / "summary.csv").set_index("method")
    again = sequential.verdict_interval(dflash, ar)
    assert again is not None
    assert summary.loc["dflash", "speedup_lo"] == again["speedup_ci"][0] > 1
    assert summary.loc["dflash", "precision_stop"] == p["stopped"]


def test_cells_implied_slower_or_dominated_are_listed_not_measured_and_budget_exhaustive_measures_them(workflow):
    """DDTree with a 4096-node tree on a slower GPU verifies so much per step that it is slower than AR at every
    concurrency (predicted 0.71x AR at 1, 0.05x at 16): at TP 1 its cell at 1 decides slower, the top (16) confirms,
    the cells between (4, 8) are implied; at TP 2 it is dominated by the 16-node tree on every concurrency and not
    measured at all (no server started). (A 2048-node tree is predicted 1.29x AR at 1, and its measured interval
    there straddled 1 on a loaded machine: its cell at 4 was then measured, rightly.)"""
    config = load_default_config()
    config["tp"] = [1, 2]
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "ddtree", "algorithm": "ddtree", "budget": [16, 4096]},
    ]
    config["workloads"] = [{"name": "short", "family": "short", "max_new_tokens": 48}]
    config["concurrency"] = [1, 4, 8, 16]
    config["warmup"] = 0
    config["sim"] = {"startup_seconds": 0.1, "time_scale": PLUMBING_CLOCK, "gpu": "RTX-PRO-6000"}
    config["budget"] = "verdict"
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv", timeout=300)

    skipped = pd.read_csv(workflow / "results" / "skipped.csv")
    rows = {(r.tp, r.method, r.concurrency): r.reason for r in skipped.itertuples()}
    assert all(rows[(1, "ddtree-b4096", c)].startswith("not measured: implied slower") for c in (4, 8)), rows
    dominated = "not measured: dominated at TP 1 by ddtree-b16"
    assert all(rows[(2, "ddtree-b4096", c)] == dominated for c in (1, 4, 8, 16)), rows
    assert len(rows) == 6
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    measured = set(zip(summary["tp"], summary["method"], summary["concurrency"]))
    assert not measured & set(rows)  # a cell not measured has no number
    events = Journal(workflow).new_events()
    assert not [e for e in events if e["event"] == "server_start" and e["server"] == "tp2/ddtree-b4096"]

    # remeasure names a cell not measured: it is measured (never skipped), the list loses it
    snakemake(workflow, "results/summary.csv", "--config", "remeasure=tp1/ddtree-b4096/short/c8", timeout=300)
    cell = json.loads((workflow / "results" / "cells" / "tp1" / "ddtree-b4096" / "short" / "c8.json").read_text())
    assert cell["precision"]["budget"] == "verdict" and cell["requests"]
    left = pd.read_csv(workflow / "results" / "skipped.csv")
    assert (1, "ddtree-b4096", 8) not in set(zip(left["tp"], left["method"], left["concurrency"])) and len(left) == 5

    # budget: exhaustive measures every cell (the others come from the cache)
    config["budget"] = "exhaustive"
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv", timeout=300)
    assert pd.read_csv(workflow / "results" / "skipped.csv").empty
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert set(rows) <= set(zip(summary["tp"], summary["method"], summary["concurrency"]))
