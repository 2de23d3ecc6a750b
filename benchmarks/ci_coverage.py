"""Coverage of specsweep's 95% intervals, checked by repeated independent prompt draws.

Each draw builds the short workload with another seed (independent prompts),
measures one cell per method at a concurrency on the simulated engine, and
computes every estimate with its interval exactly as a cell does. The truth is
the mean of the draws' estimates; an interval covers when it contains it.
Targets: coverage between 90% and 99%, and mean half-width within 1.5x of 1.96
times the standard deviation of the draws.

The cells run on the simulated engine in virtual time (specsweep.sim.replay:
the engine's own steps without sleeping, the records the client would write
on an idle host), so that hundreds of cells take minutes. Numbers are simulated.

Engine comparisons (configuration ``engines``): each draw also runs DFlash on
two engines, a reference and one whose runtime reads the weights at
SLOWER_BANDWIDTH of the reference's bandwidth, and on a twin of the reference
(its own drafts' seed, the same profile: the true ratio is 1); the ratios of
output throughput (metrics.speedup) and TPOT median (metrics.median_ratio),
paired by session, with their intervals. For the twin, ``flagged`` is the share
of draws whose interval excludes 1 (at most about 5% for a 95% interval).

    .venv/bin/python benchmarks/ci_coverage.py [--draws 60] [--concurrency 1 16]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from specsweep import metrics
from specsweep.modelling.profiles import profiles
from specsweep.sim.replay import closed_loop, engine
from specsweep.workloads import build

METHODS = ("ar", "dflash")
GENERIC = profiles()["runtimes"]["sglang"]
SLOWER_BANDWIDTH = 0.9  # the slower engine's weights read at this share of the reference's bandwidth
SLOWER = {**GENERIC, "bandwidth_efficiency": SLOWER_BANDWIDTH * GENERIC["bandwidth_efficiency"]}


def workload(seed: int, requests: int, max_new_tokens: int) -> list:
    return build(
        {"name": "short", "family": "short", "requests": requests, "max_new_tokens": max_new_tokens}, seed=seed
    )


def engine_ratios(reference: tuple, other, sessions: list, concurrency: int, seed: int) -> dict:
    """DFlash on ``other`` against the reference cell ``(records, window)``, paired by session: the output
    throughput ratio (metrics.speedup) and the TPOT p50 ratio (metrics.median_ratio), each (value, interval)."""
    records = closed_loop(other, sessions, concurrency)
    window = metrics.cell_metrics(records, 1, concurrency, seed=seed)["concurrency"]["window"]
    ratio = metrics.speedup(records, reference[0], window, reference[1], seed=seed)
    sides = [[(metrics.tpot(r), r["session"], r.get("kind")) for r in rs] for rs in (reference[0], records)]
    tpot = metrics.median_ratio(*sides, seed=seed)
    return {
        "throughput ratio": (ratio["speedup"], ratio["speedup_ci"]),
        "TPOT p50 ratio": (tpot["ratio"], tpot["ratio_ci"]),
    }


def draw(seed: int, concurrency: int, requests: int, max_new_tokens: int) -> dict:
    """One independent draw: {estimate name: (value, interval)} for both methods and the speedup."""
    sessions = workload(seed, requests, max_new_tokens)
    out, cells = {}, {}
    for method in METHODS:
        records = closed_loop(engine(method), sessions, concurrency)
        cell = metrics.cell_metrics(records, 1, concurrency, seed=seed)
        cells[method] = (records, cell["concurrency"]["window"])
        out[f"{method} output throughput"] = (cell["output_throughput"], cell["output_throughput_ci"])
        out[f"{method} TPOT p50"] = (cell["tpot"]["p50"], cell["tpot"]["p50_ci"])
    s = metrics.speedup(cells["dflash"][0], cells["ar"][0], cells["dflash"][1], cells["ar"][1], seed=seed)
    out["dflash speedup"] = (s["speedup"], s["speedup_ci"])
    for name, other in (("slower", engine("dflash", runtime=SLOWER)), ("twin", engine("dflash", random_seed=seed))):
        for estimate, value in engine_ratios(cells["dflash"], other, sessions, concurrency, seed).items():
            out[f"{name} engine {estimate}"] = value
    return out


def twin_draw(seed: int, concurrency: int, requests: int, max_new_tokens: int) -> dict:
    """One independent draw of the twin engine's ratios alone (as in ``draw``): for more draws where a rate near 5%
    is checked."""
    sessions = workload(seed, requests, max_new_tokens)
    records = closed_loop(engine("dflash"), sessions, concurrency)
    reference = (records, metrics.cell_metrics(records, 1, concurrency, seed=seed)["concurrency"]["window"])
    ratios = engine_ratios(reference, engine("dflash", random_seed=seed), sessions, concurrency, seed)
    return {f"twin engine {estimate}": value for estimate, value in ratios.items()}


def coverage(draws: list[dict]) -> dict:
    """Per estimate: coverage of the mean of the draws, mean half-width / (1.96 x sd of the draws), relative sd."""
    table = {}
    for name in draws[0]:
        values = np.array([d[name][0] for d in draws], dtype=float)
        intervals = [d[name][1] for d in draws]
        truth, sd = values.mean(), values.std(ddof=1)
        claimed = [ci for ci in intervals if ci is not None]
        if name.startswith("twin "):  # the same profile: the truth is 1, not the draws' mean
            truth = 1.0
        table[name] = {
            "coverage": sum(ci[0] <= truth <= ci[1] for ci in claimed) / len(intervals),
            "width_ratio": float(np.mean([(ci[1] - ci[0]) / 2 for ci in claimed]) / (1.96 * sd))
            if claimed and sd > 0
            else None,
            "relative_sd": float(sd / truth),
            "intervals": len(claimed),
            "draws": len(intervals),
            "flagged": sum(not ci[0] <= 1.0 <= ci[1] for ci in claimed) / len(intervals),
        }
    return table


def check(draws: int, concurrency: int, first_seed: int = 1000, max_new_tokens: int = 256) -> dict:
    requests = max(32, 4 * concurrency)  # the default sizing of a cell (load.min_requests, load.waves)
    return coverage([draw(first_seed + i, concurrency, requests, max_new_tokens) for i in range(draws)])


def twin_check(draws: int, concurrency: int, first_seed: int, max_new_tokens: int = 256) -> dict:
    """``check`` for the twin engine's ratios alone."""
    requests = max(32, 4 * concurrency)
    return coverage([twin_draw(first_seed + i, concurrency, requests, max_new_tokens) for i in range(draws)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=60)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    failed = False
    print("| concurrency | estimate | coverage | half-width / (1.96 sd) | sd / mean | excludes 1 | draws |")
    print("|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        for name, row in check(args.draws, c).items():
            ok = (
                0.90 <= row["coverage"] <= 0.99
                and row["width_ratio"] is not None
                and 1 / 1.5 <= row["width_ratio"] <= 1.5
            )
            failed |= not ok
            excludes = f"{row['flagged']:.1%}" if "engine" in name else "--"  # a ratio's share of draws excluding 1
            print(
                f"| {c} | {name} | {row['coverage']:.1%} | {row['width_ratio']:.2f} | {row['relative_sd']:.2%} | "
                f"{excludes} | {row['draws']} |" + ("" if ok else " **off target**"),
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
