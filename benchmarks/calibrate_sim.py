"""Predicted against published results for the simulated backend's acceptance (temperature 0).

    .venv/bin/python benchmarks/calibrate_sim.py                  # DFlash and DDTree against the DDTree paper
    .venv/bin/python benchmarks/calibrate_sim.py --draft-models   # EAGLE, EAGLE-3, standalone against engines
    .venv/bin/python benchmarks/calibrate_sim.py --draft-models --fit   # and fit their drafter profiles
    .venv/bin/python benchmarks/calibrate_sim.py --ngram          # NGRAM by content against published lookup
    .venv/bin/python benchmarks/calibrate_sim.py --families [--fit]   # each target family's drafters

DFlash and DDTree: specsweep.sim.calibration on the published Qwen3-8B rows of
the DDTree paper (HF transformers on H200: runtime profile hf-eager), predicted
and published DFlash/AR, DDTree/AR and DDTree/DFlash, with the acceptance-model
parameters in use (config: sim.acceptance; fitted defaults in
specsweep/modelling/acceptance.py ACCEPTANCE).

Draft models: every row of PUBLISHED_DRAFT_MODELS (chains and trees of SGLang
and vLLM at batch 1), predicted with the drafter profiles of
specsweep/data/sim_profiles.yaml (``drafters``). With --fit, each algorithm's
profile (base, cap, digit weight, depth decay, and for EAGLE-3, whose trees are
measured too, tree confidence) is fitted to its rows by least squares on
log(predicted / published), and printed as YAML.

NGRAM: the simulated lookup's tokens a round by content kind (SGLang 0.5.16's
defaults) against PUBLISHED_NGRAM_BY_CONTENT, and whether every copying-heavy
kind (code, JSON tool calls, long documents) accepts more than every open one
(chat, math), as published lookup does; then the accept length by kind the
simulated server gives on the short workload (served_ngram_content).

Families: every row of PUBLISHED_FAMILY_DRAFTERS predicted with its family's
drafter (sim_profiles.yaml drafter_families); with --fit each family's entry
(FAMILY_FIT_PARAMETERS of its drafter) is fitted to its rows by least squares
on log(predicted / published) and printed as YAML.
"""

import argparse
import json
import math
import sys
from pathlib import Path

from specsweep.modelling.acceptance import ACCEPTANCE, mean_tau
from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.profiles import default_profiles
from specsweep.modelling.published import (
    COPYING_KINDS,
    FAMILY_FIT_PARAMETERS,
    OPEN_KINDS,
    PAPER_ROW_KIND,
    PUBLISHED_DFLASH_BY_CONTENT,
    PUBLISHED_DRAFT_MODELS,
    PUBLISHED_FAMILY_DRAFTERS,
    PUBLISHED_NGRAM_BY_CONTENT,
    PUBLISHED_QWEN3_8B,
    calibration_prompts,
    content_prompts,
    predict,
    predict_content,
    predict_draft_models,
    predict_families,
    predict_ngram_content,
)


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


def content(acceptance: dict | None = None) -> None:
    """DFlash's acceptance by content kind (the short workload's prompts) against the published ranges, and what a
    DDTree tree of budget 15 (top-k 8, the paper's best-first build) accepts over the same chain."""
    tree = Decoding("ddtree", 16, 15, 8, overlap=False, tree_build="paper")
    predicted = predict_content(acceptance)
    print("| content | predicted (chain) | published | in range | DDTree b15 / chain | source |")
    print("|---|---|---|---|---|---|")
    for kind, ps in content_prompts().items():
        low, high, source = PUBLISHED_DFLASH_BY_CONTENT[kind]
        ratio = mean_tau(ps, tree, 300, acceptance) / predicted[kind]
        inside = "yes" if low <= predicted[kind] <= high else "**no**"
        print(f"| {kind} | {predicted[kind]:.2f} | {low:.2f}-{high:.2f} | {inside} | {ratio:.2f} | {source} |")


# the DFlash acceptance parameters --fit-dflash fits, with their bounds (the rest keep ACCEPTANCE's values)
DFLASH_FITTED = {
    "base": (0.3, 0.98),
    "gain": (0.0, 2.0),
    "digit_weight": (0.0, 12.0),
    "depth_decay": (0.9, 1.0),
    "hard_share": (0.0, 1.0),
    "hard_gain": (0.0, 8.0),
    "hard_structure": (0.0, 1.0),
    "hard_top1": (0.05, 0.9),
    "hard_ratio": (0.05, 0.95),
    "structure_focus": (0.0, 3.0),
}


def fit_dflash(count: int = 10, rounds: int = 60, steps: int = 250) -> dict:
    """DFlash's acceptance parameters (DFLASH_FITTED) by Nelder-Mead on: each content kind's chain acceptance
    outside its published range (log of the distance to the range, squared; 0 inside); each paper row's
    DDTree/DFlash speedup at budget 128 in the paper's runtime (log(predicted / published), squared); and each
    paper row's DFlash/AR speedup for the one round cost that fits them best (log(tau / (r x published)),
    squared, r the geometric mean of tau / published over the rows: the hf-eager runtime's drafter cost is
    fitted to it afterwards)."""
    prompts = content_prompts(count)  # the paper's rows' prompts among them (PAPER_ROW_KIND)
    cost = CostModel.named("H200", "qwen3-8b", "hf-eager")
    chain = Decoding("dflash", 16, overlap=False)
    tree = Decoding("ddtree", 16, 128, 8, overlap=False, tree_build="paper")
    per_tau = cost.decode_step(chain, [1000]) / cost.decode_step(tree, [1000])
    names = list(DFLASH_FITTED)

    def params(x: list[float]) -> dict:
        return {n: min(max(v, DFLASH_FITTED[n][0]), DFLASH_FITTED[n][1]) for n, v in zip(names, x)}

    def loss(x: list[float]) -> float:
        p, total = params(x), 0.0
        taus = {kind: mean_tau(ps, chain, rounds, p) for kind, ps in prompts.items()}
        for kind, tau in taus.items():
            low, high, _ = PUBLISHED_DFLASH_BY_CONTENT[kind]
            total += math.log(min(max(tau, low), high) / tau) ** 2
        speedups = []
        for row, kind in PAPER_ROW_KIND.items():
            pub, tau = PUBLISHED_QWEN3_8B[row], taus[kind]
            ratio = mean_tau(prompts[kind], tree, rounds, p) / tau * per_tau
            total += math.log(ratio / (pub["ddtree"] / pub["dflash"])) ** 2
            speedups.append(math.log(tau / pub["dflash"]))
        r = sum(speedups) / len(speedups)
        return total + sum((v - r) ** 2 for v in speedups)

    best = nelder_mead(loss, [ACCEPTANCE[n] for n in names], steps=steps, scale=0.05)
    return {n: float(f"{v:.4g}") for n, v in params(best).items()}


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


def served_ngram_content(requests: int = 200, new_tokens: int = 256, concurrency: int = 1) -> dict[str, float]:
    """NGRAM's accept length by content kind through the simulated engine in virtual time (specsweep.sim.replay):
    the short workload's ``requests`` (seed 1) at ``concurrency``, ``new_tokens`` each (ignore_eos), SGLang
    0.5.16's defaults; per kind: sum of completion tokens / sum of verify rounds (SGLang's accept length)."""
    from specsweep import metrics
    from specsweep.sim.replay import closed_loop, engine
    from specsweep.workloads import build

    sessions = build({"name": "short", "family": "short", "requests": requests, "max_new_tokens": new_tokens}, seed=1)
    records = closed_loop(engine("ngram"), sessions, concurrency, {"ignore_eos": True})
    kinds = sorted({r["kind"] for r in records})
    return {kind: metrics.acceptance_length_sglang(metrics.of_kind(records, kind)) for kind in kinds}


def ngram() -> None:
    """Print the simulated NGRAM by content kind against the published lookup figures, the order check, and the
    accept length by kind the simulated server gives (served_ngram_content)."""
    taus = predict_ngram_content()
    print("| kind | published (low-high) | simulated | in range | sources |")
    print("|---|---|---|---|---|")
    for kind, (low, high, source) in PUBLISHED_NGRAM_BY_CONTENT.items():
        tau = taus[kind]
        print(f"| {kind} | {low:.2f}-{high:.2f} | {tau:.2f} | {'yes' if low <= tau <= high else 'no'} | {source} |")
    ordered = min(taus[k] for k in COPYING_KINDS) > max(taus[k] for k in OPEN_KINDS)
    print(f"\ncopying-heavy kinds above open ones: {ordered}")
    served = served_ngram_content()
    print("\nthe simulated server, short workload (200 requests, 256 tokens each, concurrency 1), accept length:")
    print(", ".join(f"{kind} {value:.2f}" for kind, value in served.items()))


def fit_families(profiles: dict) -> dict:
    """Each family's drafter entries fitted to its PUBLISHED_FAMILY_DRAFTERS rows (FAMILY_FIT_PARAMETERS of the
    drafter, least squares on log(predicted / published), Nelder-Mead from the shipped values)."""
    families = {
        name: {k: dict(v) for k, v in entries.items()} for name, entries in profiles["drafter_families"].items()
    }
    for family, algorithm in sorted({(r[0], r[1]) for r in PUBLISHED_FAMILY_DRAFTERS}):
        rows = [r for r in PUBLISHED_FAMILY_DRAFTERS if r[:2] == (family, algorithm)]
        names = FAMILY_FIT_PARAMETERS[algorithm]
        base = ACCEPTANCE if algorithm == "dflash" else profiles["drafters"][algorithm]
        entry = families[family].setdefault(algorithm, {})
        start = [_free(n, entry.get(n, base[n])) for n in names]

        def loss(x, family=family, algorithm=algorithm, rows=rows, names=names):
            trial = {n: _bounded(n, v) for n, v in zip(names, x)}
            fams = {**families, family: {**families[family], algorithm: {**families[family][algorithm], **trial}}}
            predicted = predict_families({**profiles, "drafter_families": fams}, count=10, rounds=150)
            mine = [p for p in predicted if (p["family"], p["algorithm"]) == (family, algorithm)]
            return sum(math.log(p["predicted"] / p["published"]) ** 2 for p in mine)

        best = nelder_mead(loss, start, steps=60)
        entry.update({n: float(f"{_bounded(n, v):.4g}") for n, v in zip(names, best)})
    return families


def families(do_fit: bool) -> None:
    """Print (and with ``do_fit`` fit first) each family's drafters against their published figures."""
    import yaml

    profiles = default_profiles()
    if do_fit:
        fitted = fit_families(profiles)
        print(yaml.safe_dump({"drafter_families": fitted}, sort_keys=False))
        profiles = {**profiles, "drafter_families": fitted}
    print("| family | drafter | prompts | published | predicted | error | source |")
    print("|---|---|---|---|---|---|---|")
    for r in predict_families(profiles):
        print(
            f"| {r['family']} | {r['algorithm']} | {r['prompts']} | {r['published']:.2f} | {r['predicted']:.2f} | "
            f"{r['predicted'] / r['published'] - 1:+.0%} | {r['source']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft-models", action="store_true", help="EAGLE, EAGLE-3 and standalone drafters")
    parser.add_argument("--fit", action="store_true", help="fit the drafter profiles to the published rows")
    parser.add_argument("--fit-dflash", action="store_true", help="fit DFlash's acceptance (ACCEPTANCE) first")
    parser.add_argument("--ngram", action="store_true", help="NGRAM's acceptance by content against published")
    parser.add_argument("--families", action="store_true", help="each target family's drafters against published")
    args = parser.parse_args()
    if args.families:
        families(args.fit)
        return
    if args.ngram:
        ngram()
        return
    if args.draft_models:
        draft_models(args.fit)
        return
    acceptance = None
    if args.fit_dflash:
        acceptance = fit_dflash()
        print("fitted:", json.dumps(acceptance))
        ACCEPTANCE.update(acceptance)
    paper()
    content(acceptance)


if __name__ == "__main__":
    main()
