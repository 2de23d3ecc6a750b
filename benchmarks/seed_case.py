"""The seed's own result on the simulated backend: config/plan-seed.yaml's build, GPU and model at batch 1.

The seed measured, on one RTX PRO 6000 Blackwell with a hybrid 27B model at
batch 1 and temperature 0 over five diverse prompts, DDTree budget 15 with
top-k capped at 8 (its private build) about a quarter faster than DFlash
(block 16), a JSON-parsing prompt gaining most, and budget 16 with top-k
uncapped slower than DFlash. This runs the same on the simulated engine in
virtual time (specsweep.sim.replay; simulated numbers): each prompt alone,
one request at a time, each method's output throughput over the prompt's
reply (max_new_tokens of it, ignore_eos), for several seeds of the drafts (SGLang's --random-seed).

    .venv/bin/python benchmarks/seed_case.py [--seeds 0 1 2] [--max-new-tokens 512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources
from pathlib import Path

import yaml

from specsweep import ddtree
from specsweep.sim.replay import closed_loop, engine
from specsweep.workloads import SYSTEM, Session

PLAN = Path(__file__).resolve().parents[1] / "config" / "plan-seed.yaml"
METHODS = {
    "dflash": {"algorithm": "dflash"},
    "ddtree-b15-t8": {"algorithm": "ddtree", "budget": 15, "topk": 8},
    "ddtree-b16-uncapped": {"algorithm": "ddtree", "budget": 16, "topk": None},
}


def prompts() -> dict[str, list[dict]]:
    """Five diverse prompts like the seed's (specsweep's built-in short prompts, specsweep/data/short.yaml): two
    chat, one math, one code and one asking for the JSON of a sentence's facts, by name."""
    rows = yaml.safe_load((resources.files("specsweep") / "data" / "short.yaml").read_text())
    by_kind: dict[str, list[str]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row["text"])
    texts = {
        "chat": by_kind["chat"][0],
        "advice": by_kind["chat"][1],
        "math": by_kind["math"][0],
        "code": by_kind["code"][0],
        "json": by_kind["json"][0],
    }
    return {name: [SYSTEM, {"role": "user", "content": text}] for name, text in texts.items()}


def seed_case(seed: int, max_new_tokens: int = 512) -> dict[str, dict[str, float]]:
    """{method: {prompt: output tokens per second}} at batch 1 with drafts seeded by ``seed``."""
    plan = yaml.safe_load(PLAN.read_text())
    ddtree.define(plan["ddtree_builds"])
    sim = plan["sim"]
    out: dict[str, dict[str, float]] = {}
    for name, method in METHODS.items():
        params = {k: v for k, v in method.items() if k != "algorithm"}
        tree = {"tree_build": "seed-private"} if method["algorithm"] == "ddtree" else {}
        server = engine(
            method["algorithm"],
            gpu=sim["gpu"],
            model_profile=sim["model_profile"],
            random_seed=seed,
            **tree,
            **params,
        )
        out[name] = {}
        for prompt, messages in prompts().items():
            session = Session(f"{prompt}-{seed}", messages=messages, max_new_tokens=max_new_tokens, kind=prompt)
            (record,) = closed_loop(server, [session], 1, {"ignore_eos": True})
            out[name][prompt] = record["output_tokens"] / (record["t_end"] - record["t0"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-new-tokens", type=int, default=512)
    args = parser.parse_args()
    print("| seed | method | " + " | ".join(prompts()) + " | mean over DFlash |")
    print("|---|---|" + "---|" * (len(prompts()) + 1))
    for seed in args.seeds:
        case = seed_case(seed, args.max_new_tokens)
        for name, by_prompt in case.items():
            gains = [by_prompt[p] / case["dflash"][p] for p in by_prompt]
            cells = " | ".join(f"{v:.1f} ({g:.2f}x)" for v, g in zip(by_prompt.values(), gains))
            print(f"| {seed} | {name} | {cells} | {statistics.mean(gains):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
