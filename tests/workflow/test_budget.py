"""budget: verdict through a real Snakemake run on the simulated backend: AR's server is measured before the
speculative one (a DAG edge), whose cell stops at its first decided look, and the tables carry its sequential
interval."""

from __future__ import annotations

import json

import pandas as pd

from conftest import PLUMBING_CLOCK, Journal, load_default_config, snakemake, write_config
from specsweep import sequential


def test_a_cell_under_budget_verdict_stops_once_decided_against_ar_measured_first(workflow):
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 40, "max_new_tokens": 48}]
    config["concurrency"] = [1]
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
    ar = json.loads((cells / "ar" / "short" / "c1.json").read_text())
    dflash = json.loads((cells / "dflash" / "short" / "c1.json").read_text())
    assert len(ar["requests"]) == 40 and ar["precision"].get("budget") is None  # AR always measures every session
    p = dflash["precision"]
    assert p["budget"] == "verdict" and p["decision"] == sequential.FASTER, p
    assert p["stopped"].startswith("decided faster at look"), p
    assert p["looks_taken"][-1]["sessions"] < 40  # stopped before its cap
    assert p["requests"] < 40 and len(dflash["requests"]) == p["requests"]  # sessions not started are not measured

    summary = pd.read_csv(workflow / "results" / "summary.csv").set_index("method")
    again = sequential.verdict_interval(dflash, ar)
    assert again is not None
    assert summary.loc["dflash", "speedup_lo"] == again["speedup_ci"][0] > 1
    assert summary.loc["dflash", "precision_stop"] == p["stopped"]
