"""The generic runtime on other GPUs and models against published figures (benchmarks/README.md, "One runtime
model", (c): the rows and their bands, stated there before this was first run).

    .venv/bin/python benchmarks/published_check.py [--runtime sglang]

Each row prices a step with CostModel.decode_step (the GPU's and model's profiles, the published TP) and turns it
into the published quantity: a round's milliseconds, batch-1 throughput (accept length / round; AR 1 / step), or
DFlash over AR (accept length x AR step / DFlash round). Prints a markdown table with the band and hit or miss.
"""

from __future__ import annotations

import argparse

from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding

AR = Decoding("ar")
DFLASH = Decoding("dflash", 16)
EAGLE3_64 = Decoding("eagle3", num_steps=8, topk=8, num_draft_tokens=64)

# (row, GPU, TP, model profile, what, published, band, how to simulate: a function of a CostModel)
ROWS = [
    (1, "B200", 1, "qwen3-8b", "DFlash round, batch 1 (ms)", 5.5, 0.15, lambda c: 1e3 * c.decode_step(DFLASH, [1000])),
    (
        2,
        "B200",
        1,
        "qwen3-8b",
        "DFlash round, batch 32 (ms)",
        13.5,
        0.15,
        lambda c: 1e3 * c.decode_step(DFLASH, [1000] * 32),
    ),
    (3, "H100", 1, "llama-8b", "AR, batch 1 (tok/s; vLLM)", 133.0, 0.20, lambda c: 1 / c.decode_step(AR, [500])),
    (4, "H100", 8, "llama-70b", "AR, batch 1 (tok/s)", 88.6, 0.20, lambda c: 1 / c.decode_step(AR, [500])),
    (
        5,
        "H100",
        8,
        "llama-70b",
        "EAGLE-3 8/8/64 at 5.88, batch 1 (tok/s)",
        234.5,
        0.25,
        lambda c: 5.88 / c.decode_step(EAGLE3_64, [500]),
    ),
    (
        6,
        "A800",
        1,
        "qwen3-30b-a3b",
        "DFlash/AR at 2.0, batch 1",
        0.64,
        0.15,
        lambda c: 2.0 * c.decode_step(AR, [1000]) / c.decode_step(DFLASH, [1000]),
    ),
    (
        7,
        "B200",
        1,
        "qwen3-30b-a3b",
        "DFlash/AR at 6.5, batch 1",
        2.9,
        0.25,
        lambda c: 6.5 * c.decode_step(AR, [1000]) / c.decode_step(DFLASH, [1000]),
    ),
    (
        8,
        "H100",
        1,
        "qwen3-8b",
        "AR TPOT p50, 4 requests (ms)",
        7.14,
        0.15,
        lambda c: 1e3 * c.decode_step(AR, [500] * 4),
    ),
    (9, "H100", 1, "llama-8b", "AR, batch 1 (tok/s)", 158.34, 0.15, lambda c: 1 / c.decode_step(AR, [500])),
    (10, "A800", 1, "qwen3-8b", "AR, batch 1 (tok/s)", 88.0, 0.15, lambda c: 1 / c.decode_step(AR, [300])),
    (
        11,
        "A800",
        1,
        "qwen3-8b",
        "DFlash/AR at 2.8, batch 1",
        162 / 88,
        0.15,
        lambda c: 2.8 * c.decode_step(AR, [300]) / c.decode_step(DFLASH, [300]),
    ),
    (12, "RTX-PRO-6000", 2, "llama-8b", "AR, batch 1 (tok/s)", 90.2, 0.30, lambda c: 1 / c.decode_step(AR, [500])),
    (
        13,
        "RTX-PRO-6000",
        2,
        "llama-8b",
        "DFlash at 6.10, batch 1 (tok/s)",
        429.69,
        0.30,
        lambda c: 6.10 / c.decode_step(DFLASH, [492]),
    ),
]


# rows a profile value was taken from: no longer checks (hit is None)
SOURCES = {12: "the RTX PRO 6000's allreduce_latency (specsweep/data/sim_profiles.yaml) is taken from it"}


def check(runtime: str) -> list[tuple]:
    """(row, GPU, TP, model, what, published, simulated, band, hit) for every row; hit None for a row in SOURCES."""
    out = []
    for row, gpu, tp, model, what, published, band, simulate in ROWS:
        simulated = simulate(CostModel.named(gpu, model, runtime, tp))
        hit = None if row in SOURCES else abs(simulated / published - 1) <= band
        out.append((row, gpu, tp, model, what, published, simulated, band, hit))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="sglang")
    args = parser.parse_args()
    print("| # | GPU, TP | model profile | what | published | simulated | simulated / published - 1 | band | |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row, gpu, tp, model, what, published, simulated, band, hit in check(args.runtime):
        print(
            f"| {row} | {gpu}, {tp} | {model} | {what} | {published:g} | {simulated:.3g} | "
            f"{simulated / published - 1:+.1%} | ±{band:.0%} | "
            f"{'source, not a check' if hit is None else 'hit' if hit else '**miss**'} |"
        )


if __name__ == "__main__":
    main()
