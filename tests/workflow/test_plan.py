"""The plan through real Snakemake runs: priced without starting anything, cached cells free, GPUs from the pool."""

from __future__ import annotations

import os

import pandas as pd

from conftest import (
    PLUMBING_CLOCK,
    Journal,
    eight_gpu_host_config,
    fast_config,
    server_processes_under,
    snakemake,
    write_config,
)
from specsweep.environment import gpu_inventory
from specsweep.gpus import plan_gpus


def test_full_plan_is_priced_without_starting_anything(workflow):
    proc = snakemake(workflow, "plan", "--configfile", str(workflow / "config" / "plan-full.yaml"))
    md = (workflow / "results" / "plan" / "plan.md").read_text()
    assert "# Plan: 36 servers, 1080 cells" in md
    assert "GPU-hours:" in md and "predicted makespan:" in md and "lower bound" in md
    # plan-full sets no gpu_pool.devices: the GPUs it packs onto are those visible here, else 8, said so
    gpus, source = plan_gpus(None)
    assert f"- GPUs: {gpus} ({source})" in md and f"- GPUs: {gpus} ({source})" in proc.stdout
    if not os.environ.get("CUDA_VISIBLE_DEVICES") and not gpu_inventory():  # this host: no GPU
        assert "- GPUs: 8 (assumed: no GPU is visible here" in md
    plan = pd.read_csv(workflow / "results" / "plan" / "plan.csv")
    assert len(plan) == 1080 and plan["server"].nunique() == 36
    assert (plan["measure_s"] > 0).all() and not plan["cached"].any()
    # no environment, no cell: only the plan and its predictions, kept in the cache for the runs to come
    assert sorted(p.name for p in (workflow / "results").iterdir()) == ["cache", "plan"]
    assert [p.parent.name for p in (workflow / "results" / "cache").rglob("*") if p.is_file()] == ["plan"]
    assert server_processes_under(workflow) == [] and "bench_server" not in proc.stdout
    # the packing stays close to its lower bound
    ratio = float(md.split("(ratio ")[1].split(")")[0])
    assert 1.0 <= ratio <= 1.15


def test_plan_counts_cached_cells_as_free(workflow):
    write_config(workflow, fast_config(requests=4, max_new_tokens=32))
    snakemake(workflow, "results/cells/tp1/ar/short/c1.json", "results/cells/tp1/ar/short/c2.json")
    snakemake(workflow, "plan")
    plan = pd.read_csv(workflow / "results" / "plan" / "plan.csv")
    assert plan.set_index("server")["cached"].groupby(level=0).all().to_dict() == {"tp1/ar": True, "tp1/dflash": False}
    md = (workflow / "results" / "plan" / "plan.md").read_text()
    assert "cells already cached: 2 of 4" in md
    assert "| tp1/ar | 1 | 0 |" in md  # an all-cached server costs nothing


def test_servers_on_a_simulated_gpu_host_take_disjoint_gpus_from_the_pool(workflow):
    """Twelve TP-1 servers (4 long, 8 short) on a simulated 8-GPU host: each takes one GPU from the pool, at most
    eight hold GPUs at once and no GPU is held by two at a time. (How the measured makespan compares with the
    plan's prediction is a timing figure: benchmarks/plan_makespan.py, figures in benchmarks/README.md.)"""
    config = eight_gpu_host_config(workflow)
    config["sim"]["time_scale"] = PLUMBING_CLOCK  # which GPU each server holds, not for how long
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv", "--cores", "12", "--resources", "gpu=8", timeout=120)
    events = Journal(workflow).new_events()
    spans = {}
    for e in events:
        if e["event"] == "server_start":
            assert len(e["gpus"]) == 1
            spans[e["server"]] = {"gpu": e["gpus"][0], "start": e["time"]}
        elif e["event"] == "server_stop":
            spans[e["server"]]["stop"] = e["time"]
    assert len(spans) == 12
    for t in sorted(s["start"] for s in spans.values()):
        holding = [s["gpu"] for s in spans.values() if s["start"] <= t < s["stop"]]
        assert len(holding) == len(set(holding)) <= 8


def test_the_default_plan_packs_onto_the_simulated_hosts_gpus_and_says_so(workflow):
    proc = snakemake(workflow, "plan")
    md = (workflow / "results" / "plan" / "plan.md").read_text()
    assert (
        "- GPUs: 3 (from sim.gpus, the simulated host)" in md and "(from sim.gpus, the simulated host)" in proc.stdout
    )
    assert "# Plan: 4 servers, 28 cells" in md
    rows = [line.split("|") for line in md.splitlines() if line.startswith("| ") and "tp1/" in line]
    starts = {row[2].strip(): float(row[5]) for row in rows}
    # AR's server, the longest, and two others start at once; the fourth when the first of those is done
    assert starts["tp1/ar"] == 0 and sorted(starts.values())[:3] == [0, 0, 0] and max(starts.values()) > 0
