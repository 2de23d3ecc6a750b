"""The simulator with the generic runtime against the real engine at forced acceptance, cell by cell.

    .venv/bin/python benchmarks/forced_check.py [--runtime sglang] [--json OUT]

For every cell of the records benchmarks/gpu/forced-2026-12-02 (Qwen3-8B's shape: AR, an EAGLE-3 chain of 4 and a
tree of 16 at acceptance forced to 2, 3 and 4, concurrency 1-64) and forced-moe-2026-12-02 (Qwen3-30B-A3B's shape:
AR and the chain at 2 and 3, concurrency 1-16), all SGLang 0.5.16 on one H200 with dummy weights: the same cell on the
simulated engine (specsweep.sim.replay: its own steps in virtual time, no HTTP), with the runtime profile named by
--runtime (default the generic ``sglang``, transferred: not the measured H200 profile, and fitted without these
records), the record's model profile, the same workload (the cell's sessions: the short mix, its seed and count,
128 tokens with ignore_eos, temperature 0), the same concurrency and acceptance forced as SGLANG_SIMULATE_ACC_LEN
forces it. Per cell: output throughput (specsweep.metrics.output_throughput over the steady window) simulated
against real (simulated / real - 1), and the verdict, faster or slower than AR at the same concurrency (the
simulated AR cell's throughput for the simulated speedup, the real cell's speedup for the real one). A cell
"counts" for the verdict where the real speedup is more than 10% from 1.

What the virtual-time replay leaves out: the host's delays beside the steps, and the server's request_latency
outside them (a few ms a request against 128 tokens of 2-25 ms steps). Prints a markdown table and a summary.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
from pathlib import Path

from specsweep import metrics
from specsweep.modelling.profiles import profiles
from specsweep.sim import replay
from specsweep.workloads import build

HERE = Path(__file__).resolve().parent
RECORDS = {"forced-2026-12-02": "qwen3-8b", "forced-moe-2026-12-02": "qwen3-30b-a3b"}
VERDICT_MARGIN = 0.10  # a verdict counts where the real speedup is more than this from 1


def real_cells(record: Path) -> list[dict]:
    """The record's cells as summary.csv lists them, each with its cell file's method and seed."""
    out = []
    with open(record / "summary.csv") as f:
        for row in csv.DictReader(f):
            cell = json.loads((record / "cells" / Path(row["cell_file"]).relative_to("results/cells")).read_text())
            out.append({**row, "cell": cell})
    return out


def simulate(row: dict, model_profile: str, runtime: dict) -> tuple[float | None, float]:
    """The simulated output throughput of a real cell (see the module's text) and its TPOT p50 (the median over
    requests of (last chunk - first chunk) / (output tokens - 1))."""
    cell = row["cell"]
    method = cell["method"]
    params = {k: v for k, v in method.get("params", {}).items() if k != "accept_length"}
    forced = method.get("params", {}).get("accept_length")
    concurrency = int(row["concurrency"])
    workload = {"name": "short", "family": "short", "requests": int(row["sessions"]), "max_new_tokens": 128}
    sessions = build(workload, cell["seed"])
    before = os.environ.pop("SGLANG_SIMULATE_ACC_LEN", None)
    if forced is not None:
        os.environ["SGLANG_SIMULATE_ACC_LEN"] = str(forced)
    try:
        sim = replay.engine(
            method["algorithm"], model_profile=model_profile, runtime=runtime, load_format="dummy", **params
        )
    finally:
        os.environ.pop("SGLANG_SIMULATE_ACC_LEN", None)
        if before is not None:
            os.environ["SGLANG_SIMULATE_ACC_LEN"] = before
    records = replay.closed_loop(sim, sessions, concurrency, {"ignore_eos": True})
    tpot = statistics.median((r["chunk_times"][-1] - r["chunk_times"][0]) / (r["output_tokens"] - 1) for r in records)
    return metrics.output_throughput(records, metrics.steady_window(records, concurrency)), tpot


def check(runtime_name: str) -> list[dict]:
    """One row per real cell: record, method, concurrency, real and simulated throughput and speedup."""
    runtime = profiles()["runtimes"][runtime_name]
    out = []
    for name, model in RECORDS.items():
        rows = real_cells(HERE / "gpu" / name)
        simulated = {(r["method"], r["concurrency"]): simulate(r, model, runtime) for r in rows}
        for r in rows:
            ar = simulated[("ar", r["concurrency"])][0]
            sim, tpot = simulated[(r["method"], r["concurrency"])]
            out.append(
                {
                    "record": name,
                    "method": r["method"],
                    "concurrency": int(r["concurrency"]),
                    "real": float(r["output_throughput"]),
                    "simulated": sim,
                    "real_speedup": float(r["speedup"]),
                    "simulated_speedup": sim / ar if sim and ar else None,
                    "real_tpot": float(r["tpot_p50"]),
                    "simulated_tpot": tpot,
                    "real_e2e": float(r["e2e_p50"]),
                }
            )
    return out


def verdict(speedup: float) -> str:
    return "faster" if speedup > 1 else "slower"


def table(rows: list[dict]) -> None:
    print(
        "| record | method | conc. | real tok/s | simulated | sim / real - 1 | TPOT p50 real / sim (ms) | "
        "real speedup | simulated | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    misses, verdicts, wrong = [], 0, []
    for r in rows:
        deviation = r["simulated"] / r["real"] - 1
        counts = r["method"] != "ar" and abs(r["real_speedup"] - 1) > VERDICT_MARGIN
        same = verdict(r["real_speedup"]) == verdict(r["simulated_speedup"])
        mark = "" if not counts else ("same" if same else "**differs**")
        verdicts += counts
        if counts and not same:
            wrong.append(r)
        if abs(deviation) > 0.15:
            misses.append(r)
        dev = f"{deviation:+.1%}" if abs(deviation) <= 0.15 else f"**{deviation:+.1%}**"
        speedup = "" if r["method"] == "ar" else f"{r['simulated_speedup']:.2f}"
        real_speedup = "" if r["method"] == "ar" else f"{r['real_speedup']:.2f}"
        print(
            f"| {r['record'].removesuffix('-2026-12-02')} | {r['method']} | {r['concurrency']} | {r['real']:.0f} | "
            f"{r['simulated']:.0f} | {dev} | {1e3 * r['real_tpot']:.2f} / {1e3 * r['simulated_tpot']:.2f} | "
            f"{real_speedup} | {speedup} | {mark} |"
        )
    print(
        f"\n{len(rows) - len(misses)} of {len(rows)} cells within 15% of the real throughput; the verdict (faster or "
        f"slower than AR) the same at {verdicts - len(wrong)} of the {verdicts} cells whose real speedup is more "
        f"than 10% from 1"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="sglang", help="the runtime profile (default: the generic one)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    rows = check(args.runtime)
    table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
