"""Predicted against published speedups for the simulated backend (batch 1, temperature 0).

    .venv/bin/python benchmarks/calibrate_sim.py

Runs specsweep.sim.calibration on the published Qwen3-8B rows of the DDTree
paper (HF transformers on H200: runtime profile hf-eager) and prints predicted
and published DFlash/AR, DDTree/AR and DDTree/DFlash, with the acceptance-model
parameters in use (config: sim.acceptance; fitted defaults in
specsweep/sim/model.py ACCEPTANCE).
"""

import json

from specsweep.sim.calibration import PUBLISHED_QWEN3_8B, calibration_prompts, predict
from specsweep.sim.model import ACCEPTANCE


def main() -> None:
    print("acceptance parameters:", json.dumps(ACCEPTANCE))
    print("| row | DFlash/AR pred | pub | err | DDTree/AR pred (budget) | pub | err | DDTree/DFlash pred | pub | err | tau chain | tau tree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row, prompts in calibration_prompts().items():
        p, pub = predict(prompts), PUBLISHED_QWEN3_8B[row]
        ratio_pub = pub["ddtree"] / pub["dflash"]
        print(f"| {row} | {p['dflash']:.2f} | {pub['dflash']:.2f} | {p['dflash'] / pub['dflash'] - 1:+.0%} "
              f"| {p['ddtree']:.2f} ({p['ddtree_budget']}) | {pub['ddtree']:.2f} | {p['ddtree'] / pub['ddtree'] - 1:+.0%} "
              f"| {p['ddtree_over_dflash']:.3f} | {ratio_pub:.3f} | {p['ddtree_over_dflash'] / ratio_pub - 1:+.0%} "
              f"| {p['tau_dflash']:.2f} | {p['tau_ddtree']:.2f} |")
    print("AIME24/25 rows: no AIME problems are shipped in a package here; not predicted.")


if __name__ == "__main__":
    main()
