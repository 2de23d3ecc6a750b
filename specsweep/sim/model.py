"""The simulated model: what the target generates, what the drafter proposes, what a step costs.

Everything here is deterministic for a given prompt, method and seed. Numbers
produced with it are simulated and labelled so everywhere.

Acceptance comes from the text: the drafter's per-depth top-1 probability
grows with how predictable the context is (code and JSON symbols, repeated
tokens) and drops with thinking mode and temperature. Per verify round the
drafter yields, for each depth of the block, a distribution over ranked
candidates; the target's token is drawn from that distribution (a calibrated
drafter). DFlash accepts the longest prefix of rank-0 tokens; DDTree builds
the chain or tree its build would (specsweep.ddtree: SGLang's pull request
29907 by default, the paper's best-first tree as another build) and walks it
from the root along the target's tokens. Both add the bonus token.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

from .. import ddtree
from ..text import split_tokens

CANDIDATES_PER_DEPTH = 32  # ranked candidates the drafter distribution covers


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


_STRUCTURE = set("{}[]()<>:;=\"',._-/#*+|\\`")
_MARKUP = re.compile(r"<\|[^|]*\|>|</?think>|^(system|user|assistant|tool)$", re.MULTILINE)

# Acceptance model, fitted by benchmarks/calibrate_sim.py to the published Qwen3-8B rows
# (DFlash/AR and DDTree/DFlash at batch 1, temperature 0); config `sim.acceptance` overrides.
ACCEPTANCE = {
    "base": 0.45,  # top-1 acceptance of text with nothing predictable in it
    "gain": 0.9,  # per unit of predictability (repetition + digit_weight * digit share)
    "digit_weight": 4.0,
    "cap": 0.875,  # the best a drafter does on code and structured text
    "thinking": 0.45,  # factor with thinking mode on
    "temperature": 0.35,  # a / (1 + temperature_factor * T)
    "second_choice_ratio": 0.55,  # how fast the drafter's mass falls over ranks 2, 3, ...
}


def text_features(text: str) -> dict:
    """Predictability features of a context's content (chat markup removed): repetition, digits, structure symbols."""
    content = _MARKUP.sub(" ", text)[-6000:]
    tokens = [t.strip() for t in split_tokens(content) if t.strip()]
    if not tokens:
        return {"repetition": 0.0, "digits": 0.0, "symbols": 0.0}
    return {
        "repetition": 1.0 - len(set(tokens)) / len(tokens),
        "digits": sum(1 for t in tokens if t[0].isdigit()) / len(tokens),
        "symbols": sum(1 for t in tokens if t[0] in _STRUCTURE) / len(tokens),
    }


def top1_probability(text: str, temperature: float, thinking: bool, params: dict | None = None) -> float:
    """The drafter's top-1 acceptance probability for a context:
    a = min(cap, base + gain * (repetition + digit_weight * digits)), x thinking factor, / (1 + t * T)."""
    p = {**ACCEPTANCE, **(params or {})}
    f = text_features(text)
    a = min(p["cap"], p["base"] + p["gain"] * (f["repetition"] + p["digit_weight"] * f["digits"]))
    if thinking:
        a *= p["thinking"]
    if temperature > 0:
        a /= 1.0 + p["temperature"] * temperature
    return max(0.05, min(0.95, a))


@lru_cache(maxsize=1 << 16)  # a request keeps its a: every verify round asks for the same depths again
def depth_distribution(a: float, depth: int, ratio: float = ACCEPTANCE["second_choice_ratio"]) -> tuple[float, ...]:
    """Probabilities of the ranked candidates at a depth of the block (rank 0 first).

    Top-1 mass q = a * 0.995^depth; of the rest, a share a falls geometrically
    (ratio) over the next ranks and the remainder lies outside every candidate
    list: a drafter that is often right is also close when it is wrong.
    """
    q = a * (0.995 ** depth)
    inside = (1.0 - q) * a
    return (q, *(inside * (1 - ratio) * ratio ** (r - 1) for r in range(1, CANDIDATES_PER_DEPTH)))


@lru_cache(maxsize=4096)
def build_tree(a_key: float, depths: int, budget: int, topk: int, build_name: str = ddtree.DEFAULT_BUILD,
               depth_bonus: float | None = None) -> frozenset:
    """The drafted nodes a DDTree build verifies for a drafter of top-1 probability ``a_key`` (prefixes of ranks):
    the build's chain or tree (specsweep.ddtree) over this drafter's per-depth distributions, with its own depth
    bonus unless one is given."""
    tree_build = ddtree.build(build_name)
    if depth_bonus is not None:
        tree_build = replace(tree_build, depth_bonus=depth_bonus)
    mode, width = ddtree.shape(tree_build, depths + 1, budget, topk)
    log_probs = tuple(tuple(math.log(p) for p in depth_distribution(a_key, d)[:max(width, 1)]) for d in range(depths))
    return ddtree.tree_prefixes(tree_build, log_probs, budget, width, mode)


@dataclass(frozen=True)
class Decoding:
    """How the simulated server decodes: algorithm and its parameters."""

    algorithm: str = "ar"  # ar | dflash | ddtree
    block_size: int = 16
    budget: int = 0
    topk: int | None = None  # DDTree width cap (SGLANG_DDTREE_MAX_TOPK); None: the build's default
    overlap: bool = True
    tree_build: str = ddtree.DEFAULT_BUILD  # DDTree: which build's tree (specsweep/data/ddtree_builds.yaml)
    # DDTree: PR 29907's rank probe (SGLANG_DDTREE_RANK_PROBE), a diagnostic that does not change what is drafted
    # or accepted (left out of the repr, which seeds the acceptance draws)
    rank_probe: bool = field(default=False, repr=False)
    # DDTree: the build's depth bonus as the server's environment sets it (None: the build's default)
    depth_bonus: float | None = field(default=None, repr=False)

    @classmethod
    def of_build(cls, algorithm: str, block_size: int, budget: int, topk: int | None, overlap: bool,
                 tree_build: str, env) -> "Decoding":
        """A decoding as a server with this environment runs it (rank probe, the build's depth-bonus variable)."""
        default = ddtree.build(tree_build)
        tuned = ddtree.with_environment(default, env)
        return cls(algorithm, block_size, budget, topk, overlap, tree_build, ddtree.rank_probe_on(env),
                   None if tuned is default else tuned.depth_bonus)

    def verify_width(self) -> int:
        """Tokens verified per request per step: 1 (AR), block (DFlash), budget + 1 (DDTree, chain or tree)."""
        if self.algorithm == "dflash":
            return self.block_size
        if self.algorithm == "ddtree":
            return self.budget + 1
        return 1

    def probes_ranks(self) -> bool:
        """Whether its steps run the rank probe: DDTree in tree mode with the probe on."""
        return self.rank_probe and self.algorithm == "ddtree" and self.tree_shape()[0] == "tree"

    def tree_shape(self) -> tuple[str, int] | None:
        """DDTree: ("chain", 1) or ("tree", width) as its build runs this budget; None otherwise."""
        if self.algorithm != "ddtree":
            return None
        return ddtree.shape(ddtree.build(self.tree_build), self.block_size, self.budget, self.topk)


def target_ranks(decoding: Decoding, a: float, rng: random.Random) -> list[int]:
    """One verify round's draw: at each depth of the block, the rank of the target's token among the drafter's
    candidates (CANDIDATES_PER_DEPTH: outside every candidate list)."""
    ranks = []
    for d in range(decoding.block_size - 1):
        probs = depth_distribution(a, d)
        u, r = rng.random(), 0
        while r < len(probs) and u >= probs[r]:
            u -= probs[r]
            r += 1
        ranks.append(r)
    return ranks


def accepted_tokens(decoding: Decoding, a: float, rng: random.Random, ranks: list[int] | None = None) -> int:
    """Tokens committed by one verify round (accepted drafts + bonus token), for the round's target ranks
    (drawn here when not given)."""
    if decoding.algorithm == "ar":
        return 1
    depths = decoding.block_size - 1
    if ranks is None:
        ranks = target_ranks(decoding, a, rng)
    if decoding.algorithm == "dflash":
        accepted = 0
        while accepted < depths and ranks[accepted] == 0:
            accepted += 1
        return accepted + 1
    tree = build_tree(round(a, 3), depths, decoding.budget, decoding.topk, decoding.tree_build, decoding.depth_bonus)
    accepted = 0
    while accepted < depths and tuple(ranks[: accepted + 1]) in tree:
        accepted += 1
    return accepted + 1


def reply_tokens(prompt: str, max_new_tokens: int, ignore_eos: bool = False) -> tuple[list[str], bool]:
    """The target's greedy reply to a prompt: tokens and whether it stopped by itself.

    Deterministic per prompt and independent of the decoding method (lossless).
    The reply reuses the prompt's own vocabulary, so its content resembles it.
    """
    rng = random.Random(_seed("reply", prompt))
    natural = rng.randint(max(8, max_new_tokens // 5), max(9, int(max_new_tokens * 1.1)))
    length = max_new_tokens if ignore_eos else min(natural, max_new_tokens)
    vocab = [t for t in split_tokens(prompt[-4000:]) if t.strip()] or [" ok"]
    out, i = [], rng.randrange(len(vocab))
    for _ in range(length):
        if rng.random() < 0.7:  # continue the current run of prompt text
            i = (i + 1) % len(vocab)
        else:
            i = rng.randrange(len(vocab))
        tok = vocab[i]
        out.append(tok if tok[0].isspace() or not tok[0].isalnum() else " " + tok)
    return out, natural <= max_new_tokens and not ignore_eos


@lru_cache(maxsize=1)
def default_profiles() -> dict:
    """Hardware, model and runtime profiles shipped in specsweep/data/sim_profiles.yaml."""
    import yaml
    from importlib import resources

    return yaml.safe_load(resources.files("specsweep").joinpath("data/sim_profiles.yaml").read_text())


def profiles(overrides: dict | None = None) -> dict:
    """Shipped profiles with config overrides (sim.profiles) merged in, entry by entry."""
    base = default_profiles()
    out = {kind: {name: dict(entry) for name, entry in base[kind].items()} for kind in base}
    for kind, entries in (overrides or {}).items():
        for name, entry in entries.items():
            out.setdefault(kind, {}).setdefault(name, {}).update(entry)
    return out


@dataclass(frozen=True)
class CostModel:
    """Time of one engine step for a hardware, model and runtime profile under tensor parallelism."""

    gpu: dict
    model: dict
    runtime: dict
    tp: int = 1

    @classmethod
    def named(cls, gpu: str, model: str, runtime: str = "sglang", tp: int = 1, overrides: dict | None = None):
        p = profiles(overrides)
        return cls(p["gpus"][gpu], p["models"][model], p["runtimes"][runtime], tp)

    def experts_touched(self, tokens: float) -> float:
        """Expected routed experts per MoE layer that a step's tokens touch: E x (1 - (1 - k/E)^tokens), with E
        experts of which each token is routed to k (uniform routing, so tokens share an expert only by chance);
        k for one token, never more than E. 0 for a dense model."""
        m = self.model
        experts, per_token = m.get("experts", 0), m.get("experts_per_token", 0)
        if not experts:
            return 0.0
        return experts * (1.0 - (1.0 - per_token / experts) ** max(1.0, tokens))

    def _bytes_read(self, tokens: int) -> float:
        """Weight bytes one step reads: all of them for a dense model; for MoE the shared weights (attention,
        embeddings, router) plus the routed experts the tokens touch:
        weight_bytes - expert_bytes + expert_bytes x experts_touched(tokens) / E."""
        m = self.model
        if not m.get("experts"):
            return m["weight_bytes"]
        shared = m["weight_bytes"] - m["expert_bytes"]
        return shared + m["expert_bytes"] * self.experts_touched(tokens) / m["experts"]

    def verify_seconds(self, tokens: int, contexts: list[int]) -> float:
        """Target forward over ``tokens`` tokens of a batch with these context lengths (no drafter).

        roofline(weights read, compute) + attention + layers x per-layer overhead + TP all-reduces; attention
        reads every request's KV cache at the runtime's attention bandwidth (attention_bandwidth_efficiency, else
        bandwidth_efficiency, of the GPU's), and no faster for one request than
        ``attention_request_bandwidth`` (a lone long request leaves most of the GPU idle), where the runtime sets it;
        verification may read it more than once (verify_attention_reads).
        """
        r, m, g = self.runtime, self.model, self.gpu
        if "eager_floor" in r:
            return r["eager_floor"] + r["eager_slope"] * max(0, tokens - r["eager_knee_tokens"])
        bw = g["bandwidth"] * r["bandwidth_efficiency"] * self.tp
        flops = g["flops"] * r["compute_efficiency"] * self.tp
        roofline = max(self._bytes_read(tokens) / bw, 2 * m["active_params"] * tokens / flops)
        # a verify step (several tokens per request) reads each request's KV cache 1 + verify_attention_reads
        # times, whatever its width (measured: SGLang's DFlash rounds grow with the context alike at widths 8-32)
        width = tokens / len(contexts) if contexts else 1.0
        reads = 1.0 + (r.get("verify_attention_reads", 0.0) if width > 1 else 0.0)
        kv_bw = g["bandwidth"] * r.get("attention_bandwidth_efficiency", r["bandwidth_efficiency"]) * self.tp
        attention = reads * sum(contexts) * m["kv_bytes_per_token"] / kv_bw
        if r.get("attention_request_bandwidth") and contexts:
            # one request's reads are parallel over its verified tokens too, so they may cost less than the
            # batch's (verify_request_attention_reads, where the runtime sets it)
            request_reads = 1.0 + (r.get("verify_request_attention_reads", reads - 1.0) if width > 1 else 0.0)
            attention = max(attention, request_reads * max(contexts) * m["kv_bytes_per_token"]
                            / (r["attention_request_bandwidth"] * self.tp))
        fixed = m["layers"] * r["layer_overhead"]
        comm = 2 * m["layers"] * r["allreduce_latency"] * math.log2(self.tp) if self.tp > 1 else 0.0
        return roofline + attention + fixed + comm

    def cpu_seconds(self, decoding: Decoding, batch: int) -> float:
        """CPU work of one step: scheduling and sampling (cpu_step), plus, for a speculative round, its
        per-request bookkeeping (spec_cpu_per_request x batch), plus with the DDTree rank probe its walk
        (rank_probe_cpu_per_request x batch)."""
        r = self.runtime
        seconds = r.get("cpu_step", r.get("no_overlap_penalty", 0.0))
        if decoding.probes_ranks():  # the rank probe's per-request walk in Python
            seconds += r.get("rank_probe_cpu_per_request", 0.0) * batch
        return seconds + (r.get("spec_cpu_per_request", 0.0) * batch if decoding.algorithm != "ar" else 0.0)

    def decode_step(self, decoding: Decoding, contexts: list[int]) -> float:
        """Seconds for one decode/verify step of a batch with these context lengths.

        step = GPU + exposed CPU, GPU = verify(width x batch tokens) + drafter (its share of a target pass over
        the same tokens) + for DDTree its tree mask read per layer (nodes x (context + nodes) bytes) and, in tree
        mode, tree construction (per node) + hybrid-model tree penalty + with the rank probe its top-32 over the
        drafter's logits (batch x (block - 1) x vocab x 4 bytes). The overlap scheduler prepares the
        next step on the CPU while the GPU runs this one, so only CPU work longer than the GPU's shows; without
        it (and for DDTree, which runs without it) all of it adds.
        """
        if not contexts:
            return 0.0
        r = self.runtime
        width = decoding.verify_width()
        gpu = self.verify_seconds(width * len(contexts), contexts)
        if decoding.algorithm != "ar":
            drafted = width * len(contexts) if r.get("drafter_per_token") else len(contexts)
            gpu += r["drafter_fraction"] * self.verify_seconds(drafted, [0] * len(contexts))
            if decoding.algorithm == "ddtree":
                # the triton kernel reads the request's custom tree mask in every layer (one byte per node and
                # key: nodes x (context + nodes)); the heap that builds a tree costs per node (a chain has none)
                if "bandwidth_efficiency" in r:  # a roofline runtime (SGLang's), not the paper's eager one
                    mask_bytes = sum(width * (c + width) for c in contexts) * self.model["layers"]
                    gpu += mask_bytes / (self.gpu["bandwidth"] * r["bandwidth_efficiency"] * self.tp)
                if decoding.tree_shape()[0] == "tree":
                    gpu += r["tree_build_per_node"] * decoding.budget * len(contexts)
                if decoding.probes_ranks():  # top-32 over the drafter's float32 logits at every depth
                    logits = len(contexts) * (decoding.block_size - 1) * self.model.get("vocab", 151936) * 4
                    gpu += logits / (self.gpu["bandwidth"] * r.get("bandwidth_efficiency", 1.0) * self.tp)
                if self.model["hybrid"]:
                    gpu += r.get("hybrid_tree_per_node", 0.0) * max(0, width - 8) * len(contexts)
        cpu = self.cpu_seconds(decoding, len(contexts))
        if decoding.overlap and decoding.algorithm != "ddtree":
            return max(gpu, cpu) if "cpu_step" in r else gpu
        return gpu + cpu

    def prefill(self, new_tokens: int, attention_pairs: float = 0.0) -> float:
        """Seconds to prefill ``new_tokens`` prompt tokens (compute-bound): 2 x params x tokens / (flops x e), plus
        causal attention where the runtime sets attention_compute_efficiency: 4 x layers x q_dim x pairs /
        (flops x e_attention), pairs = sum over requests of new x cached + new^2 / 2 (query-key pairs), plus the
        runtime's prefill_fixed per prefill step (kernel launches without CUDA graphs)."""
        if new_tokens <= 0:
            return 0.0
        r, m, g = self.runtime, self.model, self.gpu
        efficiency = r.get("compute_efficiency", 0.4)
        seconds = 2 * m["active_params"] * new_tokens / (g["flops"] * efficiency * self.tp) + r.get("prefill_fixed", 0.0)
        if attention_pairs and r.get("attention_compute_efficiency") and m.get("q_dim"):
            seconds += (4 * m["layers"] * m["q_dim"] * attention_pairs
                        / (g["flops"] * r["attention_compute_efficiency"] * self.tp))
        return seconds
