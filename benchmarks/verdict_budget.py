"""budget: verdict against budget: exhaustive on the simulator, in virtual time: verdicts and GPU-hours.

For each seed (independent prompt draws and drafts), each cell of a configuration is replayed once on the simulated
engine in virtual time (specsweep.sim.replay: the engine's own steps, no sleeping; multi-turn sessions turn by turn),
AR's cell and each speculative method's over every session of the cell. From the same records:

- exhaustive: the cell's verdict from metrics.speedup's paired 95% bootstrap interval over all its sessions (what
  budget: exhaustive reports), its cost every session's time;
- verdict: the cell's looks (sequential.Looks) taken as the workflow's closed loop takes them, as each request
  finishes, on the requests finished by then; at the first decided look no new session starts and the sessions under
  way are aborted (cells.measure_verdict), so the cell's cost ends at that moment. On a deterministic engine the
  requests finished before it are those of the exhaustive replay, so one replay serves both.

GPU-hours = sum over servers of TP x (STARTUP_SECONDS + its cells' seconds; no warm-up under either budget); AR's
server measures every session under both budgets. A cell's state (faster / slower / inconclusive, an equivalent
cell inconclusive) is compared
between the budgets: agreement = share of speculative cells in the same state; a flip = faster under one budget and
slower under the other. The true speedup of a cell is the mean of its exhaustive estimates over the seeds; a
wrong-way verdict = a decided cell on the other side of 1 from a true speedup more than 5% from 1.

Under budget: verdict the implied cells are not measured (specsweep.implied: implied slower, with the plan's
predicted speedups; dominated at the smallest TP): they cost nothing; an implied-slower cell counts as slower, a
dominated one has no state and is counted apart.

Numbers are simulated (the simulator's H200 profile of Qwen3-8B); plan-full is replayed at TP 1 and 4 on a subset of
its workloads and concurrencies with at most 128 new tokens (--full for all of it: hours of CPU) so that the run
takes minutes.

    .venv/bin/python benchmarks/verdict_budget.py [--seeds 5] [--full]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from specsweep import config as cfg
from specsweep import implied, metrics, sequential, verdict
from specsweep.calibration.choose import resolve
from specsweep.coerce import coerce_to_schema
from specsweep.jobs import cell_requests, workload_concurrency
from specsweep.methods import expand_methods
from specsweep.plan import predict_server
from specsweep.sim.replay import closed_loop, engine
from specsweep.workloads import build

REPO = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 90.0  # one server's start-up on an H200 (weights, initialisation, CUDA graphs), under both budgets
# plan-full's subset by default: TP 1 and 4, its short workload at these concurrencies, 128 new tokens (the default
# configuration has the long and multi-turn workloads)
SUBSET = {"tp": [1, 4], "workloads": ["short"], "concurrency": [1, 4, 16, 64], "max_new_tokens": 128}


def load(name: str, subset: dict | None) -> dict:
    """A configuration of the repository, validated as the workflow does (defaults filled, normalised), on the
    simulated backend, cut to ``subset`` where given."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config" / name).read_text())
    config["backend"] = "sim"
    if subset:
        config["tp"] = subset["tp"]
        config["workloads"] = [
            dict(w, max_new_tokens=min(w["max_new_tokens"], subset["max_new_tokens"]))
            for w in config["workloads"]
            if w["name"] in subset["workloads"]
        ]
        config["concurrency"] = subset["concurrency"]
        for w in config["workloads"]:
            if "concurrency" in w:
                w["concurrency"] = [c for c in w["concurrency"] if c in subset["concurrency"]]
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())
    config = cfg.with_engine_sims(coerce_to_schema(copy.deepcopy(config), schema))
    validate(config, str(REPO / "config" / "schema.yaml"))
    return cfg.normalise(config)


def stopped(records: list[dict], sessions: list, ar: list[dict], concurrency: int, settings: dict) -> dict:
    """Where the cell stops under budget: verdict: the looks taken as each request finishes, on the requests finished
    by then (the closed loop's check); at the first decided look the cell stops, the sessions under way aborted. Its
    decision, interval, cost (seconds until that moment: nothing for the aborted sessions after it) and the sessions
    it started."""
    looks = sequential.Looks(
        [s.id for s in sessions], {s.id: 1 + len(s.followups) for s in sessions}, ar, concurrency, settings
    )
    by_end = sorted(records, key=lambda r: r["t_end"])
    done: Counter = Counter()
    look, moment = None, by_end[-1]["t_end"]
    for i, r in enumerate(by_end):
        done[r["session"]] += 1
        if looks.ready_after(done):
            look = looks.step(by_end[: i + 1])
            if look:
                moment = r["t_end"]
                break
    started = sum(r["turn"] == 0 and r["t0"] < moment for r in records) if look else len(sessions)
    return {"look": look or looks.taken[-1], "cost": moment, "sessions": started}


def method_engine(method, tp: int, seed: int):
    """The simulated engine of a configured method at ``tp``, its drafts seeded by ``seed``."""
    names = {p.name for p in method.spec.parameters}
    params = {k: v for k, v in method.params.items() if k in names}
    return engine(method.algorithm, tp=tp, random_seed=seed, **params)


def predicted_speedups(config: dict, tp: int, methods: list, ar: str) -> dict:
    """The plan's predicted speedup of each cell over AR's, per method: {method: {(workload, concurrency): AR's
    predicted seconds / the method's}}, as the bench job has it for the implied-slower rule."""

    def seconds(name: str) -> dict:
        return {(r["workload"], r["concurrency"]): r["measure_s"] for r in predict_server(config, tp, name)}

    base = seconds(ar)
    return {m.name: {cell: base[cell] / s for cell, s in seconds(m.name).items()} for m in methods}


def replay(config: dict, seed: int) -> list[dict]:
    """Every speculative cell of ``config`` for one seed: both budgets' state and seconds, and AR's seconds; under
    budget: verdict a cell implied slower or dominated at the smallest TP (implied) costs nothing and has no state
    of its own."""
    methods = expand_methods(config)
    ar_method = next(m for m in methods if not m.spec.speculative)
    settings = dict(config["verdict_stopping"])
    priced = resolve(config, None)
    rows, smallest = [], min(config["tp"])
    intervals: dict = {}  # {(workload, method): {concurrency: interval}} at the smallest TP, for implied.dominated
    for tp in config["tp"]:
        speculative = [m for m in methods if m.spec.speculative]
        predictions = predicted_speedups(priced, tp, speculative, ar_method.name)
        for w in config["workloads"]:
            levels = workload_concurrency(config, w)
            most = max(cell_requests(w, c, config["load"]) for c in levels)
            sessions = build(dict(w, requests=most), seed, False, None, config["model"]["context_length"])
            cells = {c: sessions[: cell_requests(w, c, config["load"])] for c in levels}
            ar = {c: closed_loop(method_engine(ar_method, tp, seed), cells[c], c) for c in levels}
            for m in methods:
                if not m.spec.speculative:
                    continue
                family = [f.name for f in methods if f.algorithm == m.algorithm]
                by = (
                    implied.dominated(m.name, {f: intervals.get((w["name"], f), {}) for f in family}, levels)
                    if tp > smallest
                    else None
                )
                predicted = predictions[m.name]
                per_level = {c: method_cell(m, tp, seed, cells[c], ar[c], c, settings) for c in levels}
                decisions: dict = {}
                skipped: dict = {}
                while by is None:
                    nxt, skipped = implied.next_concurrency(
                        levels, decisions, {c: predicted[(w["name"], c)] for c in levels}
                    )
                    if nxt is None:
                        break
                    decisions[nxt] = per_level[nxt]["decision"]
                for c in levels:
                    row = per_level[c]
                    if by is not None or c in skipped:
                        row.update(verdict_s=0.0, verdict=verdict.SLOWER if c in skipped else "dominated")
                    if tp == smallest and c in decisions:  # a cell not measured is absent
                        intervals.setdefault((w["name"], m.name), {})[c] = (
                            tuple(row["ci"]) if row["ci"][0] is not None else None
                        )
                    rows.append(
                        dict(row, key=(tp, m.name, w["name"], c), server=(tp, m.name), ar_key=(tp, w["name"], c))
                    )
    return rows


def method_cell(m, tp: int, seed: int, cell: list, ar: list[dict], c: int, settings: dict) -> dict:
    """One method's cell replayed once: its exhaustive speedup and state, where budget: verdict stops it, and both
    budgets' GPU-seconds (and AR's cell's)."""
    records = closed_loop(method_engine(m, tp, seed), cell, c)
    full = metrics.speedup(records, ar, metrics.steady_window(records, c), metrics.steady_window(ar, c), seed=seed)
    lo, hi = full["speedup_ci"] or (None, None)
    stop = stopped(records, cell, ar, c, settings)
    ci = stop["look"]["speedup_ci"] or (None, None)
    return {
        "speedup": full["speedup"],
        "exhaustive": verdict.state(lo, hi),
        "verdict": verdict.state(*ci),
        "ci": list(ci),
        "decision": stop["look"]["decision"],
        "exhaustive_s": max(r["t_end"] for r in records) * tp,
        "verdict_s": stop["cost"] * tp,
        "ar_s": max(r["t_end"] for r in ar) * tp,
        "sessions": len(cell),
        "sessions_verdict": stop["sessions"],
    }


def gpu_hours(rows: list[dict], column: str) -> float:
    """Start-ups of every server (AR's included) plus every cell's GPU-seconds, AR's cells counted once; under
    budget: verdict a server whose every cell is dominated is not started."""
    servers = {r["server"] for r in rows if column == "exhaustive_s" or r["verdict"] != "dominated"}
    servers |= {(k[0], "ar") for k in (r["ar_key"] for r in rows)}
    ar = {r["ar_key"]: r["ar_s"] for r in rows}
    return (sum(tp * STARTUP_SECONDS for tp, _ in servers) + sum(ar.values()) + sum(r[column] for r in rows)) / 3600


def summarise(name: str, runs: list[list[dict]]) -> dict:
    """Agreement, flips and GPU-hours per seed, and wrong-way verdicts against the seeds' mean speedup."""
    truth: dict = {}
    for rows in runs:
        for r in rows:
            truth.setdefault(r["key"], []).append(r["speedup"])
    truth = {k: float(np.mean([v for v in vs if v is not None])) for k, vs in truth.items()}
    out = []
    for every in runs:
        rows = [r for r in every if r["verdict"] != "dominated"]  # no verdict of its own: counted apart
        same = sum(r["exhaustive"] == r["verdict"] for r in rows)
        flips = [r for r in rows if {r["exhaustive"], r["verdict"]} == {verdict.FASTER, verdict.SLOWER}]
        clear = [r for r in rows if abs(truth[r["key"]] - 1) > 0.05]
        wrong = [
            r
            for r in clear
            if r["verdict"] in (verdict.FASTER, verdict.SLOWER)
            and (r["verdict"] == verdict.FASTER) != (truth[r["key"]] > 1)
        ]
        exhaustive, verdict_hours = gpu_hours(every, "exhaustive_s"), gpu_hours(every, "verdict_s")
        ar_seconds = sum({r["ar_key"]: r["ar_s"] for r in every}.values())
        cells_exh = sum(r["exhaustive_s"] for r in every) + ar_seconds
        cells_ver = sum(r["verdict_s"] for r in every) + ar_seconds
        out.append(
            {
                "cells": len(rows),
                "agreement": same / len(rows),
                "disagreements": [
                    f"{'/'.join(map(str, r['key']))}: {r['exhaustive']} -> {r['verdict']}"
                    for r in rows
                    if r["exhaustive"] != r["verdict"]
                ],
                "flips": len(flips),
                "clear_cells": len(clear),
                "wrong_way": len(wrong),
                "hours_exhaustive": exhaustive,
                "hours_verdict": verdict_hours,
                "share": verdict_hours / exhaustive,
                "cell_share": cells_ver / cells_exh,
                "speculative_share": sum(r["verdict_s"] for r in every) / sum(r["exhaustive_s"] for r in every),
                "stopped_early": sum(r["sessions_verdict"] < r["sessions"] for r in rows) / len(rows),
                "implied": sum(r["verdict_s"] == 0 and r["verdict"] == verdict.SLOWER for r in rows),
                "dominated": len(every) - len(rows),
            }
        )
    return {"name": name, "seeds": out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--full", action="store_true", help="all of plan-full (an hour of CPU)")
    args = parser.parse_args()
    failed = False
    print(
        "| configuration | seed | cells | agreement | faster<->slower flips "
        "| wrong-way verdicts (true speedup >5% from 1) "
        "| GPU-h exhaustive | GPU-h verdict | share | share of cell time | share of speculative cells' time "
        "| cells stopped early | implied slower | dominated |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, subset in (("config.yaml", None), ("plan-full.yaml", None if args.full else SUBSET)):
        config = load(name, subset)
        began = time.process_time()
        runs = [replay(config, args.first_seed + i) for i in range(args.seeds)]
        table = summarise(name, runs)
        for i, row in enumerate(table["seeds"]):
            failed |= row["agreement"] < 0.95 or row["flips"] > 0 or row["share"] > 0.6
            print(
                f"| {name}{'' if subset is None else ' (subset)'} | {args.first_seed + i} | {row['cells']} | "
                f"{row['agreement']:.1%} | {row['flips']} | {row['wrong_way']} of {row['clear_cells']} | "
                f"{row['hours_exhaustive']:.3f} | {row['hours_verdict']:.3f} | {row['share']:.0%} | "
                f"{row['cell_share']:.0%} | {row['speculative_share']:.0%} | {row['stopped_early']:.0%} | "
                f"{row['implied']} | {row['dominated']} |",
                flush=True,
            )
        for i, row in enumerate(table["seeds"]):
            for line in row["disagreements"]:
                print(f"  {name} seed {args.first_seed + i}: {line}", file=sys.stderr)
        print(f"  ({name}: {time.process_time() - began:.0f} s of CPU)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
