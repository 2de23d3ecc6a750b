"""The simulator's DDTree round against the real DDTree cells of the ddtree-v2 build, and its fit to them.

    .venv/bin/python benchmarks/ddtree_check.py [RECORD...] [--config config/gpu-ddtree.yaml] [--fit | --changes]

The records (default: benchmarks/gpu/ddtree-2026-12-03 and ddtree-engines-2026-12-03): the ddtree-v2 build (tree build
rancy-wang-ddtree-v2) on one H200, dummy weights, so a round accepts one token (the target's own) and a request's
stream gets one chunk a round. Their DDTree cells: budgets 15 and 16 without the build's stage profiler (the
``plain`` methods) and budgets 15, 16, 22, 32 and 64 with it (cells with ``stages``). For each cell:

- measured round = the median gap between a request's consecutive stream chunks after its second chunk (the first
  gap holds the prefill), inside the cell's steady window, over all its requests (step_costs.cell_step: the measure
  the profile sglang-0.5.16-h200 was fitted to). Not TPOT p50: a request's TPOT, (end - first token) / (tokens - 1),
  is the mean of its gaps, and averages in the wait between its first token and its second (the scheduler runs the
  other waiting prefills before the next round), which the simulator charges as prefill steps of their own; the
  median gap is a decode round. TPOT p50 is printed beside it.
- target = the round an unprofiled server runs at this shape. A plain cell's is its measured round. A profiled
  cell's is its stages' sum (the GPU time the profiler's CUDA events bracket) x the stage share of its workload and
  concurrency: the mean, over the budgets measured both ways (15, 16), of plain round / profiled stages' sum
  (``stage_share``). The profiler synchronises the host with the GPU every round, so a profiled round adds host
  work the overlap scheduler otherwise hides (its rest: round - stages' sum, the profiler's overhead, printed); the
  stages keep timing the GPU's work, and the plain round is that work: the share is 0.92-1.03 at concurrency 1 to 16.
  At concurrency 64 it is 1.14 (short) and 1.43 (long): there the stage records average the rounds of the whole
  cell, ramp and tail included (mean batch 60.7 and 43.1), not rounds of 64.
- simulated round = CostModel.decode_step(decoding, [context] x concurrency), the cost model built from the
  configuration's ``sim:`` section (gpu, model_profile, runtime: CostModel.named, as the plan builds it), the
  decoding the cell's method's (Method.decoding: budget, block size, tree build, the overlap scheduler as its flags
  leave it), context = the cell's mean prompt tokens + mean output tokens / 2 (step_costs.cell_step), no prompt
  tokens counted as shared; "before" is the same without the build's own costs (CostModel.build_costs off: the
  runtime profile's alone). Its split: ddtree_profile.simulated_split (draft, tree build, verify with the tree-mask
  read, follow, other; the parts sum to the step).
- error = simulated / target - 1.
- measured split = the build's stage profiler (the cell's ``stages.seconds_per_round``: draft = draft_forward +
  draft_head_topk, tree build = tree_gpu_build + mask_compile, verify = target_verify, follow = accept_follow).

``--fit`` fits the build's own round costs (its entry's ``costs`` in specsweep/data/ddtree_builds.yaml) to these
cells and prints them (``fit``); ``--changes`` prints DDTree's predicted round at concurrency 16 and 64 before and
after them (``changes``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE / "gpu"))

import step_costs  # noqa: E402

from specsweep.config import read_config_file  # noqa: E402
from specsweep.ddtree_profile import simulated_split  # noqa: E402
from specsweep.modelling.cost import CostModel  # noqa: E402
from specsweep.modelling.decoding import Decoding  # noqa: E402
from specsweep.modelling.method import Method  # noqa: E402

RECORDS = (HERE / "gpu" / "ddtree-2026-12-03", HERE / "gpu" / "ddtree-engines-2026-12-03")
CONFIG = REPO / "config" / "gpu-ddtree.yaml"
BUILD = "rancy-wang-ddtree-v2"
WORKLOADS = ("short", "long")
PARTS = ("draft", "tree_build", "verify", "follow")
TOPK = ("tree_topk_fixed", "tree_topk_per_request")
ROUND = ("tree_round_fixed", "tree_round_per_request", "tree_verify_per_node")


def cost_model(config: Path, tp: int = 1) -> CostModel:
    """The configuration's cost model: CostModel.named(sim.gpu, sim.model_profile, sim.runtime, tp, sim.profiles)."""
    sim = read_config_file(config)["sim"]
    return CostModel.named(sim["gpu"], sim["model_profile"], sim["runtime"], tp, sim.get("profiles"))


def cells(records: list[Path]) -> list[dict]:
    """The records' DDTree cells (cells/**/*.json), by workload (short, long), concurrency, profiled or not, budget."""
    found = [json.loads(p.read_text()) for record in records for p in sorted((record / "cells").rglob("*.json"))]

    def order(cell: dict) -> tuple:
        where = cell["cell"]
        profiled = cell.get("stages") is not None
        return WORKLOADS.index(where["workload"]), where["concurrency"], profiled, cell["method"]["params"]["budget"]

    return sorted((c for c in found if c["method"]["algorithm"] == "ddtree"), key=order)


def _shape(cell: dict) -> tuple[str, int]:
    return cell["cell"]["workload"], cell["cell"]["concurrency"]


def stage_share(found: list[dict]) -> dict[tuple[str, int], float]:
    """By (workload, concurrency): the mean over the budgets measured both with and without the profiler of
    plain round / profiled stages' sum (the unprofiled round over the GPU time the profiler's stages bracket)."""
    rounds: dict[tuple, dict[str, float]] = {}
    for cell in found:
        key = (*_shape(cell), cell["method"]["params"]["budget"])
        stages = cell.get("stages")
        figure = sum(stages["seconds_per_round"].values()) if stages else step_costs.cell_step(cell)["seconds"]
        rounds.setdefault(key, {})["profiled" if stages else "plain"] = figure
    shares: dict[tuple[str, int], list[float]] = {}
    for (workload, concurrency, _), both in rounds.items():
        if len(both) == 2:
            shares.setdefault((workload, concurrency), []).append(both["plain"] / both["profiled"])
    return {key: float(np.mean(values)) for key, values in shares.items()}


def compare(cost: CostModel, cell: dict, shares: dict[tuple[str, int], float]) -> dict:
    """One cell's measured round, target and split beside the simulator's, after and before the build's own costs
    (seconds; see the module's docstring)."""
    shape = step_costs.cell_step(cell)
    decoding = Method.from_dict(cell["method"]).decoding
    contexts = [shape["context"]] * shape["batch"]
    stages = cell.get("stages")
    row = {
        "workload": cell["cell"]["workload"],
        "concurrency": shape["batch"],
        "budget": decoding.budget,
        "profiled": stages is not None,
        "context": shape["context"],
        "measured": shape["seconds"],
        "tpot_p50": cell["metrics"]["tpot"]["p50"],
        "target": shape["seconds"],
        "simulated": cost.decode_step(decoding, contexts),
        "before": replace(cost, build_costs=False).decode_step(decoding, contexts),
        "simulated_split": simulated_split(cost, decoding, contexts),
        "decoding": decoding,
        "contexts": contexts,
    }
    if stages is not None:
        row["stages"] = sum(stages["seconds_per_round"].values())
        row["target"] = row["stages"] * shares[_shape(cell)]
        row["rest"] = shape["seconds"] - row["stages"]  # the profiler's overhead: what no stage times
        row["measured_split"] = {p: stages["seconds_per_round"][p] for p in PARTS}
        row["topk"] = stages["stages"].get("draft_head_topk", 0.0)
        row["profiled_batch"] = stages["meta"]["batch_size"]
    return row


def fit(cost: CostModel, found: list[dict]) -> dict[str, float]:
    """The build's own round costs fitted to its cells, in two steps, each a linear least squares:

    1. the top-k (tree_topk_fixed, tree_topk_per_request): the profiled cells' draft_head_topk seconds a round
       against 1 and the profiled rounds' mean batch (the stage the profiler times on its own);
    2. the round (tree_round_fixed, tree_round_per_request, tree_verify_per_node), the top-k held: every cell's
       target (module docstring) less the simulated round without these three, against 1, batch and batch x
       verify width (budget + 1 nodes a request), each row weighted by 1 / target (a relative error).

    The tree's construction (tree_build_per_node) stays the runtime's: the profiler's tree_gpu_build is 0.01-0.05 ms
    a round at every budget and batch, and its mask_compile does not grow with the budget.

    Values rounded to 3 significant figures."""
    profiled = [c for c in found if c.get("stages")]
    x = np.array([[1.0, c["stages"]["meta"]["batch_size"]] for c in profiled])
    y = np.array([c["stages"]["stages"]["draft_head_topk"] for c in profiled])
    topk = np.linalg.lstsq(x, y, rcond=None)[0]
    held = {**dict(zip(TOPK, topk)), **dict.fromkeys(ROUND, 0.0)}
    bare = replace(cost, runtime={**cost.runtime, **held}, build_costs=False)
    shares = stage_share(found)
    rows = [compare(bare, c, shares) for c in found]
    x = np.array([[1.0, r["concurrency"], r["concurrency"] * r["decoding"].verify_width()] for r in rows])
    y = np.array([r["target"] - r["simulated"] for r in rows])
    w = 1 / np.array([r["target"] for r in rows])
    terms = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)[0]
    return {k: float(f"{v:.3g}") for k, v in {**dict(zip(TOPK, topk)), **dict(zip(ROUND, terms))}.items()}


def table(rows: list[dict]) -> list[str]:
    """The Markdown table: times in milliseconds a round; errors against the target before and after the build's
    own costs; each split part as measured / simulated (profiled cells)."""
    lines = [
        "| workload | c | budget | profiled | measured round | TPOT p50 | target | before | after | draft | tree build "
        "| verify | follow | profiler's rest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["simulated_split"]
        if r["profiled"]:
            m = r["measured_split"]
            parts = " | ".join(f"{1e3 * m[p]:.2f} / {1e3 * s[p]:.2f}" for p in PARTS) + f" | {1e3 * r['rest']:.2f}"
        else:
            parts = " | ".join(f"- / {1e3 * s[p]:.2f}" for p in PARTS) + " | -"
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['budget']} | {'yes' if r['profiled'] else 'no'} | "
            f"{1e3 * r['measured']:.2f} | {1e3 * r['tpot_p50']:.2f} | {1e3 * r['target']:.2f} | "
            f"{r['before'] / r['target'] - 1:+.1%} | "
            f"{1e3 * r['simulated']:.2f} ({r['simulated'] / r['target'] - 1:+.1%}) | {parts} |"
        )
    return lines


def within(rows: list[dict], simulated: str = "simulated") -> str:
    """How many rows the ``simulated`` figure is within 10% of the target (|simulated / target - 1| <= 0.1) and the
    range of simulated / target - 1."""
    errors = [r[simulated] / r["target"] - 1 for r in rows]
    return f"{sum(abs(e) <= 0.10 for e in errors)} of {len(rows)} within 10%, {min(errors):+.1%} to {max(errors):+.1%}"


def notes(rows: list[dict], shares: dict[tuple[str, int], float]) -> list[str]:
    """The count within 10%, before and after, of the plain and the profiled cells; the stage shares."""
    lines = []
    for label, chosen in (
        ("plain", [r for r in rows if not r["profiled"]]),
        ("profiled", [r for r in rows if r["profiled"]]),
    ):
        lines.append(f"\n{label} cells: before {within(chosen, 'before')}; after {within(chosen)}")
    lines.append(
        "stage share (plain round / profiled stages' sum, budgets 15 and 16): "
        + ", ".join(
            f"{w}/c{c} {v:.3f}"
            for (w, c), v in sorted(shares.items(), key=lambda i: (WORKLOADS.index(i[0][0]), i[0][1]))
        )
    )
    return lines


CHANGE_BUDGETS = (15, 32, 64)
CHANGE_CONTEXTS = (1024, 8192)
CHANGE_CONCURRENCY = (16, 64)


def changes(cost: CostModel) -> list[str]:
    """DDTree's predicted round (this build, block 16, overlap on) at concurrency 16 and 64, budgets 15, 32 and 64,
    contexts of 1,024 and 8,192 tokens a request, before and after the build's own costs (a Markdown table, ms)."""
    lines = ["| c | context | budget | before | after | change |", "|---|---|---|---|---|---|"]
    for concurrency in CHANGE_CONCURRENCY:
        for context in CHANGE_CONTEXTS:
            for budget in CHANGE_BUDGETS:
                decoding = Decoding("ddtree", budget=budget, tree_build=BUILD)
                contexts = [context] * concurrency
                before = replace(cost, build_costs=False).decode_step(decoding, contexts)
                after = cost.decode_step(decoding, contexts)
                lines.append(
                    f"| {concurrency} | {context} | {budget} | {1e3 * before:.2f} | {1e3 * after:.2f} | "
                    f"{after / before - 1:+.1%} |"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="*", type=Path, default=list(RECORDS))
    parser.add_argument("--config", type=Path, default=CONFIG, help="whose sim: section prices the rounds")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--fit", action="store_true", help="print the build's own round costs fitted to the cells")
    what.add_argument("--changes", action="store_true", help="print the predicted rounds at c16 and c64, before/after")
    args = parser.parse_args()
    cost = cost_model(args.config)
    found = cells(args.records)
    if args.fit:
        print("\n".join(f"{k}: {v:.3g}" for k, v in fit(cost, found).items()))
    elif args.changes:
        print("\n".join(changes(cost)))
    else:
        shares = stage_share(found)
        rows = [compare(cost, cell, shares) for cell in found]
        print("\n".join(table(rows) + notes(rows, shares)))


if __name__ == "__main__":
    main()
