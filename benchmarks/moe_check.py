"""The simulator's MoE steps against SGLang's on an H200, and DFlash/AR on MoE against published figures.

    .venv/bin/python benchmarks/moe_check.py [--fit]

1. The record benchmarks/gpu/moe-2026-12-02 (SGLang 0.5.16, one H200, dummy weights of Qwen3-30B-A3B's shape:
   AR steps at 1-64 requests, DFlash rounds of 16 tokens, NGRAM chains of 16; benchmarks/gpu/step_costs.py) against
   the runtime profile sglang-0.5.16-h200. Dummy weights route as real ones do not: AR's requests are independent
   random prompts (uniform routing across requests, as the simulator has it), but a random drafter's 16 drafts and a
   random model's looping output route a request's tokens to fewer experts than real text does. So a speculative
   round of one or four requests is shown with the two bounds of its routing: all of a request's tokens on one
   token's k experts (least) and uniform routing (most). At 16 and 64 requests the step is bound by the routed
   experts' arithmetic, not by reading them, so both bounds give one figure and the measurement checks it.
   With --fit: the two MoE parameters of sglang-0.5.16-h200 (moe_layer_overhead, moe_compute_efficiency) fitted
   again on a grid, least squares of log(simulated / measured) over AR's steps and the rounds of 16 and 64 requests.
2. DFlash/AR at batch 1 (context 1,000) for accept lengths 2, 4.5 and 6.5 with the shipped profiles, against the
   published SGLang figures (PUBLISHED; benchmarks/README.md names them).
"""

import sys
from pathlib import Path

from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
import step_costs  # noqa: E402

RECORD = HERE / "gpu" / "moe-2026-12-02"


def record_rows() -> list[dict]:
    """The record's measured shapes: AR steps and DFlash rounds (dflash.jsonl), NGRAM rounds (trees/)."""
    return step_costs.measured_steps(RECORD)


def routing_bounds(cost: CostModel, row: dict) -> tuple[float, float]:
    """The simulated seconds of a round with a request's tokens all on one token's experts, and with uniform
    routing (expert_repeat_factor E / k and 1)."""
    m = cost.model
    least = CostModel(cost.gpu, {**m, "expert_repeat_factor": m["experts"] / m["experts_per_token"]}, cost.runtime)
    most = CostModel(cost.gpu, {**m, "expert_repeat_factor": 1.0}, cost.runtime)
    return step_costs.simulated(least, row), step_costs.simulated(most, row)


def record_table() -> None:
    cost = CostModel.named("H200", "qwen3-30b-a3b", "sglang-0.5.16-h200")
    print("| kind | requests | tokens a request | measured | simulated | simulated / measured |")
    print("|---|---|---|---|---|---|")
    for row in record_rows():
        measured, simulated = row["seconds"] * 1e3, step_costs.simulated(cost, row) * 1e3
        cell = f"{simulated:.2f} ms"
        if row["kind"] != "ar-server" and row["batch"] < 16:
            least, most = routing_bounds(cost, row)
            cell += f" (routing bounds {least * 1e3:.2f}-{most * 1e3:.2f})"
        ratio = simulated / measured
        print(f"| {row['kind']} | {row['batch']} | {row['width']} | {measured:.2f} ms | {cell} | {ratio:.2f} |")


# published DFlash/AR in SGLang on MoE models at concurrency 1: (GPU, accept length, DFlash/AR, source)
PUBLISHED = [
    ("A800", 2.0, 0.64, "Qwen3-30B-A3B, sgl-project/sglang issue 29244"),
    # its accept length is not published with it: 6.5 is DFlash's on math (Qwen3-8B in SGLang, 6.3-6.5)
    ("B200", 6.5, 2.9, "Qwen3.6-35B-A3B, Math500 (another design: 256 experts, a shared one, hybrid attention)"),
]


def steps_at_batch_1(cost: CostModel) -> tuple[float, float]:
    """An AR step and a DFlash round (block 16) of one request at context 1,000, in seconds."""
    return cost.decode_step(Decoding("ar"), [1000]), cost.decode_step(Decoding("dflash", 16), [1000])


def dflash_over_ar(cost: CostModel, tau: float) -> float:
    """DFlash's throughput over AR's at batch 1 for accept length ``tau``: tau x AR step / DFlash round."""
    ar, dflash = steps_at_batch_1(cost)
    return tau * ar / dflash


def ratio_table() -> None:
    print("\n| GPU | runtime | AR step | DFlash round | tau 2 | tau 4.5 | tau 6.5 |")
    print("|---|---|---|---|---|---|---|")
    for gpu, runtime in (("A800", "sglang"), ("H200", "sglang"), ("B200", "sglang"), ("H200", "sglang-0.5.16-h200")):
        cost = CostModel.named(gpu, "qwen3-30b-a3b", runtime)
        a, d = steps_at_batch_1(cost)
        taus = " | ".join(f"{dflash_over_ar(cost, tau):.2f}" for tau in (2.0, 4.5, 6.5))
        print(f"| {gpu} | {runtime} | {a * 1e3:.2f} ms | {d * 1e3:.2f} ms | {taus} |")
    print("\npublished:")
    for gpu, tau, ratio, source in PUBLISHED:
        print(f"- {gpu}, accept length {tau}: DFlash/AR {ratio} ({source})")


def fit(runtime: str = "sglang-0.5.16-h200") -> None:
    """The grid fit of the record's two MoE parameters for a runtime profile (step_costs.fit_moe, which the generic
    runtime's derivation runs too)."""
    base = CostModel.named("H200", "qwen3-30b-a3b", runtime)
    overhead, share = step_costs.fit_moe(base.runtime, record_rows())
    print(f"\nfit ({runtime}): moe_layer_overhead {overhead:.1e}, moe_compute_efficiency {share:.2f}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the H200 profile's two MoE parameters again")
    args = parser.parse_args()
    record_table()
    ratio_table()
    if args.fit:
        fit()
