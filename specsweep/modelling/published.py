"""Published figures (acceptance lengths and speedups at batch 1, temperature 0) and the model's predictions of them.

The prediction runs the simulator's own mechanisms on real prompts: each
prompt's drafter acceptance from its text, the DFlash chain and the DDTree
best-first tree on those distributions (many verify rounds), and the step
cost of the runtime profile. Nothing is looked up per dataset. The acceptance
model's parameters are fitted to these figures (benchmarks/calibrate_sim.py).
"""

from __future__ import annotations

from .. import workloads
from ..text import chat_prompt
from ..workloads import SYSTEM, short_pools
from .acceptance import mean_tau
from .cost import CostModel
from .decoding import Decoding

# DDTree paper, Table 1: Qwen3-8B, HF transformers on H200, temperature 0, batch 1, best budget per row.
PUBLISHED_QWEN3_8B = {
    "gsm8k": {"dflash": 4.78, "ddtree": 6.57},
    "humaneval": {"dflash": 4.84, "ddtree": 6.61},
    "aime24": {"dflash": 5.38, "ddtree": 7.46},
    "aime25": {"dflash": 5.32, "ddtree": 7.39},
    "alpaca": {"dflash": 2.07, "ddtree": 3.12},
}
BUDGETS = (16, 32, 64, 128, 256, 512, 1024)


def predict(
    prompts: list[str],
    gpu: str = "H200",
    model: str = "qwen3-8b",
    runtime: str = "hf-eager",
    block_size: int = 16,
    topk: int = 8,
    acceptance: dict | None = None,
) -> dict:
    """Predicted speedups at batch 1: DFlash/AR, best DDTree/AR (and its budget), DDTree/DFlash, acceptance lengths."""
    cost = CostModel.named(gpu, model, runtime)
    context = [1000]
    ar_step = cost.decode_step(Decoding("ar"), context)
    chain = Decoding("dflash", block_size, overlap=False)
    tau_chain = mean_tau(prompts, chain, acceptance=acceptance)
    dflash = tau_chain / cost.decode_step(chain, context) * ar_step
    trees = {}
    for budget in BUDGETS:
        tree = Decoding("ddtree", block_size, budget, topk, overlap=False, tree_build="paper")
        tau = mean_tau(prompts, tree, acceptance=acceptance)
        trees[budget] = (tau, tau / cost.decode_step(tree, context) * ar_step)
    best = max(trees, key=lambda b: trees[b][1])
    return {
        "dflash": dflash,
        "ddtree": trees[best][1],
        "ddtree_budget": best,
        "ddtree_over_dflash": trees[best][1] / dflash,
        "tau_dflash": tau_chain,
        "tau_ddtree": trees[best][0],
        "tau_by_budget": {b: t for b, (t, _) in trees.items()},
    }


# Published DFlash acceptance (block 16, temperature 0, thinking off; tokens per verify round, the bonus token
# included) by content, as (low, high, source): what the short workload's prompts of each kind should land in.
DFLASH_README = "z-lab/dflash README, first version (commit cc32782): Qwen3-8B-DFlash-b16, Transformers, B200, batch 1"
PUBLISHED_DFLASH_BY_CONTENT = {
    "chat": (3.16, 4.25, f"{DFLASH_README}: Alpaca 3.16, MT-Bench 4.25"),
    "math": (6.29, 6.55, f"{DFLASH_README}: GSM8K 6.55; sgl-project/sglang PR 16818: GSM8K 6.29-6.44 at TP 1-8"),
    "code": (6.00, 7.12, f"{DFLASH_README}: MBPP 6.00, HumanEval 6.55, LiveCodeBench 7.12"),
    "json": (
        6.55,
        9.0,
        "no published DFlash figure for JSON tool calls (BFCL): held at or above code's HumanEval (6.55) and below "
        "DFlash's HumanEval on Qwen3.5-27B in SGLang (9.18, the z-lab/Qwen3.5-27B-DFlash model card)",
    ),
}


def content_prompts(count: int = 20) -> dict[str, list[str]]:
    """The short workload's prompts of each content kind (chat, math, code, JSON tool calls), rendered as sent."""
    out = {}
    for kind, pool in short_pools().items():
        rows = list(pool)[:count]
        if kind == "json":  # (system with the functions, question)
            messages = [[{"role": "system", "content": a}, {"role": "user", "content": b}] for a, b in rows]
            out[kind] = [chat_prompt(m) for m in messages]
        else:
            out[kind] = [chat_prompt([SYSTEM, {"role": "user", "content": t}]) for t in rows]
    return out


def predict_content(acceptance: dict | None = None, count: int = 20, rounds: int = 300) -> dict[str, float]:
    """DFlash's mean acceptance (block 16, chain) on each content kind's prompts (content_prompts)."""
    chain = Decoding("dflash", 16, overlap=False)
    return {kind: mean_tau(ps, chain, rounds, acceptance) for kind, ps in content_prompts(count).items()}


# Published n-gram lookup acceptance by content (tokens per verify round, the bonus token included, batch 1,
# temperature 0), as (low, high, sources): what the simulated NGRAM's replies of each kind should land in, and the
# order they should keep: copying-heavy content (code, tool calls, long documents) above open generation (chat,
# math). Spec-Bench's PLD rows are speedups at batch 1, which for a lookup that drafts for free and verifies ~10
# tokens at an AR step's cost are tokens a round less the verify's small extra cost (a lower bound of them).
SPECDECODE_BENCH = "vLLM n-gram, 3 draft tokens, Llama-3.1-8B, replayed from SpecDecode-Bench's per-token traces"
PLD_EAGLE = "prompt lookup decoding in EAGLE's harness, Vicuna-13B"
SPEC_BENCH = "Spec-Bench leaderboard (hemingkx/Spec-Bench Leaderboard.md), PLD on Vicuna-7B-v1.3, A100, speedup"
PUBLISHED_NGRAM_BY_CONTENT = {
    "chat": (1.40, 1.64, f"{SPECDECODE_BENCH}: ShareGPT 1.40; {PLD_EAGLE}: MT-bench 1.63; {SPEC_BENCH}: 1.64x"),
    "math": (1.16, 1.73, f"{SPECDECODE_BENCH}: GSM8K 1.16; {PLD_EAGLE}: GSM8K 1.73; {SPEC_BENCH}: 1.61x"),
    "code": (1.93, 2.03, f"{SPECDECODE_BENCH}: InstructCoder (code editing) 2.03; {PLD_EAGLE}: HumanEval 1.93"),
    "json": (
        1.93,
        2.5,
        "no published n-gram figure for JSON tool calls: held at or above code's (a call copies the function's name "
        "and keys from its schema) and below the summarisation row",
    ),
    "long": (1.71, 2.43, f"{SPEC_BENCH}: retrieval-augmented generation 1.71x, summarisation 2.43x"),
}
COPYING_KINDS = ("code", "json", "long")  # the content published lookup accepts most on
OPEN_KINDS = ("chat", "math")  # open generation: least (chat and math are not ordered alike by the sources)


def long_prompts(count: int = 10, tokens: int = 2000) -> list[str]:
    """Long-context prompts as the long workload builds them (standard-library code of about ``tokens`` tokens from
    ``count`` distinct definitions, with a question about it), rendered as sent."""
    starts = list(workloads._definition_starts())
    out = []
    for module, line in starts[:: max(1, len(starts) // count)][:count]:
        names, document = workloads._stdlib_document(module, tokens, None, line)
        user = (
            f"Here is some Python code from line {line + 1} of {workloads._DOCUMENT_MODULES[module]} on ({names})."
            f"\n\n```python\n{document}```\n\n{workloads._QUESTIONS[0]}"
        )
        out.append(chat_prompt([SYSTEM, {"role": "user", "content": user}]))
    return out


def predict_ngram_content(decoding: Decoding | None = None, count: int = 20, new_tokens: int = 256) -> dict:
    """The simulated NGRAM's mean tokens a round (SGLang 0.5.16's defaults: 12 draft tokens, breadth 10, unless
    ``decoding``) on each content kind's prompts: content_prompts' chat, math, code and JSON, and long_prompts."""
    decoding = decoding or Decoding("ngram", num_draft_tokens=12, max_bfs_breadth=10)
    prompts = {**content_prompts(count), "long": long_prompts(max(1, count // 2))}
    return {kind: mean_tau(ps, decoding, max_new_tokens=new_tokens) for kind, ps in prompts.items()}


# the DDTree paper's rows, by the content kind whose prompts stand for them (content_prompts)
PAPER_ROW_KIND = {"gsm8k": "math", "humaneval": "code", "alpaca": "chat"}


def calibration_prompts(count: int = 40) -> dict[str, list[str]]:
    """Prompts for the published rows that have shipped data: GSM8K, HumanEval, and own chat prompts for Alpaca
    (content_prompts' math, code and chat).

    AIME problems are not shipped in any package here; those rows are not predicted.
    """
    prompts = content_prompts(count)
    return {row: prompts[kind] for row, kind in PAPER_ROW_KIND.items()}


# Published acceptance lengths of draft models in serving engines at temperature 0 (tokens per verify round, the
# bonus token included), each against the prompts of calibration_prompts that stand for its dataset (own chat
# prompts for MT-bench, GSM8K for MATH-500). (algorithm, prompts, num_steps, topk, num_draft_tokens, tau, source)
SPECBUNDLE = "SGLang, Llama-3.1-8B-Instruct, lmsys EAGLE-3 head (SpecForge SpecBundle data.json)"
PUBLISHED_DRAFT_MODELS = [
    ("eagle3", "alpaca", 3, 1, 4, 2.93, f"{SPECBUNDLE}, MT-bench"),
    ("eagle3", "alpaca", 5, 1, 6, 3.55, f"{SPECBUNDLE}, MT-bench"),
    ("eagle3", "alpaca", 7, 1, 8, 3.91, f"{SPECBUNDLE}, MT-bench"),
    ("eagle3", "alpaca", 5, 3, 6, 2.94, f"{SPECBUNDLE}, MT-bench"),
    ("eagle3", "alpaca", 7, 4, 8, 2.91, f"{SPECBUNDLE}, MT-bench"),
    ("eagle3", "humaneval", 3, 1, 4, 3.05, f"{SPECBUNDLE}, HumanEval"),
    ("eagle3", "humaneval", 5, 1, 6, 3.74, f"{SPECBUNDLE}, HumanEval"),
    ("eagle3", "humaneval", 7, 1, 8, 4.10, f"{SPECBUNDLE}, HumanEval"),
    ("eagle3", "humaneval", 5, 3, 6, 2.94, f"{SPECBUNDLE}, HumanEval"),
    ("eagle3", "humaneval", 7, 4, 8, 2.93, f"{SPECBUNDLE}, HumanEval"),
    ("eagle3", "gsm8k", 3, 1, 4, 2.78, f"{SPECBUNDLE}, MATH-500"),
    ("eagle3", "gsm8k", 5, 1, 6, 3.25, f"{SPECBUNDLE}, MATH-500"),
    ("eagle3", "gsm8k", 7, 1, 8, 3.49, f"{SPECBUNDLE}, MATH-500"),
    ("eagle3", "gsm8k", 5, 3, 6, 3.31, f"{SPECBUNDLE}, MATH-500"),
    ("eagle3", "gsm8k", 7, 4, 8, 3.07, f"{SPECBUNDLE}, MATH-500"),
    (
        "eagle",
        "alpaca",
        2,
        1,
        3,
        2.10,
        "vLLM, Llama-3.1-8B-Instruct, EAGLE-1 head, MT-bench (vllm-project/vllm issue 20780)",
    ),
    ("eagle", "alpaca", 3, 1, 4, 2.29, "vLLM, as above"),
    ("eagle", "alpaca", 5, 1, 6, 2.43, "vLLM, as above"),
    ("eagle", "alpaca", 7, 1, 8, 2.47, "vLLM, as above"),
    (
        "standalone",
        "humaneval",
        3,
        1,
        4,
        2.8,
        "vLLM, Qwen3-1.7B with a Qwen3-0.6B drafter, InstructCoder: at least 2.8 (its test's floor, tests/v1/e2e)",
    ),
]


def predict_draft_models(rows=None, profile_set: dict | None = None, count: int = 40, rounds: int = 300) -> list[dict]:
    """Predicted against published acceptance length for every row of PUBLISHED_DRAFT_MODELS (or ``rows``), with
    the drafter profiles of ``profile_set`` (default: the shipped ones)."""
    prompts = calibration_prompts(count)
    out = []
    for algorithm, key, steps, topk, tokens, tau, source in rows or PUBLISHED_DRAFT_MODELS:
        decoding = Decoding(algorithm, topk=topk, num_steps=steps, num_draft_tokens=tokens)
        predicted = mean_tau(prompts[key], decoding, rounds=rounds, profile_set=profile_set)
        out.append(
            {
                "algorithm": algorithm,
                "prompts": key,
                "num_steps": steps,
                "topk": topk,
                "num_draft_tokens": tokens,
                "published": tau,
                "predicted": predicted,
                "source": source,
            }
        )
    return out


# Published acceptance of each target family's drafters (tokens a round, the bonus token included, temperature 0):
# (family, algorithm, content kind whose prompts stand for the dataset, decoding fields, tau, source). The family's
# entry of sim_profiles.yaml drafter_families is fitted to its rows (benchmarks/calibrate_sim.py --families --fit).
PUBLISHED_FAMILY_DRAFTERS: list[tuple[str, str, str, dict, float, str]] = [
    (
        "qwen3",
        "eagle3",
        "chat",
        {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        2.26,
        "vLLM tests/v1/e2e: Qwen3-8B's EAGLE-3 head, at least 2.26 at 3 steps (its test's floor)",
    ),
    (
        "qwen3.5",
        "dflash",
        "chat",
        {"block_size": 16},
        5.47,
        "z-lab/Qwen3.5-27B-DFlash model card: MT-Bench 5.47",
    ),
    (
        "qwen3.5",
        "dflash",
        "code",
        {"block_size": 16},
        9.18,
        "z-lab/Qwen3.5-27B-DFlash model card: HumanEval 9.18 in SGLang",
    ),
]
# the parameters each fit moves (the rest of the family's drafter as its defaults)
FAMILY_FIT_PARAMETERS = {"dflash": ("base", "hard_share", "hard_top1"), "eagle3": ("cap",)}


def predict_families(profile_set: dict | None = None, count: int = 20, rounds: int = 300) -> list[dict]:
    """Predicted against published for every row of PUBLISHED_FAMILY_DRAFTERS, each with its family's drafter
    (acceptance.drafter_acceptance) over the content kind's prompts (content_prompts)."""
    prompts = content_prompts(count)
    out = []
    for family, algorithm, kind, fields, tau, source in PUBLISHED_FAMILY_DRAFTERS:
        decoding = Decoding(algorithm, overlap=False, **fields)
        predicted = mean_tau(prompts[kind], decoding, rounds=rounds, profile_set=profile_set, family=family)
        row = {"family": family, "algorithm": algorithm, "prompts": kind, "published": tau}
        out.append({**row, "predicted": predicted, "source": source})
    return out
