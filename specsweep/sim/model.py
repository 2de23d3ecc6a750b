"""The simulated model: what the target generates, what the drafter proposes, what a step costs.

Everything here is deterministic for a given prompt, method and seed. Numbers
produced with it are simulated and labelled so everywhere.

Acceptance comes from the text: the drafter's per-depth top-1 probability
grows with how predictable the context is (code and JSON symbols, repeated
tokens) and drops with thinking mode and temperature. Per verify round the
drafter yields, for each depth of the block, a distribution over ranked
candidates; the target's token is drawn from that distribution (a calibrated
drafter). DFlash accepts the longest prefix of rank-0 tokens; DDTree builds
the best-first tree of the B most probable prefixes (top-k capped per depth)
and walks it from the root along the target's tokens. Both add the bonus token.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from dataclasses import dataclass
from functools import lru_cache

from ..text import split_tokens

# Hardware profiles (vendor datasheets): memory bandwidth B/s, dense bf16 FLOP/s.
GPUS = {
    "H100": {"bandwidth": 3.35e12, "flops": 990e12},
    "H200": {"bandwidth": 4.8e12, "flops": 990e12},
    "B200": {"bandwidth": 8.0e12, "flops": 2250e12},
    "RTX-PRO-6000": {"bandwidth": 1.8e12, "flops": 500e12},
}

# Model profiles: weight bytes read per step, active parameters, layers,
# KV-cache bytes per token of context, and whether layers are recurrent (hybrid).
MODELS = {
    "qwen3-8b": {"weight_bytes": 16.4e9, "active_params": 8.2e9, "layers": 36, "kv_bytes_per_token": 147e3, "hybrid": False},
    "qwen3-30b-a3b": {"weight_bytes": 61e9, "active_params": 3.3e9, "layers": 48, "kv_bytes_per_token": 98e3, "hybrid": False},
    "hybrid-27b": {"weight_bytes": 54e9, "active_params": 27e9, "layers": 64, "kv_bytes_per_token": 64e3, "hybrid": True},
}

# Efficiency of real kernels against the datasheet roofline.
BANDWIDTH_EFFICIENCY = 0.85
COMPUTE_EFFICIENCY = 0.6
DRAFTER_FRACTION = 0.18  # drafter forward / target decode step at batch 1
ALLREDUCE_SECONDS = 12e-6  # per all-reduce, two per layer under TP
NO_OVERLAP_SECONDS = 1.2e-3  # CPU scheduling time exposed per step without the overlap scheduler
TREE_BUILD_SECONDS_PER_NODE = 2e-6  # best-first heap per request per node
CANDIDATES_PER_DEPTH = 32  # ranked candidates the drafter distribution covers


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


_STRUCTURE = set("{}[]()<>:;=\"',._-/#*+|\\`")


def predictability(text: str) -> float:
    """Share of the context a drafter can predict well, in [0, 1].

    Structure symbols (code and JSON syntax) and repeated tokens raise it.
    """
    tokens = split_tokens(text[-6000:])
    if not tokens:
        return 0.0
    stripped = [t.strip() for t in tokens]
    symbols = sum(1 for t in stripped if t and t[0] in _STRUCTURE) / len(stripped)
    repeated = 1.0 - len(set(stripped)) / len(stripped)
    return max(0.0, min(1.0, 0.9 * symbols + 0.6 * repeated))


def top1_probability(text: str, temperature: float, thinking: bool) -> float:
    """The drafter's per-depth top-1 acceptance probability for a context."""
    a = 0.66 + 0.42 * predictability(text)
    if thinking:
        a *= 0.45
    if temperature > 0:
        a *= 1.0 / (1.0 + 0.35 * temperature)
    return max(0.05, min(0.95, a))


def depth_distribution(a: float, depth: int) -> list[float]:
    """Probabilities of the ranked candidates at a depth of the block (rank 0 first).

    Top-1 mass decays slightly with depth; the rest falls geometrically over
    the following ranks; what is left over lies outside every candidate list.
    """
    q = a * (0.995 ** depth)
    rest = 1.0 - q
    ratio = 0.55
    probs = [q] + [rest * (1 - ratio) * ratio ** (r - 1) for r in range(1, CANDIDATES_PER_DEPTH)]
    return probs


@lru_cache(maxsize=4096)
def build_tree(a_key: float, depths: int, budget: int, topk: int) -> frozenset:
    """DDTree: the ``budget`` most probable prefixes, best first (a heap of prefixes).

    Pop the best prefix, push its next sibling and its first child; per-depth
    candidates capped at ``topk``. Returns the set of prefixes (tuples of ranks).
    """
    dists = [[math.log(p) for p in depth_distribution(a_key, d)[:topk]] for d in range(depths)]
    tree: set = set()
    heap = [(-dists[0][0], (0,))]
    while heap and len(tree) < budget:
        neg, prefix = heapq.heappop(heap)
        tree.add(prefix)
        depth, rank = len(prefix) - 1, prefix[-1]
        if rank + 1 < len(dists[depth]):  # next sibling
            sibling = prefix[:-1] + (rank + 1,)
            heapq.heappush(heap, (neg + dists[depth][rank] - dists[depth][rank + 1], sibling))
        if depth + 1 < depths:  # first child
            heapq.heappush(heap, (neg - dists[depth + 1][0], prefix + (0,)))
    return frozenset(tree)


@dataclass(frozen=True)
class Decoding:
    """How the simulated server decodes: algorithm and its parameters."""

    algorithm: str = "ar"  # ar | dflash | ddtree
    block_size: int = 16
    budget: int = 0
    topk: int = 8
    overlap: bool = True

    def verify_width(self) -> int:
        """Tokens verified per request per step: 1 (AR), block (DFlash), budget + 1 (DDTree)."""
        if self.algorithm == "dflash":
            return self.block_size
        if self.algorithm == "ddtree":
            return self.budget + 1
        return 1


def accepted_tokens(decoding: Decoding, a: float, rng: random.Random) -> int:
    """Tokens committed by one verify round (accepted drafts + bonus token)."""
    if decoding.algorithm == "ar":
        return 1
    depths = decoding.block_size - 1
    ranks = []
    for d in range(depths):
        probs = depth_distribution(a, d)
        u, r = rng.random(), 0
        while r < len(probs) and u >= probs[r]:
            u -= probs[r]
            r += 1
        ranks.append(r)  # r == len(probs): outside every candidate list
    if decoding.algorithm == "dflash":
        accepted = 0
        while accepted < depths and ranks[accepted] == 0:
            accepted += 1
        return accepted + 1
    tree = build_tree(round(a, 3), depths, decoding.budget, decoding.topk)
    accepted = 0
    while accepted < depths and tuple(ranks[: accepted + 1]) in tree:
        accepted += 1
    return accepted + 1


def reply_tokens(prompt: str, max_new_tokens: int) -> tuple[list[str], bool]:
    """The target's greedy reply to a prompt: tokens and whether it stopped by itself.

    Deterministic per prompt and independent of the decoding method (lossless).
    The reply reuses the prompt's own vocabulary, so its content resembles it.
    """
    rng = random.Random(_seed("reply", prompt))
    natural = rng.randint(max(8, max_new_tokens // 5), max(9, int(max_new_tokens * 1.1)))
    length = min(natural, max_new_tokens)
    vocab = [t for t in split_tokens(prompt[-4000:]) if t.strip()] or [" ok"]
    out, i = [], rng.randrange(len(vocab))
    for _ in range(length):
        if rng.random() < 0.7:  # continue the current run of prompt text
            i = (i + 1) % len(vocab)
        else:
            i = rng.randrange(len(vocab))
        tok = vocab[i]
        out.append(tok if tok[0].isspace() or not tok[0].isalnum() else " " + tok)
    return out, natural <= max_new_tokens


@dataclass(frozen=True)
class CostModel:
    """Time of one engine step for a hardware and model profile under tensor parallelism."""

    gpu: str = "H200"
    model: str = "qwen3-8b"
    tp: int = 1

    def _hw(self):
        return GPUS[self.gpu], MODELS[self.model]

    def decode_step(self, decoding: Decoding, contexts: list[int]) -> float:
        """Seconds for one decode/verify step of a batch with these context lengths.

        step = drafter + max(weights / bandwidth, 2 * params * tokens / flops)
               + KV reads of the contexts + TP all-reduces + tree build + scheduling
        """
        if not contexts:
            return 0.0
        gpu, model = self._hw()
        bw = gpu["bandwidth"] * BANDWIDTH_EFFICIENCY * self.tp
        flops = gpu["flops"] * COMPUTE_EFFICIENCY * self.tp
        width = decoding.verify_width()
        tokens = width * len(contexts)
        weights = model["weight_bytes"] / bw
        verify = max(weights, 2 * model["active_params"] * tokens / flops)
        verify += sum(contexts) * model["kv_bytes_per_token"] / bw
        comm = 2 * model["layers"] * ALLREDUCE_SECONDS if self.tp > 1 else 0.0
        total = verify + comm
        if decoding.algorithm != "ar":
            total += DRAFTER_FRACTION * (weights + comm)
            if model["hybrid"] and decoding.algorithm == "ddtree":
                total += 0.4e-3 * max(0, width - 8) / 8 * len(contexts)  # per-node recurrent state
            if decoding.algorithm == "ddtree":
                total += TREE_BUILD_SECONDS_PER_NODE * decoding.budget * len(contexts)
        if not decoding.overlap or decoding.algorithm == "ddtree":
            total += NO_OVERLAP_SECONDS
        return total

    def prefill(self, new_tokens: int) -> float:
        """Seconds to prefill ``new_tokens`` prompt tokens (compute-bound)."""
        if new_tokens <= 0:
            return 0.0
        gpu, model = self._hw()
        flops = gpu["flops"] * COMPUTE_EFFICIENCY * self.tp
        return 2 * model["active_params"] * new_tokens / flops
