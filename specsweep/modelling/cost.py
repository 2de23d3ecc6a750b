"""The cost model: the time of one engine step (decode, verify, draft, prefill) for a GPU, model and runtime
profile under tensor parallelism, and the bounds of every runtime parameter.

One model of mechanisms for every serving runtime: a runtime profile (sim_profiles.yaml ``runtimes:``, a calibration)
is this model with stated values. Each parameter (RUNTIME_BOUNDS) prices one mechanism of a real engine (its
``reason``) and follows the GPU one way (its ``scales``, SCALES): shares of the datasheet bandwidth and flops make
the GPU-bound work (weights, KV cache, GEMMs) scale with the GPU's specifications; fixed GPU-side costs (a layer's
small kernels, a draft step's launch, a request's acceptance kernels) are latency-bound and stay as measured on every
GPU; host-bound costs (the scheduler, Python per request, NGRAM's CPU lookup, the HTTP server) are the host's and do
not scale with the GPU at all; counts and shares of the model's own work (extra KV reads, a drafter's share of a
target pass) are priced at the GPU's rates. The generic runtime ``sglang`` is the transferable form of the fit to
SGLang 0.5.16 on an H200 (benchmarks/gpu/step_costs.py generic derives it from the records).

Numbers produced with it are modelled, and labelled so everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import algorithms
from .decoding import Decoding
from .profiles import ALLREDUCE_LATENCY_MAX, profiles


CHUNKED_PREFILL_SIZE = 8192  # new prompt tokens a prefill step takes at most, as SGLang 0.5.16 picks on an H200
NGRAM_TRIE_DEPTH = 18  # SGLang 0.5.16's --speculative-ngram-max-trie-depth: the longest n-gram its trie keeps
NGRAM_TRIE_CAPACITY = 10_000_000  # its --speculative-ngram-capacity: trie nodes at most (least recently used evicted)


def ngram_trie_tokens(prompts: list[int], generated: list[int]) -> float:
    """Tokens NGRAM's trie holds for these requests in flight (their prompt lengths and tokens generated so far):
    sum of min(prompt, NGRAM_TRIE_DEPTH) + generated, at most NGRAM_TRIE_CAPACITY / NGRAM_TRIE_DEPTH (a token
    brings up to NGRAM_TRIE_DEPTH nodes). SGLang 0.5.16 inserts each round a request's last NGRAM_TRIE_DEPTH
    tokens, so its prompt's body never reaches the trie, only its tail and what it generates. SGLang keeps finished
    requests' n-grams too, until the capacity evicts them: this counts the requests in flight, a lower bound."""
    held = sum(min(p, NGRAM_TRIE_DEPTH) + g for p, g in zip(prompts, generated))
    return float(min(held, NGRAM_TRIE_CAPACITY // NGRAM_TRIE_DEPTH))


# How a runtime parameter's cost follows the GPU it prices (Bound.scales): what makes the generic runtime, fitted on
# one GPU, a model of another.
SCALES = {
    "bandwidth": "a share of the GPU's datasheet memory bandwidth: the seconds it prices scale as 1 / bandwidth",
    "flops": "a share of the GPU's datasheet bf16 flops: the seconds it prices scale as 1 / flops",
    "gpu-fixed": (
        "seconds of GPU work bound by kernel launch and latency, not by bandwidth or flops (a few small kernels a "
        "layer, a request or a node): as measured, on every GPU (not scaled: the clocks and launch latency of the "
        "datacenter GPUs profiled differ by less than the fit's scatter, and no datasheet figure predicts them)"
    ),
    "interconnect": (
        "seconds a collective takes over the GPUs' links: the GPU profile's own allreduce_latency where it states one "
        "(its links: PCIe rather than NVLink), else the runtime's, as measured or estimated"
    ),
    "host": "seconds of CPU work (Python, the scheduler, the HTTP server): the host's, whatever the GPU",
    "shape": (
        "a count or share of the model's own work (extra reads, a drafter's share of a target pass): the work it "
        "names is priced at the GPU's rates, so it scales with them"
    ),
}


@dataclass(frozen=True)
class Bound:
    """One runtime parameter: its physically sensible range low <= value <= high, in ``unit``; ``positive``:
    above 0 too (a rate or share the cost model divides by); ``reason``: the mechanism it prices (why a real
    engine has it); ``scales``: how its cost follows the GPU (a key of SCALES)."""

    low: float
    high: float
    unit: str
    positive: bool = False
    reason: str = ""
    scales: str = "shape"

    def problem(self, value) -> str | None:
        """Why ``value`` is not a value of this parameter, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{value!r} is not a finite number"
        if self.positive and value <= 0:
            return f"{value!r} must be above 0 (the cost model divides by it)"
        if not self.low <= value <= self.high:
            return f"{value!r} is outside {self.low:g}..{self.high:g} {self.unit}"
        return None


def _share(reason: str, scales: str = "bandwidth") -> Bound:
    """A share of the GPU's datasheet rate (bandwidth or flops), above 0."""
    return Bound(0.0, 1.0, f"(a share of the GPU's datasheet {scales})", True, reason, scales)


# Every parameter a runtime profile may hold, with the range a real engine's value lies in (the measured ones,
# sim_profiles.yaml, sit one or two orders of magnitude inside, so that a bound is met only by a value no engine has:
# a request latency of seconds, a step cost of 1e9 s, a rate of 0), the mechanism it prices and how its cost follows
# the GPU (SCALES). The CostModel methods below say where each enters a step.
RUNTIME_BOUNDS = {
    "bandwidth_efficiency": _share(
        "weights streamed from HBM once a step: the share of the datasheet bandwidth a large device read reaches"
    ),
    "compute_efficiency": _share(
        "the weights' GEMMs over a step's tokens (prefill, wide verifies): the share of the datasheet flops a "
        "large bf16 GEMM reaches",
        "flops",
    ),
    "attention_bandwidth_efficiency": _share(
        "the KV cache read by the attention kernel (paged, split over heads and pages): a lower share than a "
        "plain weight read"
    ),
    "attention_compute_efficiency": Bound(
        0.0,
        1.0,
        "(a share of the GPU's flops; 0: no attention term)",
        False,
        "a prefill's causal attention (query-key pairs of the new tokens): a share of the flops",
        "flops",
    ),
    "attention_request_efficiency": Bound(
        0.0,
        1.0,
        "(a share of the GPU's datasheet bandwidth; 0: no per-request bound)",
        False,
        "one request's KV read runs on the few thread blocks its pages split into, so a lone long request reads "
        "no faster than this share of the bandwidth (the rest of the GPU idles)",
        "bandwidth",
    ),
    "attention_request_bandwidth": Bound(
        0.0,
        1e14,
        "bytes/s a GPU (0: no per-request bound)",
        False,
        "attention_request_efficiency as bytes/s of the GPU it was measured on (a calibration's own GPU); where a "
        "runtime sets both, the share is used",
        "gpu-fixed",
    ),
    "moe_compute_efficiency": Bound(
        0.0,
        1.0,
        "(a share of the dense rate)",
        True,
        "a routed expert's GEMM runs over the few tokens routed to it, with its own kernel configuration: this "
        "share of the dense GEMMs' rate",
        "flops",
    ),
    "eager_bandwidth_efficiency": _share("weights read by an eager (no CUDA graphs) runtime's unfused kernels"),
    "eager_compute_efficiency": _share("an eager runtime's GEMMs", "flops"),
    "roofline_exponent": Bound(
        0.0,
        100.0,
        "(0: max(read, compute))",
        False,
        "reading the weights and computing with them overlap less than fully where the two are close (a verify of "
        "a few hundred tokens): the soft roofline's exponent",
    ),
    "layer_overhead": Bound(
        0.0,
        1e-3,
        "seconds a layer",
        False,
        "a decoder layer's small kernels (norms, rotary, activation, residual adds) and launch gaps within the "
        "CUDA graph: fixed per layer and step, whatever the batch",
        "gpu-fixed",
    ),
    "moe_layer_overhead": Bound(
        0.0,
        1e-3,
        "seconds a MoE layer",
        False,
        "a MoE layer's routing, top-k, sorting of tokens by expert and grouped-GEMM launches, a step",
        "gpu-fixed",
    ),
    "allreduce_latency": Bound(
        0.0,
        ALLREDUCE_LATENCY_MAX,
        "seconds an all-reduce step",
        False,
        "under TP two all-reduces a layer (attention and MLP outputs), each log2(tp) latency-bound steps over the "
        "links; a drafter's forwards pay their own",
        "interconnect",
    ),
    "eager_layer_launch": Bound(
        0.0,
        1e-2,
        "seconds a layer",
        False,
        "an eager runtime launches each layer's kernels one by one from Python: launch-bound, whatever the GPU",
        "host",
    ),
    "eager_kv_passes": Bound(
        0.0, 1000.0, "reads of the KV cache a step", False, "the eager path copies and re-reads its KV cache a step"
    ),
    "eager_score_bytes": Bound(
        0.0,
        1e5,
        "bytes a query-key pair a layer",
        False,
        "the eager path materialises every query-key score and its dense mask",
    ),
    "drafter_fraction": Bound(
        0.0,
        2.0,
        "of a target step",
        False,
        "a block drafter's (DFlash's) forward over its drafted tokens, as a share of the target's pass over them: "
        "its few layers at the target's width",
    ),
    "drafter_prefill_fraction": Bound(
        0.0,
        2.0,
        "of the target's prefill",
        False,
        "a block drafter extends its own cache over the prompt: a share of the target's prefill work",
    ),
    "drafter_prefill_fixed": Bound(
        0.0, 1.0, "seconds a prefill step", False, "the drafter's extend launches, a prefill step", "gpu-fixed"
    ),
    "prefill_fixed": Bound(
        0.0,
        1.0,
        "seconds a prefill step",
        False,
        "a prefill step's kernel launches without CUDA graphs (prefill runs eager) and its scheduling",
        "gpu-fixed",
    ),
    "verify_attention_reads": Bound(
        0.0,
        100.0,
        "extra KV reads a verify step",
        False,
        "a verify of several tokens a request reads the request's KV cache again for its query tiles (and its tree "
        "mask), beyond a decode step's one read",
    ),
    "verify_request_attention_reads": Bound(
        0.0,
        100.0,
        "extra KV reads a verify step",
        False,
        "the same for a lone request's bound (attention_request_*): its reads spread over its verified tokens",
    ),
    "draft_attention_reads": Bound(
        0.0, 100.0, "extra KV reads a drafter forward", False, "a drafter forward over several tokens a request"
    ),
    "shared_kv_reads": Bound(
        0.0,
        1.0,
        "(a share of a KV page's read)",
        False,
        "a KV page two requests of a batch read (one copy in the radix cache) costs the second this share; the "
        "rest hits the GPU's L2",
    ),
    "cpu_step": Bound(
        0.0,
        0.1,
        "seconds a step",
        False,
        "the scheduler's work a step (batch assembly, sampling's host side, output processing): hidden by the "
        "overlap scheduler up to the GPU's step, exposed without it",
        "host",
    ),
    "no_overlap_penalty": Bound(
        0.0, 0.1, "seconds a step", False, "cpu_step's older name: CPU work a step exposed", "host"
    ),
    "spec_cpu_per_request": Bound(
        0.0,
        1e-2,
        "seconds a request a round",
        False,
        "a speculative round's per-request bookkeeping in Python (acceptance, cache indices): hidden as cpu_step",
        "host",
    ),
    "rank_probe_cpu_per_request": Bound(
        0.0, 1e-2, "seconds a request a round", False, "DDTree's rank probe: ranks to Python lists and the walk", "host"
    ),
    "verify_per_request": Bound(
        0.0,
        1e-2,
        "seconds a request a round",
        False,
        "GPU work a request of every speculative round: its acceptance walk and sampling over its drafted tokens "
        "(small kernels a request)",
        "gpu-fixed",
    ),
    "tree_build_per_node": Bound(
        0.0, 1e-3, "seconds a tree node", False, "DDTree's best-first heap that builds a tree, a node", "gpu-fixed"
    ),
    "tree_topk_fixed": Bound(
        0.0,
        1e-2,
        "seconds a round",
        False,
        "a DDTree build that ranks candidates at every depth runs a top-k over the drafter's per-depth distributions "
        "(the vocabulary, block_size - 1 depths a request; the stage profiler's draft_head_topk): its launches and "
        "the part of a round's sort that does not grow with the batch",
        "gpu-fixed",
    ),
    "tree_topk_per_request": Bound(
        0.0,
        1e-3,
        "seconds a request a round",
        False,
        "the same top-k's work a request: block_size - 1 rows of the vocabulary sorted for their best candidates",
        "gpu-fixed",
    ),
    "tree_verify_per_node": Bound(
        0.0,
        1e-4,
        "seconds a verified tree node of a request",
        False,
        "a tree's verify beyond the roofline's work a token: the tree-attention kernel runs each node against its "
        "request's context and the tree's own keys under the custom mask, a node at a time per request, so a wider "
        "tree costs more a node than a chain of the same tokens (the stage profiler's target_verify grows so)",
        "gpu-fixed",
    ),
    "tree_round_fixed": Bound(
        0.0,
        1e-2,
        "seconds a round",
        False,
        "a DDTree round's work beyond its stages that the overlap scheduler does not hide: the next verify batch "
        "cannot be prepared before the drafter's tree exists, so the host's preparation of it (positions and KV "
        "slots for budget + 1 tokens a request, the tree's verify inputs) runs between the stages",
        "host",
    ),
    "tree_round_per_request": Bound(
        0.0,
        1e-3,
        "seconds a request a round",
        False,
        "the same exposed work a request: its tree's verify inputs and cache slots, and its accepted path's "
        "bookkeeping",
        "host",
    ),
    "hybrid_tree_per_node": Bound(
        0.0,
        1e-2,
        "seconds a tree node",
        False,
        "hybrid models: the recurrent state of a tree node beyond the 8 a fused kernel takes",
        "gpu-fixed",
    ),
    "draft_step_overhead": Bound(
        0.0,
        0.1,
        "seconds a drafter forward",
        False,
        "each draft step of a draft model's loop: its own graph launch, sampling and top-k, whatever its size",
        "gpu-fixed",
    ),
    "draft_layer_overhead": Bound(
        0.0, 1e-3, "seconds a drafter layer", False, "a drafter layer's small kernels, as layer_overhead", "gpu-fixed"
    ),
    "draft_per_request": Bound(
        0.0,
        1e-2,
        "seconds a request a round",
        False,
        "a draft model's per-request work a round beside its forwards (its candidates, its cache)",
        "gpu-fixed",
    ),
    "draft_tree_per_node": Bound(
        0.0,
        1e-3,
        "seconds a tree node",
        False,
        "choosing a draft tree's nodes from topk^2 candidates a step, a node",
        "gpu-fixed",
    ),
    "ngram_step_overhead": Bound(
        0.0,
        0.1,
        "seconds a round",
        False,
        "NGRAM's lookup between two rounds (it needs the last round's tokens, so no scheduler hides it)",
        "host",
    ),
    "ngram_cpu_per_request": Bound(
        0.0, 1e-2, "seconds a request a round", False, "NGRAM's trie match for a request, on the CPU", "host"
    ),
    "ngram_cpu_per_node": Bound(
        0.0, 1e-3, "seconds a tree node", False, "NGRAM's tree mask built on the CPU, a node", "host"
    ),
    "ngram_cpu_per_trie_token": Bound(
        0.0,
        1e-6,
        "seconds a request a round, per token the trie holds",
        False,
        "NGRAM's match and insert for a request walk the shared trie's hash maps and LRU lists (SGLang 0.5.16's "
        "C++ trie, every request's prompt tail and output as n-grams of up to 18 tokens): the more the trie holds, "
        "the more of each walk misses the CPU's caches (ngram_trie_tokens says what it holds)",
        "host",
    ),
    "request_latency": Bound(
        0.0,
        1.0,
        "seconds a request",
        False,
        "a request outside the engine's steps: the HTTP server, tokenizer and detokenizer hand-offs",
        "host",
    ),
    "request_latency_per_token": Bound(
        0.0, 1e-3, "seconds a prompt token", False, "tokenizing a prompt and handing it over, a token", "host"
    ),
    "startup_seconds": Bound(
        0.0,
        3600.0,
        "seconds from launch to ready",
        False,
        "loading weights and capturing CUDA graphs before the first request (as measured)",
        "host",
    ),
}


RUNTIME_FLAGS = ("drafter_per_token",)  # true or false


# the parameters each kind of runtime reads unconditionally: the roofline's (SGLang's) and the eager one's (hf-eager,
# a runtime with eager_layer_launch); every other parameter counts as 0 (or off) where a runtime does not set it
REQUIRED_RUNTIME = {
    "roofline": (
        "bandwidth_efficiency",
        "compute_efficiency",
        "layer_overhead",
        "allreduce_latency",
        "drafter_fraction",
        "tree_build_per_node",
    ),
    "eager": (
        "eager_layer_launch",
        "eager_bandwidth_efficiency",
        "eager_compute_efficiency",
        "eager_kv_passes",
        "eager_score_bytes",
        "drafter_fraction",
        "tree_build_per_node",
    ),
}


def runtime_problems(runtime) -> list[str]:
    """Why a runtime profile cannot price a step, one "<parameter>: why" each (empty when it can): a parameter the
    cost model does not know, a value outside its RUNTIME_BOUNDS (or a flag not true or false), a parameter its
    kind of runtime (REQUIRED_RUNTIME: eager where it sets eager_layer_launch, else roofline) needs and lacks."""
    if not isinstance(runtime, dict) or not runtime:
        return ["missing or not a mapping of a runtime profile"]
    out = []
    for key, value in runtime.items():
        if key in RUNTIME_FLAGS:
            if not isinstance(value, bool):
                out.append(f"{key}: {value!r} is not true or false")
        elif key not in RUNTIME_BOUNDS:
            out.append(f"{key}: not a runtime parameter of the cost model (specsweep/modelling/cost.py RUNTIME_BOUNDS)")
        elif (why := RUNTIME_BOUNDS[key].problem(value)) is not None:
            out.append(f"{key}: {why}")
    kind = "eager" if "eager_layer_launch" in runtime else "roofline"
    missing = [key for key in REQUIRED_RUNTIME[kind] if key not in runtime]
    if missing:
        others = f", as are {', '.join(missing[1:])}" if missing[1:] else ""
        out.append(f"{missing[0]}: missing{others} (a {kind} runtime needs {', '.join(REQUIRED_RUNTIME[kind])})")
    return out


def cost_term_problems(terms: dict) -> list[str]:
    """Why a DDTree build's own round costs (its ``costs``: runtime parameters) cannot price its rounds, one
    "<parameter>: why" each (empty when they can): a parameter RUNTIME_BOUNDS does not know, a value outside its
    bounds."""
    out = []
    for key, value in terms.items():
        why = (
            RUNTIME_BOUNDS[key].problem(value) if key in RUNTIME_BOUNDS else "not a runtime parameter of the cost model"
        )
        if why is not None:
            out.append(f"{key}: {why}")
    return out


@dataclass(frozen=True)
class CostModel:
    """Time of one engine step for a hardware, model and runtime profile under tensor parallelism.

    ``draft_model``: the model profile of a standalone drafter (sim.draft_model_profile); EAGLE heads are sized
    from the target's profile (``draft_head``)."""

    gpu: dict
    model: dict
    runtime: dict
    tp: int = 1
    draft_model: dict | None = None
    # charge a DDTree build's own round costs (its entry's ``costs``) over the runtime's: with_build_costs
    build_costs: bool = True

    @classmethod
    def named(
        cls,
        gpu: str,
        model: str,
        runtime: str = "sglang",
        tp: int = 1,
        overrides: dict | None = None,
        draft_model: str | None = "qwen3-0.6b",
    ):
        p = profiles(overrides)
        return cls(
            p["gpus"][gpu],
            p["models"][model],
            p["runtimes"][runtime],
            tp,
            p["models"][draft_model] if draft_model else None,
        )

    def with_build_costs(self, decoding: Decoding) -> CostModel:
        """The cost model that prices this decoding's rounds: for a DDTree build whose entry states its own round
        costs (specsweep/data/ddtree_builds.yaml ``costs``: runtime parameters measured on that build), the runtime
        with those values over its own; itself otherwise, and where ``build_costs`` is off (the runtime's alone)."""
        build = decoding.tree_build_of()
        terms = build.cost_terms() if build is not None and self.build_costs else {}
        if all(self.runtime.get(k) == v for k, v in terms.items()):
            return self
        return CostModel(self.gpu, self.model, {**self.runtime, **terms}, self.tp, self.draft_model, self.build_costs)

    def tree_round_seconds(self, decoding: Decoding, batch: int) -> dict[str, float]:
        """A DDTree round's own terms, in seconds, where it builds a tree (all 0 for any other round, and each 0
        where the runtime, with the build's costs (with_build_costs), does not set it):
        topk = tree_topk_fixed + tree_topk_per_request x batch (ranking the drafter's per-depth candidates);
        verify = tree_verify_per_node x verify width x batch (the tree's verify beyond the roofline's);
        exposed = tree_round_fixed + tree_round_per_request x batch (the round's work the overlap scheduler does not
        hide)."""
        if not decoding.builds_tree():
            return dict.fromkeys(("topk", "verify", "exposed"), 0.0)
        r = self.runtime
        return {
            "topk": r.get("tree_topk_fixed", 0.0) + r.get("tree_topk_per_request", 0.0) * batch,
            "verify": r.get("tree_verify_per_node", 0.0) * decoding.verify_width() * batch,
            "exposed": r.get("tree_round_fixed", 0.0) + r.get("tree_round_per_request", 0.0) * batch,
        }

    def draft_head(self, fused_layers: int = 0) -> dict:
        """A draft head's model profile from the target's (an EAGLE head, an MTP head), sized from the target's own
        dims (its config.json's, required of every model profile: profiles.MODEL_DIMS): one decoder layer (its
        weights the target's per layer, experts counted as one token reads them; its KV a full-attention layer's,
        2 x kv_dim x 2 bytes a token) and an LM head of vocab x hidden_size in bf16; a head that fuses the hidden
        states of ``fused_layers`` of the target's layers (the algorithm's declared DraftModel.fused_layers:
        EAGLE-3's three) adds fused_layers x hidden_size x hidden_size to its input projection."""
        m = self.model
        hidden = m["hidden_size"]
        head = m["vocab"] * hidden * 2 + fused_layers * hidden * hidden * 2
        layer = (
            m["weight_bytes"]
            - m.get("expert_bytes", 0.0) * (1 - m.get("experts_per_token", 0) / max(m.get("experts", 1), 1))
        ) / m["layers"]
        return {
            "weight_bytes": layer + head,
            "active_params": (layer + head) / 2,
            "layers": 1,
            "kv_bytes_per_token": 2 * m["kv_dim"] * 2,
            "hidden_size": hidden,
            "q_dim": m["q_dim"],
            "kv_dim": m["kv_dim"],
            "vocab": m["vocab"],
            "hybrid": False,
        }

    def draft_seconds(self, decoding: Decoding, contexts: list[int]) -> float:
        """GPU time of one round's drafting.

        Block drafters (DFlash, DDTree): drafter_fraction x a pass of the target as a dense model of its active size
        (dense_equivalent: the drafter reads no experts) over the drafted tokens (the block per request where
        drafter_per_token, else one; a DDTree tree is built from that one pass, whatever its budget).
        Draft models (SGLang's EAGLE worker): one forward over the num_steps + 1 tokens a round can accept (the
        draft extend, whose output is the first step's candidates), then num_steps - 1 forwards over topk tokens a
        request; each forward the drafter's own cost on this GPU (with
        the runtime's draft_layer_overhead and draft_attention_reads where it sets them) plus draft_step_overhead.
        NGRAM: none (its lookup runs on the CPU, see decode_step)."""
        r, batch, kind = self.runtime, len(contexts), decoding.spec.drafting
        if kind in ("block", "block-tree"):
            drafted = decoding.block_size * batch if r.get("drafter_per_token") else batch
            return r["drafter_fraction"] * self.dense_equivalent().verify_seconds(drafted, [0] * batch)
        if kind != "draft-model":
            return 0.0
        spec = decoding.spec
        if isinstance(spec, algorithms.DraftModel) and spec.draft_model == "head":  # sized from the target
            profile: dict | None = self.draft_head(spec.fused_layers)
        else:
            profile = self.draft_model
        if profile is None:
            raise ValueError(f"{decoding.algorithm}: no draft model profile (sim.draft_model_profile)")
        own = {k: r[f"draft_{k}"] for k in ("layer_overhead", "attention_reads") if f"draft_{k}" in r}
        if "attention_reads" in own:  # a drafter forward's extra KV reads over several tokens a request
            own["verify_attention_reads"] = own["verify_request_attention_reads"] = own.pop("attention_reads")
        drafter = CostModel(self.gpu, profile, {**r, **own}, self.tp)
        overhead = r.get("draft_step_overhead", 0.0)
        topk = decoding.topk or 1
        extend = drafter.verify_seconds(batch * (decoding.num_steps + 1), contexts) + overhead
        return extend + (decoding.num_steps - 1) * (drafter.verify_seconds(batch * topk, contexts) + overhead)

    def dense_equivalent(self) -> CostModel:
        """This model as a dense one of its active size (itself where it is dense): what a block drafter's pass
        costs is a share of. A DFlash drafter is a few dense layers at the target's hidden size whatever the
        target's experts, so its pass reads no routed experts: weight_bytes becomes the bytes one token reads
        (_bytes_read(1)), the experts go."""
        if not self.model.get("experts"):
            return self
        dense = {k: v for k, v in self.model.items() if k not in ("experts", "experts_per_token", "expert_bytes")}
        return CostModel(self.gpu, {**dense, "weight_bytes": self._bytes_read(1)}, self.runtime, self.tp)

    def routed_active_params(self) -> float:
        """Parameters of the routed experts one token runs through: active_params x the routed share of the bytes
        one token reads (expert_bytes x k / E of weight_bytes - expert_bytes + expert_bytes x k / E); 0 if dense."""
        m = self.model
        if not m.get("experts"):
            return 0.0
        routed = m["expert_bytes"] * m["experts_per_token"] / m["experts"]
        return m["active_params"] * routed / (m["weight_bytes"] - m["expert_bytes"] + routed)

    def weights_compute(self, tokens: float, efficiency: float) -> float:
        """Seconds of the weights' arithmetic over ``tokens`` tokens at ``efficiency`` of the GPU's flops (x TP):
        2 x tokens x ((active_params - routed) / F + routed / (F x moe_compute_efficiency)), F = flops x efficiency
        x tp and routed = routed_active_params (0 for a dense model). A routed expert's GEMM runs over the few
        tokens routed to it: moe_compute_efficiency (the runtime's, 1 where it does not set it) of the dense rate."""
        m, r = self.model, self.runtime
        flops = self.gpu["flops"] * efficiency * self.tp
        routed = self.routed_active_params()
        seconds = 2 * (m["active_params"] - routed) * tokens / flops
        if routed:
            share = r.get("moe_compute_efficiency", 1.0)
            if share <= 0:
                raise ValueError(f"runtime profile: moe_compute_efficiency must be above 0, not {share}")
            seconds += 2 * tokens * routed / (flops * share)
        return seconds

    def experts_touched(self, tokens: float, requests: int = 1) -> float:
        """Expected routed experts per MoE layer that a step's ``tokens`` touch, spread evenly over ``requests``
        sequences (n = tokens / requests each); k for one token, never more than E. 0 for a dense model.

        Tokens of one sequence share experts more than chance (routing locality): they route within a working set
        of m = max(k, E / f) of the E experts, each token to k of them, so n tokens of one sequence touch
        D1(n) = m x (1 - (1 - k/m)^n). f is the model's expert_repeat_factor, how many times more often than
        chance two consecutive tokens pick the same first-choice expert (in this model 1/m against 1/E, so
        m = E / f); 1 (uniform routing) where the profile does not set it. Requests are independent sequences,
        each with its own working set, so their tokens share an expert only by chance:
        D = E x (1 - (1 - D1(n)/E)^requests). With f = 1 both reduce to uniform routing, E x (1 - (1 - k/E)^tokens),
        and a batch of one token per request is uniform whatever f. A working set rather than a chain from token to
        token: a step verifies one segment of a sequence, and a segment's tokens share experts throughout (segment
        routing consistency, arXiv 2505.16056); f itself is Mixtral's measured repeat (arXiv 2401.04088 Table 5,
        in sim_profiles.yaml)."""
        m = self.model
        experts, per_token = m.get("experts", 0), m.get("experts_per_token", 0)
        if not experts:
            return 0.0
        requests = max(1, requests)
        each = max(1.0, tokens / requests)
        working = min(float(experts), max(float(per_token), experts / max(1.0, m.get("expert_repeat_factor", 1.0))))
        one = working * (1.0 - (1.0 - per_token / working) ** each)
        return experts * (1.0 - (1.0 - one / experts) ** requests)

    def _bytes_read(self, tokens: int, requests: int = 1) -> float:
        """Weight bytes one step reads: all of them for a dense model; for MoE the shared weights (attention,
        embeddings, router) plus the routed experts the tokens of ``requests`` sequences touch:
        weight_bytes - expert_bytes + expert_bytes x experts_touched(tokens, requests) / E."""
        m = self.model
        if not m.get("experts"):
            return m["weight_bytes"]
        shared = m["weight_bytes"] - m["expert_bytes"]
        return shared + m["expert_bytes"] * self.experts_touched(tokens, requests) / m["experts"]

    def _eager_seconds(self, tokens: int, contexts: list[int]) -> float:
        """Target forward in HF transformers without CUDA graphs (runtime hf-eager, the DDTree paper's):
        launch + roofline + attention.

        launch = layers x eager_layer_launch (each layer's kernels launched one by one from Python: the step is
        launch-bound, whatever the GPU); roofline = max(weights read (_bytes_read) / (bandwidth x e),
        weights_compute(tokens, eager_compute_efficiency)), e = eager_bandwidth_efficiency;
        attention = sum over requests of (c x kv_bytes_per_token x eager_kv_passes + layers x n x (c + n) x
        eager_score_bytes) / (bandwidth x e), a request of context c verifying n = tokens / requests nodes: the
        eager path copies and re-reads its KV cache several times a step (the cache concatenated, K and V repeated
        for grouped-query attention) and materialises every query-key score with its dense mask (n x (c + n)
        pairs a layer). Bandwidth and flops scale with TP, the launches do not."""
        r, m, g = self.runtime, self.model, self.gpu
        bw = g["bandwidth"] * r["eager_bandwidth_efficiency"] * self.tp
        launch = m["layers"] * r["eager_layer_launch"]
        roofline = max(
            self._bytes_read(tokens, len(contexts)) / bw, self.weights_compute(tokens, r["eager_compute_efficiency"])
        )
        nodes = tokens / len(contexts) if contexts else float(tokens)
        attention_bytes = sum(
            c * m["kv_bytes_per_token"] * r["eager_kv_passes"]
            + m["layers"] * nodes * (c + nodes) * r["eager_score_bytes"]
            for c in contexts
        )
        return launch + roofline + attention_bytes / bw

    def request_bandwidth(self) -> float:
        """Bytes/s one request's KV read reaches at most on one GPU: attention_request_efficiency x the GPU's
        bandwidth where the runtime sets the share, else its attention_request_bandwidth (bytes/s of the GPU a
        calibration measured), else 0 (no per-request bound)."""
        r = self.runtime
        if r.get("attention_request_efficiency"):
            return self.gpu["bandwidth"] * r["attention_request_efficiency"]
        return r.get("attention_request_bandwidth", 0.0)

    def verify_seconds(self, tokens: int, contexts: list[int], shared: float = 0.0) -> float:
        """Target forward over ``tokens`` tokens of a batch with these context lengths (no drafter).

        roofline(weights read, compute; where the runtime sets roofline_exponent p, (read^p + compute^p)^(1/p):
        the two overlap less than fully where they are close, as a verify of a few hundred tokens shows) +
        attention + layers x per-layer overhead (+ layers x moe_layer_overhead for a MoE model, 0 where the runtime
        does not set it) + TP all-reduces; read = weights read (_bytes_read) / (bandwidth x bandwidth_efficiency x
        tp), compute = weights_compute(tokens, compute_efficiency) (MoE: the routed experts at
        moe_compute_efficiency of the dense rate); attention
        reads every request's KV cache at the runtime's attention bandwidth (attention_bandwidth_efficiency, else
        bandwidth_efficiency, of the GPU's), and no faster for one request than request_bandwidth() (a lone long
        request leaves most of the GPU idle), where the runtime sets it;
        verification may read it more than once (verify_attention_reads). ``shared`` context tokens are KV pages
        that another request of the batch also reads (one copy in the radix cache: the same prompt in flight twice);
        the kernel reads them again at shared_kv_reads of their cost (the rest hits the GPU's L2), so attention reads
        sum(contexts) - (1 - shared_kv_reads) x shared tokens (1, no saving, where the runtime does not set it).
        The eager runtime (hf-eager) has its own model: _eager_seconds.
        """
        r, m, g = self.runtime, self.model, self.gpu
        if "eager_layer_launch" in r:
            return self._eager_seconds(tokens, contexts)
        bw = g["bandwidth"] * r["bandwidth_efficiency"] * self.tp
        read = self._bytes_read(tokens, len(contexts)) / bw
        compute = self.weights_compute(tokens, r["compute_efficiency"])
        if r.get("roofline_exponent"):  # a soft roofline: (read^p + compute^p)^(1/p), max(read, compute) as p grows
            p = max(1.0, r["roofline_exponent"])
            top = max(read, compute)
            roofline = top * ((read / top) ** p + (compute / top) ** p) ** (1 / p) if top > 0 else 0.0
        else:
            roofline = max(read, compute)
        # a verify step (several tokens per request) reads each request's KV cache 1 + verify_attention_reads
        # times, whatever its width (measured: SGLang's DFlash rounds grow with the context alike at widths 8-32)
        width = tokens / len(contexts) if contexts else 1.0
        reads = 1.0 + (r.get("verify_attention_reads", 0.0) if width > 1 else 0.0)
        kv_bw = g["bandwidth"] * r.get("attention_bandwidth_efficiency", r["bandwidth_efficiency"]) * self.tp
        read_tokens = sum(contexts) - (1.0 - min(1.0, r.get("shared_kv_reads", 1.0))) * shared
        attention = reads * read_tokens * m["kv_bytes_per_token"] / kv_bw
        request_bw = self.request_bandwidth()
        if request_bw and contexts:
            # one request's reads are parallel over its verified tokens too, so they may cost less than the
            # batch's (verify_request_attention_reads, where the runtime sets it)
            request_reads = 1.0 + (r.get("verify_request_attention_reads", reads - 1.0) if width > 1 else 0.0)
            attention = max(attention, request_reads * max(contexts) * m["kv_bytes_per_token"] / (request_bw * self.tp))
        fixed = m["layers"] * r["layer_overhead"]
        if m.get("experts"):  # routing, top-k, sorting tokens by expert, the grouped GEMMs' launches: every MoE layer
            fixed += m["layers"] * r.get("moe_layer_overhead", 0.0)
        comm = 2 * m["layers"] * self.allreduce_latency() * math.log2(self.tp) if self.tp > 1 else 0.0
        return roofline + attention + fixed + comm

    def allreduce_latency(self) -> float:
        """Seconds of one latency-bound all-reduce step: a property of the GPUs' links, so the GPU profile's where it
        states one (a GPU whose cards talk over PCIe), else the runtime's (measured or estimated over NVLink)."""
        return self.gpu.get("allreduce_latency", self.runtime["allreduce_latency"])

    def mask_seconds(self, decoding: Decoding, contexts: list[int]) -> float:
        """GPU time of reading a round's custom tree mask in attention: the triton kernel reads one byte per node and
        key in every layer, nodes x (context + nodes) a request, at the runtime's bandwidth efficiency (0 on a
        runtime without one, the paper's eager one, and for an algorithm verified without a mask)."""
        r, spec, width = self.runtime, decoding.spec, decoding.verify_width()
        if not (spec.custom_mask and (spec.drafting != "draft-model" or decoding.verifies_tree())):
            return 0.0
        if "bandwidth_efficiency" not in r:
            return 0.0
        mask_bytes = sum(width * (c + width) for c in contexts) * self.model["layers"]
        return mask_bytes / (self.gpu["bandwidth"] * r["bandwidth_efficiency"] * self.tp)

    def cpu_seconds(self, decoding: Decoding, batch: int) -> float:
        """CPU work of one step: scheduling and sampling (cpu_step), plus, for a speculative round, its
        per-request bookkeeping (spec_cpu_per_request x batch), plus with the DDTree rank probe its walk
        (rank_probe_cpu_per_request x batch)."""
        r = self.runtime
        seconds = r.get("cpu_step", r.get("no_overlap_penalty", 0.0))
        if decoding.probes_ranks():  # the rank probe's per-request walk in Python
            seconds += r.get("rank_probe_cpu_per_request", 0.0) * batch
        return seconds + (r.get("spec_cpu_per_request", 0.0) * batch if decoding.spec.speculative else 0.0)

    def decode_step(
        self, decoding: Decoding, contexts: list[int], shared: float = 0.0, trie_tokens: float | None = None
    ) -> float:
        """Seconds for one decode/verify step of a batch with these context lengths (``shared`` of their tokens read
        by two or more of its requests: see verify_seconds; ``trie_tokens``: what NGRAM's trie holds,
        ngram_trie_tokens, where the caller knows its requests' prompts and outputs apart, else the prompt tails
        alone: ngram_trie_tokens(contexts, 0 each)).

        step = GPU + exposed CPU. GPU = verify(width x batch tokens) + drafting (draft_seconds) + for a tree verified
        with a custom mask (DDTree at every budget, NGRAM, a draft model's tree) the mask read per layer (nodes x
        (context + nodes) bytes) and on hybrid models the recurrent state of nodes beyond the 8 a fused kernel takes +
        for DDTree in tree mode its construction (per node), its top-k over the drafter's per-depth distributions, its
        verify's work a tree node and its round work the overlap scheduler does not hide (tree_round_seconds; a build's
        own measured values over the runtime's: with_build_costs), and with the rank probe its top-32 over the drafter's
        logits (batch x (block - 1) x vocab x 4 bytes). The overlap scheduler prepares the next step on the CPU while
        the GPU runs this one, so only CPU work longer than the GPU's shows; without it (and for a DDTree build that
        runs without it) all of it adds. NGRAM's lookup (ngram_step_overhead + (ngram_cpu_per_request +
        ngram_cpu_per_node x nodes + ngram_cpu_per_trie_token x trie_tokens) x batch) runs between two steps whatever
        the scheduler: it needs the last round's tokens. Every speculative round adds verify_per_request x batch on the
        GPU (each request's acceptance walk and sampling over its drafted tokens); a draft model adds draft_per_request
        x batch (its per-request work beside its forwards), and for a tree draft_tree_per_node x nodes x batch (choosing
        the nodes).
        """
        if not contexts:
            return 0.0
        own = self.with_build_costs(decoding)
        if own is not self:
            return own.decode_step(decoding, contexts, shared, trie_tokens)
        r, spec = self.runtime, decoding.spec
        width = decoding.verify_width()
        gpu = self.verify_seconds(width * len(contexts), contexts, shared)
        if spec.speculative:
            gpu += self.draft_seconds(decoding, contexts) + r.get("verify_per_request", 0.0) * len(contexts)
            masked = spec.custom_mask and (spec.drafting != "draft-model" or decoding.verifies_tree())
            if masked:
                gpu += self.masked_verify_extra(decoding, contexts)
            if spec.drafting == "lookup":  # SGLang's n-gram match and tree mask, built for each request
                if trie_tokens is None:
                    trie_tokens = ngram_trie_tokens(contexts, [0] * len(contexts))
                per_request = (
                    r.get("ngram_cpu_per_request", 0.0)
                    + r.get("ngram_cpu_per_node", 0.0) * width
                    + r.get("ngram_cpu_per_trie_token", 0.0) * trie_tokens
                )
                gpu += r.get("ngram_step_overhead", 0.0) + per_request * len(contexts)
            elif spec.drafting == "draft-model":  # a draft model's per-request work a round (its tree, its sampling)
                gpu += r.get("draft_per_request", 0.0) * len(contexts)
                if decoding.verifies_tree():  # choosing the tree's nodes from topk^2 candidates a step
                    gpu += r.get("draft_tree_per_node", 0.0) * width * len(contexts)
        cpu = self.cpu_seconds(decoding, len(contexts))
        if decoding.overlap and spec.overlapped(decoding.params()):
            return max(gpu, cpu) if "cpu_step" in r else gpu
        return gpu + cpu

    def masked_verify_extra(self, decoding: Decoding, contexts: list[int]) -> float:
        """Seconds a round verified with a custom tree mask adds (decode_step): the mask read in attention
        (mask_seconds); for DDTree in tree mode its heap that builds the tree (tree_build_per_node x budget x batch; a
        chain has none) and its own round terms (tree_round_seconds); with the rank probe its top-32 over the
        drafter's float32 logits at every depth (batch x (block - 1) x vocab x 4 bytes at the GPU's bandwidth); on a
        hybrid model the recurrent state of nodes beyond the 8 a fused kernel takes (hybrid_tree_per_node)."""
        r, batch = self.runtime, len(contexts)
        seconds = self.mask_seconds(decoding, contexts)
        if decoding.builds_tree():
            seconds += r["tree_build_per_node"] * decoding.budget * batch
            seconds += sum(self.tree_round_seconds(decoding, batch).values())
        if decoding.probes_ranks():
            logits = batch * (decoding.block_size - 1) * self.model["vocab"] * 4
            seconds += logits / (self.gpu["bandwidth"] * r.get("bandwidth_efficiency", 1.0) * self.tp)
        if self.model["hybrid"]:
            seconds += r.get("hybrid_tree_per_node", 0.0) * max(0, decoding.verify_width() - 8) * batch
        return seconds

    def prefill(self, new_tokens: int, attention_pairs: float = 0.0, decoding: Decoding | None = None) -> float:
        """Seconds to prefill ``new_tokens`` prompt tokens (compute-bound): the weights' work,
        weights_compute(tokens, e) (2 x params x tokens / (flops x e) for a dense model), plus causal attention where
        the runtime sets attention_compute_efficiency: 4 x layers x q_dim x pairs / (flops x e_attention), pairs =
        sum over requests of new x cached + new^2 / 2 (query-key pairs), plus the runtime's prefill_fixed per
        prefill step (kernel launches without CUDA graphs). On a server decoding with a block drafter (DFlash,
        DDTree: ``decoding``) the drafter extends its own cache over the same tokens: drafter_prefill_fraction x
        the weights' work of the target as a dense model of its active size (dense_equivalent) +
        drafter_prefill_fixed a step (the runtime's; 0 where it does not set them: a drafter of a few layers adds
        little attention, so a share of the weights' work and not of the whole)."""
        if new_tokens <= 0:
            return 0.0
        r, m, g = self.runtime, self.model, self.gpu
        weights = self.weights_compute(new_tokens, r.get("compute_efficiency", 0.4))
        seconds = weights + r.get("prefill_fixed", 0.0)
        if attention_pairs and r.get("attention_compute_efficiency"):
            seconds += (
                4
                * m["layers"]
                * m["q_dim"]
                * attention_pairs
                / (g["flops"] * r["attention_compute_efficiency"] * self.tp)
            )
        if decoding is not None and decoding.spec.drafting in ("block", "block-tree"):
            dense = self.dense_equivalent().weights_compute(new_tokens, r.get("compute_efficiency", 0.4))
            seconds += r.get("drafter_prefill_fraction", 0.0) * dense + r.get("drafter_prefill_fixed", 0.0)
        return seconds

    def request_latency(self, prompt_tokens: int) -> float:
        """Seconds a request spends in the server outside the engine's steps (the HTTP server, tokenization, the
        hand-offs to the scheduler and from the detokenizer): request_latency + request_latency_per_token x prompt
        tokens, the runtime's (0 where it does not set them). The simulated server holds each request that long
        before its queue; a request's first token comes that much later than the steps that produce it."""
        r = self.runtime
        return r.get("request_latency", 0.0) + r.get("request_latency_per_token", 0.0) * prompt_tokens
