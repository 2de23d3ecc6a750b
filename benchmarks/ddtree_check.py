"""The simulator's DDTree round against the first real DDTree cells (benchmarks/gpu/ddtree-2026-12-03).

    .venv/bin/python benchmarks/ddtree_check.py [RECORD] [--config config/gpu-ddtree.yaml]

The record's 16 cells: budgets 15 and 16 of the ddtree-v2 build (tree build rancy-wang-ddtree-v2), dummy weights, so
a round accepts one token (the target's own) and a request's stream gets one chunk a round. For each cell:

- measured round = the median gap between a request's consecutive stream chunks after its second chunk (the first
  gap holds the prefill), inside the cell's steady window, over all its requests (step_costs.cell_step: the measure
  the profile sglang-0.5.16-h200 was fitted to). Not TPOT p50: a request's TPOT, (end - first token) / (tokens - 1),
  is the mean of its gaps, and averages in the wait between its first token and its second (the scheduler runs the
  other waiting prefills before the next round), which the simulator charges as prefill steps of their own; the
  median gap is a decode round. TPOT p50 is printed beside it.
- simulated round = CostModel.decode_step(decoding, [context] x concurrency), the cost model built from the
  configuration's ``sim:`` section (gpu, model_profile, runtime: CostModel.named, as the plan builds it), the
  decoding the cell's method's (Method.decoding: budget, block size, tree build, the overlap scheduler as its flags
  leave it), context = the cell's mean prompt tokens + mean output tokens / 2 (step_costs.cell_step), no prompt
  tokens counted as shared. Its split: ddtree_profile.simulated_split (draft, tree build, verify with the tree-mask
  read, follow, other; the parts sum to the step).
- error = simulated / measured - 1.
- measured split = the build's stage profiler (the cell's ``stages.seconds_per_round``: draft = draft_forward +
  draft_head_topk, tree build = tree_gpu_build + mask_compile, verify = target_verify, follow = accept_follow);
  rest = measured round - the profiled stages' sum (the scheduler's and the profiler's own work, which no stage
  times), beside the simulated "other".

After the table: the simulated round with the cells' shared prompt tokens (step_costs.shared_prompt_tokens, which
the fit charges: decode_step's ``shared``) where it moves the figure by 1% or more, and the profiled rounds' mean
batch where it is not the concurrency (its split then averages rounds of other batches: a record holds ten
rounds, whatever the batch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE / "gpu"))

import step_costs  # noqa: E402

from specsweep.config import read_config_file  # noqa: E402
from specsweep.ddtree_profile import simulated_split  # noqa: E402
from specsweep.modelling.cost import CostModel  # noqa: E402
from specsweep.modelling.method import Method  # noqa: E402

RECORD = HERE / "gpu" / "ddtree-2026-12-03"
CONFIG = REPO / "config" / "gpu-ddtree.yaml"
WORKLOADS = ("short", "long")
PARTS = ("draft", "tree_build", "verify", "follow")


def cost_model(config: Path, tp: int = 1) -> CostModel:
    """The configuration's cost model: CostModel.named(sim.gpu, sim.model_profile, sim.runtime, tp, sim.profiles)."""
    sim = read_config_file(config)["sim"]
    return CostModel.named(sim["gpu"], sim["model_profile"], sim["runtime"], tp, sim.get("profiles"))


def cells(record: Path) -> list[dict]:
    """The record's cells (cells/**/*.json), by workload (short, long), concurrency and budget."""
    found = [json.loads(p.read_text()) for p in sorted((record / "cells").rglob("*.json"))]

    def order(cell: dict) -> tuple:
        where = cell["cell"]
        return WORKLOADS.index(where["workload"]), where["concurrency"], cell["method"]["params"]["budget"]

    return sorted(found, key=order)


def compare(cost: CostModel, cell: dict) -> dict:
    """One cell's measured round and split beside the simulator's (seconds; see the module's docstring)."""
    shape = step_costs.cell_step(cell)
    decoding = Method.from_dict(cell["method"]).decoding
    contexts = [shape["context"]] * shape["batch"]
    simulated = simulated_split(cost, decoding, contexts)
    measured = {p: cell["stages"]["seconds_per_round"][p] for p in PARTS}
    measured["other"] = shape["seconds"] - sum(cell["stages"]["seconds_per_round"].values())
    return {
        "workload": cell["cell"]["workload"],
        "concurrency": shape["batch"],
        "budget": decoding.budget,
        "context": shape["context"],
        "measured": shape["seconds"],
        "stages": sum(cell["stages"]["seconds_per_round"].values()),
        "tpot_p50": cell["metrics"]["tpot"]["p50"],
        "simulated": cost.decode_step(decoding, contexts),
        "simulated_shared": cost.decode_step(decoding, contexts, shape["shared"]),
        "profiled_batch": cell["stages"]["meta"]["batch_size"],
        "measured_split": measured,
        "simulated_split": simulated,
    }


def table(rows: list[dict]) -> list[str]:
    """The Markdown table: times in milliseconds a round, each split part as measured / simulated."""
    lines = [
        "| workload | c | budget | measured round | TPOT p50 | simulated | error | draft | tree build | verify "
        "| follow | rest (other) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, s = r["measured_split"], r["simulated_split"]
        parts = " | ".join(f"{1e3 * m[p]:.2f} / {1e3 * s[p]:.2f}" for p in (*PARTS, "other"))
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['budget']} | {1e3 * r['measured']:.2f} | "
            f"{1e3 * r['tpot_p50']:.2f} | {1e3 * r['simulated']:.2f} | {r['simulated'] / r['measured'] - 1:+.1%} | "
            f"{parts} |"
        )
    return lines


def within(rows: list[dict], measured: str) -> str:
    """How many cells the simulated round is within 10% of (|simulated / measured - 1| <= 0.1) and the range of
    simulated / measured - 1, ``measured`` the row's key of the figure compared with."""
    errors = [r["simulated"] / r[measured] - 1 for r in rows]
    return f"{sum(abs(e) <= 0.10 for e in errors)} of {len(rows)} within 10%, {min(errors):+.1%} to {max(errors):+.1%}"


def notes(rows: list[dict]) -> list[str]:
    """The count within 10% (against the measured round, and against the profiled stages' sum alone: the round less
    what no stage times); the cells whose shared prompt tokens move the simulated round by 1% or more; the profiled
    rounds' mean batch where it is not the concurrency."""
    lines = [
        f"\nagainst the measured round: {within(rows, 'measured')}",
        f"against the profiled stages' sum: {within(rows, 'stages')}",
    ]
    for r in rows:
        where = f"{r['workload']}, c{r['concurrency']}, budget {r['budget']}"
        if abs(r["simulated_shared"] / r["simulated"] - 1) >= 0.01:
            lines.append(
                f"- {where}: with the cell's shared prompt tokens {1e3 * r['simulated_shared']:.2f} ms "
                f"({r['simulated_shared'] / r['measured'] - 1:+.1%})"
            )
        if abs(r["profiled_batch"] - r["concurrency"]) >= 1:
            lines.append(
                f"- {where}: the profiled rounds' mean batch {r['profiled_batch']:.1f} (their split averages rounds "
                "of other batches with the concurrency's)"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", nargs="?", type=Path, default=RECORD)
    parser.add_argument("--config", type=Path, default=CONFIG, help="whose sim: section prices the rounds")
    args = parser.parse_args()
    cost = cost_model(args.config)
    rows = [compare(cost, cell) for cell in cells(args.record)]
    print("\n".join(table(rows) + notes(rows)))


if __name__ == "__main__":
    main()
