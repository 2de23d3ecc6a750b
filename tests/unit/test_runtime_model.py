"""One runtime model of mechanisms: every runtime parameter the cost model reads is stated with its reason and how it
follows the GPU; GPU-bound work scales with the GPU's datasheet, host work does not; the generic runtime is the H200
fit's transferable form, derived from the records (benchmarks/gpu/step_costs.py generic) and within 15% of the
measured runtime at every recorded shape."""

from __future__ import annotations

import math
import re
import sys

import pytest
from conftest import REPO, load_default_config, validated
from specsweep.config import ConfigError
from specsweep.modelling import cost as cost_module
from specsweep.modelling.cost import REQUIRED_RUNTIME, RUNTIME_BOUNDS, RUNTIME_FLAGS, SCALES, CostModel
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.profiles import ProfileError, profiles

AR = Decoding("ar")

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import step_costs  # noqa: E402


def test_every_runtime_parameter_the_cost_model_reads_is_stated_with_its_mechanism_and_scaling():
    """Every key cost.py reads from a runtime profile (r["..."], r.get("..."), f"draft_{k}") is a parameter of
    RUNTIME_BOUNDS or a flag, and every parameter has a reason and one of SCALES's ways of following the GPU."""
    source = (REPO / "specsweep" / "modelling" / "cost.py").read_text()
    read = set(re.findall(r"\br\[\"(\w+)\"\]", source)) | set(re.findall(r"\br\.get\(\"(\w+)\"", source))
    read |= {f"draft_{k}" for k in ("layer_overhead", "attention_reads")}
    assert len(read) > 30  # the pattern finds the reads
    assert read - set(RUNTIME_BOUNDS) - set(RUNTIME_FLAGS) == set()
    assert {k for kind in REQUIRED_RUNTIME.values() for k in kind} <= set(RUNTIME_BOUNDS)
    for name, bound in RUNTIME_BOUNDS.items():
        assert len(bound.reason) > 20, name
        assert bound.scales in SCALES, name
        # a share of a rate is one of the GPU's (or a share of a share); seconds are fixed GPU work, links or host
        if name.endswith("_efficiency") and name != "moe_compute_efficiency":
            assert bound.scales in ("bandwidth", "flops"), name
        if "seconds" in bound.unit:
            assert bound.scales in ("gpu-fixed", "interconnect", "host"), name


def _faster(gpu: dict, factor: float) -> dict:
    return {**gpu, "bandwidth": gpu["bandwidth"] * factor, "flops": gpu["flops"] * factor}


@pytest.mark.parametrize(
    "decoding",
    [
        Decoding("ar"),
        Decoding("dflash", 16),
        Decoding("eagle3", num_steps=3, topk=1, num_draft_tokens=4),
        Decoding("ngram", num_draft_tokens=16, max_bfs_breadth=8, match_type="BFS"),
    ],
)
def test_gpu_bound_work_scales_with_the_datasheet_and_fixed_and_host_work_does_not(decoding):
    """On a GPU with twice the bandwidth and flops, a step of the generic runtime is its fixed work (every gpu-fixed
    parameter) plus half its GPU-bound work; with the fixed costs at 0 it halves exactly; host work (cpu_seconds)
    is the same on both."""
    p = profiles()
    runtime = p["runtimes"]["sglang"]
    fixed = [k for k, b in RUNTIME_BOUNDS.items() if b.scales in ("gpu-fixed", "host") and k in runtime]
    no_fixed = {**runtime, **dict.fromkeys(fixed, 0.0)}
    h200, model, drafter = p["gpus"]["H200"], p["models"]["qwen3-8b"], p["models"]["qwen3-0.6b"]
    contexts = [1100] * 16
    slow_gpu = CostModel(h200, model, no_fixed, 1, drafter).decode_step(decoding, contexts)
    fast_gpu = CostModel(_faster(h200, 2), model, no_fixed, 1, drafter).decode_step(decoding, contexts)
    assert fast_gpu == pytest.approx(slow_gpu / 2, rel=1e-9)
    slow = CostModel(h200, model, runtime, 1, drafter)
    fast = CostModel(_faster(h200, 2), model, runtime, 1, drafter)
    # the fixed part is the same on both GPUs: slow - fast = half of the GPU-bound part (the overlap scheduler's
    # max(gpu, cpu) aside: the GPU steps here are longer than the host's work)
    assert slow.decode_step(decoding, contexts) - fast.decode_step(decoding, contexts) == pytest.approx(
        slow_gpu / 2, rel=1e-9
    )
    assert slow.cpu_seconds(decoding, 16) == fast.cpu_seconds(decoding, 16) > 0


def test_a_gpus_own_link_latency_replaces_the_runtimes_for_every_all_reduce_under_tp():
    """The all-reduce latency is the links': where a GPU profile states one (PCIe cards) it prices each of the two
    all-reduces a layer, log2(tp) steps each, of the target's forwards and the drafter's; at TP 1 there is none."""
    p = profiles()
    runtime, llama = p["runtimes"]["sglang"], p["models"]["llama-8b"]
    pcie = p["gpus"]["RTX-PRO-6000"]
    assert pcie["allreduce_latency"] > runtime["allreduce_latency"]
    nvlink_estimate = {k: v for k, v in pcie.items() if k != "allreduce_latency"}
    extra = pcie["allreduce_latency"] - runtime["allreduce_latency"]
    for tp in (2, 4, 8):
        own, estimated = (CostModel(g, llama, runtime, tp) for g in (pcie, nvlink_estimate))
        assert own.allreduce_latency() == pcie["allreduce_latency"]
        assert estimated.allreduce_latency() == runtime["allreduce_latency"]
        gap = own.decode_step(AR, [500]) - estimated.decode_step(AR, [500])
        assert gap == pytest.approx(2 * llama["layers"] * extra * math.log2(tp), rel=1e-9)
    one = [CostModel(g, llama, runtime, 1).decode_step(AR, [500]) for g in (pcie, nvlink_estimate)]
    assert one[0] == one[1]
    # a round with a drafter pays the drafter's all-reduces too: more than the target's alone
    dflash = Decoding("dflash", 16)
    gap = CostModel(pcie, llama, runtime, 2).decode_step(dflash, [500]) - CostModel(
        nvlink_estimate, llama, runtime, 2
    ).decode_step(dflash, [500])
    assert gap > 2 * llama["layers"] * extra


def test_a_gpu_profile_that_cannot_price_a_step_is_refused_naming_its_key():
    """A link latency written in microseconds (75 for 75 us) would make every all-reduce 75 s: refused, naming the
    key and the unit, in the configuration too; so are a missing flops and a negative bandwidth."""
    h200 = profiles()["gpus"]["H200"]
    with pytest.raises(ProfileError, match=r"sim\.profiles\.gpus\.mine\.allreduce_latency.*75\.0e-6"):
        profiles({"gpus": {"mine": {**h200, "allreduce_latency": 75}}})
    with pytest.raises(ProfileError, match=r"'mine': flops None .*sim\.profiles\.gpus\.mine\.flops"):
        profiles({"gpus": {"mine": {"bandwidth": 1e12}}})
    with pytest.raises(ProfileError, match=r"bandwidth -1"):
        profiles({"gpus": {"mine": {**h200, "bandwidth": -1}}})
    assert profiles({"gpus": {"mine": {**h200, "allreduce_latency": 75e-6}}})["gpus"]["mine"]["allreduce_latency"]
    config = load_default_config()
    config["sim"].update(gpu="mine", profiles={"gpus": {"mine": {**h200, "allreduce_latency": 75}}})
    with pytest.raises(ConfigError, match=r"sim\.profiles: GPU profile 'mine': allreduce_latency 75"):
        validated(config)


def test_the_generic_runtime_is_what_the_h200_records_give_without_the_forced_ones():
    """The shipped generic runtime ``sglang`` is step_costs.generic_runtime(): the fit to the H200 records (never a
    forced-acceptance one), its MoE terms from the MoE record, its costs outside the steps from the H200
    calibration; nothing of it typed by hand beyond NOT_MEASURED."""
    assert not any("forced" in name for name in step_costs.GENERIC_RECORDS)
    derived = step_costs.generic_runtime()
    shipped = profiles()["runtimes"]["sglang"]
    assert set(derived) == set(shipped)
    assert {k: shipped[k] for k in derived} == pytest.approx(derived, rel=2e-3)
    for name, value in step_costs.NOT_MEASURED.items():
        assert shipped[name] == value


def test_on_the_h200_the_generic_runtime_is_within_15_percent_of_the_measured_one_at_every_recorded_shape():
    """Every measured shape of the H200 records (Qwen3-8B's AR, DFlash, NGRAM, EAGLE-3 chains and trees and
    standalone rounds, the MoE record's, the forced-acceptance records') and every method at batch 1-64 (DDTree
    and the MoE EAGLE-3 chain among them): the generic runtime within 15% of sglang-0.5.16-h200 (table in
    benchmarks/README.md)."""
    rows = step_costs.generic_against_measured()
    labels = " ".join(label for label, _, _ in rows)
    for shape in ("ddtree", "eagle3", "standalone", "ngram", "dflash", "forced-moe", "MoE EAGLE-3"):
        assert shape.lower() in labels.lower(), shape
    assert len(rows) > 250
    worst = max(rows, key=lambda r: abs(r[2] / r[1] - 1))
    assert abs(worst[2] / worst[1] - 1) <= 0.15, worst


def test_the_simulator_with_the_generic_runtime_prices_the_forced_acceptance_rounds_of_the_real_engine():
    """benchmarks/forced_check.py over the forced-acceptance records (never fitted to): every dense cell's TPOT p50
    (a round's cost over its tokens) within 10% of the real engine's; every cell of one request within 10% in
    throughput, with the real verdict (faster or slower than AR) wherever it is more than 10% from 1. The
    throughput misses at 4-64 requests (stalls outside the rounds; on MoE, dummy replies that all route alike)
    are in benchmarks/README.md."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import forced_check

    rows = forced_check.check("sglang")
    assert len(rows) == 37
    dense = [r for r in rows if r["record"] == "forced-2026-12-02"]
    worst = max(dense, key=lambda r: abs(r["simulated_tpot"] / r["real_tpot"] - 1))
    assert abs(worst["simulated_tpot"] / worst["real_tpot"] - 1) < 0.10, worst
    alone = [r for r in rows if r["concurrency"] == 1]
    assert len(alone) == 10
    for r in alone:
        assert abs(r["simulated"] / r["real"] - 1) < 0.10, r
        if r["method"] != "ar" and abs(r["real_speedup"] - 1) > 0.10:
            assert (r["simulated_speedup"] > 1) == (r["real_speedup"] > 1), r


def test_the_default_runtime_is_the_measured_one_where_it_exists_else_the_generic_one():
    """sim.runtime auto (the default) becomes the measured runtime for the H200 with Qwen3-8B or Qwen3-30B-A3B, the
    generic one for any other GPU or model; a runtime named is kept; an engine's block resolves on its own GPU; the
    label the plan, cells and report print says which."""
    from conftest import fast_config, validated
    from specsweep import engines
    from specsweep.calibration import choose

    def runtime(**sim) -> str:
        config = fast_config()
        config["sim"].update(sim)
        return validated(config)["sim"]["runtime"]

    assert runtime() == "sglang-0.5.16-h200"
    assert runtime(model_profile="qwen3-30b-a3b") == "sglang-0.5.16-h200"
    assert runtime(gpu="B200") == runtime(gpu="RTX-PRO-6000") == runtime(model_profile="hybrid-27b") == "sglang"
    assert runtime(runtime="sglang") == "sglang" and runtime(gpu="B200", runtime="sglang-0.5.16-h200") != "sglang"
    config = fast_config()
    config["engines"] = [{"name": "h200"}, {"name": "b200", "sim": {"gpu": "B200"}}]
    resolved = validated(config)
    assert [engines.view(resolved, e)["sim"]["runtime"] for e in ("h200", "b200")] == ["sglang-0.5.16-h200", "sglang"]
    assert choose.labels(resolved) == (
        "not calibrated: measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"
    )
    assert choose.labels(engines.view(resolved, "b200")) == (
        "not calibrated: generic runtime sglang (the H200 fit on this GPU's datasheet)"
    )


def test_an_ngram_round_costs_more_the_more_its_trie_holds_at_the_same_batch_and_context():
    """NGRAM's per-request host work grows with what the trie holds (ngram_cpu_per_trie_token): at one batch and
    one context, a round whose trie holds more costs more by that slope x the tokens added x the batch; AR's step
    does not change."""
    cost = CostModel.named("H200", "qwen3-8b", "sglang")
    slope = cost.runtime["ngram_cpu_per_trie_token"]
    assert slope > 0
    ngram = Decoding("ngram", num_draft_tokens=8, max_bfs_breadth=8)
    contexts = [1100] * 16
    small, large = (cost.decode_step(ngram, contexts, 0.0, trie) for trie in (1_000.0, 100_000.0))
    assert large > small
    assert large - small == pytest.approx(slope * 99_000 * 16, rel=1e-9)
    assert cost.decode_step(Decoding("ar"), contexts, 0.0, 1_000.0) == cost.decode_step(
        Decoding("ar"), contexts, 0.0, 100_000.0
    )


def test_the_trie_holds_prompt_tails_and_outputs_up_to_its_capacity():
    """What NGRAM's trie holds (cost.ngram_trie_tokens): a prompt's body never reaches it (only its last
    NGRAM_TRIE_DEPTH tokens), every generated token does, and the capacity bounds it."""
    tail = cost_module.NGRAM_TRIE_DEPTH
    assert cost_module.ngram_trie_tokens([1_000, 8_000], [10, 10]) == 2 * (tail + 10)
    assert cost_module.ngram_trie_tokens([5], [40]) == 45
    assert cost_module.ngram_trie_tokens([100] * 4, [50] * 4) > cost_module.ngram_trie_tokens([100] * 4, [10] * 4)
    huge = cost_module.ngram_trie_tokens([100] * 1000, [10**6] * 1000)
    assert huge == cost_module.NGRAM_TRIE_CAPACITY // tail
