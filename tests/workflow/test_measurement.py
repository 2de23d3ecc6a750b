"""Measurement through real Snakemake runs: a corrupted tree shows as divergence, adaptive cells stop at their
precision.
"""

from __future__ import annotations

import pandas as pd

from conftest import PLUMBING_CLOCK, load_default_config, snakemake, write_config
from specsweep import metrics as m


def test_tree_corruption_shows_as_divergence(workflow):
    config = load_default_config()
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "dflash", "algorithm": "dflash"},
        {"name": "ddtree", "algorithm": "ddtree", "budget": 32},
    ]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 6, "max_new_tokens": 96}]
    config["concurrency"] = [2]
    config["warmup"] = 0
    config["sim"] = {"startup_seconds": 0.1, "time_scale": PLUMBING_CLOCK, "faults": {"corrupt_tree_from": 3}}
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    summary = pd.read_csv(workflow / "results" / "summary.csv").set_index("method")
    assert summary.loc["dflash", "lossless_exact_rate"] == 1.0
    assert summary.loc["dflash", "lossless_compared"] == 6
    assert summary.loc["ddtree", "lossless_exact_rate"] < 0.5
    assert (
        3
        <= summary.loc["ddtree", "lossless_first_divergence_min"]
        <= summary.loc["ddtree", "lossless_first_divergence_median"]
    )
    assert pd.isna(summary.loc["ar", "lossless_exact_rate"])


def test_adaptive_cells_stop_at_the_requested_precision(workflow):
    import json as _json

    def run(target):
        config = load_default_config()
        config["methods"] = [{"name": "dflash", "algorithm": "dflash"}]
        config["workloads"] = [{"name": "short", "family": "short", "requests": 8, "max_new_tokens": 48}]
        config["concurrency"] = [4]
        config["warmup"] = 0
        config["sim"] = {"startup_seconds": 0.1}  # real time: how many sessions a precision needs is statistics
        config["adaptive"] = {"enabled": True, "target": target, "batch": 8, "max_requests": 400}
        write_config(workflow, config)
        snakemake(workflow, "results/cells/tp1/dflash/short/c4.json")
        return _json.loads((workflow / "results" / "cells" / "tp1" / "dflash" / "short" / "c4.json").read_text())

    # (how many sessions a target needs depends on how noisy the machine is: the cap is far above what an idle
    # machine needs, and a cell that hits it says so)
    loose, tight = run(0.2), run(0.1)
    for cell, target in ((loose, 0.2), (tight, 0.1)):
        p = cell["precision"]
        assert p["adaptive"] and p["target"] == target
        assert p["stopped"] == "target reached", p
        assert p["achieved_at_last_check"] <= target
        assert p["achieved"] <= target * 1.25  # recomputed once the sessions under way finished
        assert p["requests"] >= m.MIN_SESSIONS  # never stops before an interval is claimed
        assert len(cell["requests"]) == p["requests"] == cell["metrics"]["requests_sent"]
    assert tight["precision"]["requests"] > loose["precision"]["requests"]
