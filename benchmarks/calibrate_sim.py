"""Predicted against published results for the simulated backend's acceptance (temperature 0).

    .venv/bin/python benchmarks/calibrate_sim.py                  # DFlash and DDTree against the DDTree paper
    .venv/bin/python benchmarks/calibrate_sim.py --draft-models   # EAGLE, EAGLE-3, standalone against engines
    .venv/bin/python benchmarks/calibrate_sim.py --draft-models --fit   # and fit their drafter profiles

DFlash and DDTree: specsweep.sim.calibration on the published Qwen3-8B rows of
the DDTree paper (HF transformers on H200: runtime profile hf-eager), predicted
and published DFlash/AR, DDTree/AR and DDTree/DFlash, with the acceptance-model
parameters in use (config: sim.acceptance; fitted defaults in
specsweep/sim/model.py ACCEPTANCE).

Draft models: every row of PUBLISHED_DRAFT_MODELS (chains and trees of SGLang
and vLLM at batch 1), predicted with the drafter profiles of
specsweep/data/sim_profiles.yaml (``drafters``). With --fit, each algorithm's
profile (base, cap, digit weight, depth decay, and for EAGLE-3, whose trees are
measured too, tree confidence) is fitted to its rows by least squares on
log(predicted / published), and printed as YAML.
"""

import argparse
import json
import math
import sys
from pathlib import Path

from specsweep.sim.calibration import (
    PUBLISHED_DRAFT_MODELS,
    PUBLISHED_QWEN3_8B,
    calibration_prompts,
    predict,
    predict_draft_models,
)
from specsweep.sim.model import ACCEPTANCE, default_profiles



def nelder_mead(loss, start: list[float], steps: int = 300, scale: float = 0.1) -> list[float]:
    """The minimum of ``loss`` near ``start`` by Nelder and Mead's simplex (reflection 1, expansion 2, contraction
    and shrink 1/2): the predictions come from seeded draws, a loss flat between jumps, so no gradient is used."""
    simplex = [list(start)] + [[v + (scale if i == j else 0.0) for j, v in enumerate(start)] for i in range(len(start))]
    values = [loss(x) for x in simplex]
    for _ in range(steps):
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(x[j] for x in simplex[:-1]) / (len(simplex) - 1) for j in range(len(start))]

        def toward(t: float) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centre, simplex[-1])]

        reflected = toward(-1.0)
        r = loss(reflected)
        if r < values[0]:
            expanded = toward(-2.0)
            e = loss(expanded)
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < values[-2]:
            simplex[-1], values[-1] = reflected, r
        else:
            contracted = toward(0.5)
            c = loss(contracted)
            if c < values[-1]:
                simplex[-1], values[-1] = contracted, c
            else:
                simplex = [simplex[0]] + [[(a + b) / 2 for a, b in zip(simplex[0], x)] for x in simplex[1:]]
                values = [values[0]] + [loss(x) for x in simplex[1:]]
    return simplex[min(range(len(simplex)), key=values.__getitem__)]

FITTED = {
    "eagle3": ("base", "cap", "digit_weight", "depth_decay", "tree_confidence"),
    "eagle": ("base", "cap", "depth_decay"),
    "standalone": ("base", "cap"),
}


def paper() -> None:
    print("acceptance parameters:", json.dumps(ACCEPTANCE))
    print(
        "| row | DFlash/AR pred | pub | err | DDTree/AR pred (budget) | pub | err "
        "| DDTree/DFlash pred | pub | err | tau chain | tau tree |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row, prompts in calibration_prompts().items():
        p, pub = predict(prompts), PUBLISHED_QWEN3_8B[row]
        ratio_pub = pub["ddtree"] / pub["dflash"]
        print(
            f"| {row} | {p['dflash']:.2f} | {pub['dflash']:.2f} | {p['dflash'] / pub['dflash'] - 1:+.0%} "
            f"| {p['ddtree']:.2f} ({p['ddtree_budget']}) | {pub['ddtree']:.2f} "
            f"| {p['ddtree'] / pub['ddtree'] - 1:+.0%} "
            f"| {p['ddtree_over_dflash']:.3f} | {ratio_pub:.3f} | {p['ddtree_over_dflash'] / ratio_pub - 1:+.0%} "
            f"| {p['tau_dflash']:.2f} | {p['tau_ddtree']:.2f} |"
        )
    print("AIME24/25 rows: no AIME problems are shipped in a package here; not predicted.")


def _bounded(name: str, x: float) -> float:
    """A profile parameter from an unbounded coordinate: digit_weight positive, the others in (0, 1)."""
    return math.exp(x) if name == "digit_weight" else 1 / (1 + math.exp(-x))


def _free(name: str, value: float) -> float:
    return math.log(value) if name == "digit_weight" else math.log(value / (1 - value))


def fit(profiles: dict) -> dict:
    """Each algorithm's drafter profile fitted to its published rows."""
    fitted = {name: dict(entry) for name, entry in profiles["drafters"].items()}
    for algorithm, names in FITTED.items():
        rows = [r for r in PUBLISHED_DRAFT_MODELS if r[0] == algorithm]
        start = [
            _free(n, min(max(fitted[algorithm][n], 1e-3), 0.999) if n != "digit_weight" else fitted[algorithm][n])
            for n in names
        ]

        def loss(x):
            trial = {
                **profiles,
                "drafters": {
                    **fitted,
                    algorithm: {**fitted[algorithm], **{n: _bounded(n, v) for n, v in zip(names, x)}},
                },
            }
            return sum(
                math.log(p["predicted"] / p["published"]) ** 2
                for p in predict_draft_models(rows, trial, count=20, rounds=150)
            )

        best = nelder_mead(loss, start, steps=300)
        fitted[algorithm].update({n: float(f"{_bounded(n, v):.4g}") for n, v in zip(names, best)})
    return fitted


def draft_models(do_fit: bool) -> None:
    import yaml

    profiles = default_profiles()
    if do_fit:
        drafters = fit(profiles)
        print(yaml.safe_dump({"drafters": drafters}, sort_keys=False))
        profiles = {**profiles, "drafters": drafters}
    print("| algorithm | prompts | steps / topk / tokens | published | predicted | error | source |")
    print("|---|---|---|---|---|---|---|")
    for r in predict_draft_models(profile_set=profiles):
        print(
            f"| {r['algorithm']} | {r['prompts']} | {r['num_steps']} / {r['topk']} / {r['num_draft_tokens']} | "
            f"{r['published']:.2f} | {r['predicted']:.2f} | {r['predicted'] / r['published'] - 1:+.0%} | "
            f"{r['source']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft-models", action="store_true", help="EAGLE, EAGLE-3 and standalone drafters")
    parser.add_argument("--fit", action="store_true", help="fit the drafter profiles to the published rows")
    args = parser.parse_args()
    draft_models(args.fit) if args.draft_models else paper()


if __name__ == "__main__":
    main()
