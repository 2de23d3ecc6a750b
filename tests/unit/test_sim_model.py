"""The simulated backend as a model of real GPUs: calibration, batching, TP, clients, fault switches."""

from __future__ import annotations

import json
import os
import random

import pytest
import requests

from conftest import DDTREE, DFLASH, REPO, fast_config, patience, start_sim, validated
from specsweep.client import measure
from specsweep.launcher import ServerError
from specsweep.metrics import output_throughput
from specsweep.sim import replay
from specsweep.modelling.acceptance import ACCEPTANCE, RankedDrafter, build_tree
from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding
from specsweep.errors import ConfigError
from specsweep.modelling.profiles import MODEL_DIMS, ProfileError, model_problems, profiles
from specsweep.modelling.published import (
    PUBLISHED_DFLASH_BY_CONTENT,
    PUBLISHED_QWEN3_8B,
    calibration_prompts,
    predict,
    predict_content,
)
from specsweep.workloads import Session, build


@pytest.fixture(scope="module")
def prompts():
    return calibration_prompts(count=20)


@pytest.mark.parametrize("row", ["gsm8k", "humaneval", "alpaca"])
def test_speedups_within_15_percent_of_the_published_qwen3_8b_rows(prompts, row):
    predicted, published = predict(prompts[row]), PUBLISHED_QWEN3_8B[row]
    assert predicted["dflash"] == pytest.approx(published["dflash"], rel=0.15)
    assert predicted["ddtree_over_dflash"] == pytest.approx(published["ddtree"] / published["dflash"], rel=0.15)


def test_acceptance_follows_content_not_labels(prompts):
    code, chat = predict(prompts["humaneval"]), predict(prompts["alpaca"])
    assert code["tau_dflash"] > chat["tau_dflash"] + 2
    taus = list(code["tau_by_budget"].values())
    assert taus == sorted(taus) and taus[-1] <= 16  # rises with the budget, bounded by the block


def test_small_model_gains_nothing_from_tp8_at_batch_1_while_large_ones_do():
    def gain(model):
        step = {tp: CostModel.named("H200", model, tp=tp).decode_step(Decoding(), [1000]) for tp in (1, 8)}
        return step[1] / step[8]

    assert gain("qwen3-8b") < 1.15
    assert gain("hybrid-27b") > 1.5
    assert gain("llama-70b") > 2.0


def test_tree_verification_costs_more_on_hybrid_models():
    tree = Decoding("ddtree", 16, 64, 8)
    dense = CostModel.named("H200", "qwen3-8b")
    hybrid = CostModel.named("H200", "hybrid-27b")
    chain = Decoding("dflash", 16)
    assert (
        hybrid.decode_step(tree, [1000]) / hybrid.decode_step(chain, [1000])
        > dense.decode_step(tree, [1000]) / dense.decode_step(chain, [1000]) + 0.1
    )


def test_ddtree_step_pays_for_its_mask_and_only_a_tree_for_its_construction():
    base = CostModel.named("H200", "qwen3-8b")
    heavy = CostModel(base.gpu, base.model, {**base.runtime, "tree_build_per_node": 1e-3}, 1)
    chain, tree = Decoding("ddtree", 16, 15, 8), Decoding("ddtree", 16, 16, 8)
    assert heavy.decode_step(chain, [1000]) == pytest.approx(base.decode_step(chain, [1000]))  # no heap for a chain
    per_node = 1e-3 - base.runtime["tree_build_per_node"]
    assert heavy.decode_step(tree, [1000]) == pytest.approx(base.decode_step(tree, [1000]) + 16 * per_node)
    # the mask (nodes x (context + nodes) bytes per layer) makes a DDTree chain dearer than DFlash's equal chain,
    # and more so at a longer context
    dflash = Decoding("dflash", 16, overlap=False)
    extra = {c: base.decode_step(chain, [c]) - base.decode_step(dflash, [c]) for c in (1000, 32000)}
    assert 0 < extra[1000] < extra[32000]


def test_ddtree_advantage_over_dflash_shrinks_as_concurrency_grows():
    """A model property, so measured in the engine's virtual time (``sim.replay``): no host noise in the ratios."""
    sessions = build({"name": "s", "family": "short", "requests": 32, "max_new_tokens": 96}, 0)
    # the paper's tree (a budget-64 tree at batch 1 beats the chain there); the pull request's narrower tree
    # of width 5 does not on this model
    engines = {
        "dflash": lambda: replay.engine("dflash", max_running=32),
        "ddtree": lambda: replay.engine("ddtree", budget=64, max_running=32, tree_build="paper"),
    }
    throughput = {
        (name, c): output_throughput(replay.closed_loop(new(), sessions[: 16 if c == 1 else 32], c))
        for name, new in engines.items()
        for c in (1, 32)
    }
    advantage = {c: throughput["ddtree", c] / throughput["dflash", c] for c in (1, 32)}
    assert advantage[1] > 1.0
    assert advantage[32] < advantage[1] - 0.1


def test_openai_python_client_reads_the_simulator(tmp_path):
    import openai

    server = start_sim(tmp_path, *DFLASH)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        assert client.models.list().data[0].id == "Qwen/Qwen3-8B"
        chat = client.chat.completions.create(
            model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "Hi"}], max_tokens=24, temperature=0
        )
        assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
        stream = client.completions.create(
            model="Qwen/Qwen3-8B",
            prompt="Once upon a time",
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert text and finished == ["length"]  # it ran to max_tokens
        assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 24  # the usage chunk comes last
    finally:
        server.stop()


# ------------------------------------------------------------------ fault switches


def twelve_sessions(max_new=64):
    return [
        Session(f"s{i}", "chat", [{"role": "user", "content": f"Tell me about topic {i}."}], [], max_new)
        for i in range(12)
    ]


def test_fault_never_ready(tmp_path):
    with pytest.raises(ServerError, match="not ready after 3 s"):
        start_sim(tmp_path, "--sim-never-ready", timeout=3)


def test_fault_slow_start_is_waited_for(tmp_path):
    server = start_sim(tmp_path, startup=1.5, timeout=patience(6))
    try:
        assert server.startup_seconds >= 1.5
    finally:
        server.stop()


def test_fault_http_500_at_a_rate(tmp_path):
    server = start_sim(tmp_path, "--sim-error-rate", "0.5")
    try:
        records = measure(server.url, twelve_sessions(), 4, {"temperature": 0.0}, 30)
    finally:
        server.stop()
    failed = [r for r in records if r.error == "http_status"]
    assert 2 <= len(failed) <= 10 and all("HTTP 500" in r.error_detail for r in failed)
    assert len(records) == 12  # nothing dropped


def test_fault_truncated_streams(tmp_path):
    server = start_sim(tmp_path, "--sim-truncate-rate", "1.0")
    try:
        records = measure(server.url, twelve_sessions(), 2, {"temperature": 0.0}, 30)
    finally:
        server.stop()
    assert all(r.error == "truncated" for r in records)


def test_fault_hang_mid_stream_times_out(tmp_path):
    server = start_sim(tmp_path, "--sim-hang-after-tokens", "5")
    try:
        records = measure(server.url, twelve_sessions()[:2], 2, {"temperature": 0.0}, timeout=2.0)
    finally:
        server.stop()
    assert all(r.error == "timeout" and r.output_tokens >= 1 for r in records)


def test_fault_crash_after_n_requests(tmp_path):
    server = start_sim(tmp_path, "--sim-crash-after", "3")
    try:
        records = measure(server.url, twelve_sessions(), 1, {"temperature": 0.0}, 10, alive=server.alive)
        assert not server.alive()
    finally:
        server.stop()
    assert [r.error for r in records[:2]] == [None, None]
    assert all(r.error in ("server_died", "connect") for r in records[2:])


def test_sim_speaks_the_stream_contract_of_sglangs_bench_serving(tmp_path):
    """What `python -m sglang.benchmark.serving --backend sglang` reads from /generate (SGLang 0.5.23 source):
    SSE lines "data: <json>" ending with "data: [DONE]"; cumulative "text"; meta_info.completion_tokens
    (new tokens per chunk = its increase), meta_info.prompt_tokens, meta_info.spec_accept_length; extra
    request keys (lora_path, return_logprob, logprob_start_len) accepted; ignore_eos gives max_new_tokens."""
    import json as _json

    server = start_sim(tmp_path, *DFLASH)
    payload = {
        "text": "Write a haiku about the sea.",
        "stream": True,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": False,
        "logprob_start_len": -1,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True},
    }
    try:
        with requests.post(server.url + "/generate", json=payload, stream=True, timeout=30) as resp:
            assert resp.status_code == 200
            lines = [line for line in resp.iter_lines() if line.strip()]
    finally:
        server.stop()
    assert all(line.startswith(b"data: ") for line in lines) and lines[-1] == b"data: [DONE]"
    chunks = [_json.loads(line[6:]) for line in lines[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 40  # ignore_eos: exactly max_new_tokens
    assert all(c["meta_info"]["prompt_tokens"] > 0 for c in chunks)
    assert chunks[-1]["meta_info"]["spec_accept_length"] > 1


UNSPACED_TEXTS = {
    "zh": (
        "推测解码通过一个小型草稿模型一次提出多个候选词元，再由目标模型在一次前向计算中并"
        "行验证，从而在不改变输出分布的前提下降低延迟。"
    ),
    "ja": (
        "投機的デコーディングでは、小さな下書きモデルが複数のトークンを提案し、目標モデル"
        "が一度の順伝播でそれらを検証します。"
    ),
    "ko": (
        "추측 디코딩은 작은 초안 모델이 여러 토큰을 제안하고 대상 모델이 한 번"
        "의 순전파로 이를 검증하여 지연 시간을 줄입니다."
    ),
    "en": (
        "Speculative decoding lets a small draft model propose "
        "several tokens that the target model verifies in one pass."
    ),
}


@pytest.mark.parametrize("language", sorted(UNSPACED_TEXTS))
def test_approximate_token_count_follows_qwens_tokenizer_in_every_script(language):
    from specsweep.text import approximate_tokens as approximate
    from specsweep.workloads import count_tokens as qwen

    text = UNSPACED_TEXTS[language] * 8
    assert 0.7 <= approximate(text) / qwen(text) <= 1.3, (language, approximate(text), qwen(text))


def test_reply_to_a_chinese_prompt_has_the_size_of_its_tokens():
    from specsweep.modelling.acceptance import reply_tokens

    reply, _ = reply_tokens(UNSPACED_TEXTS["zh"] * 20, 256, ignore_eos=True)
    assert len(reply) == 256
    assert len("".join(reply).encode()) < 256 * 10  # a token is one or two characters, not a whole sentence


def test_measured_h200_profile_reproduces_the_recorded_step_costs():
    # the shipped runtime profile against the committed H200 records (benchmarks/gpu/step_costs.py): the step costs
    # of 2026-11-30, and the tree rounds and the workflow's own cells of every algorithm of 2026-12-01: every one of
    # the 170 shapes within 10% (benchmarks/README.md has every figure)
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    import step_costs

    cost = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    gpu = REPO / "benchmarks" / "gpu"
    rows = step_costs.measured_steps(gpu / "step-costs-2026-11-30", gpu / "spec-2026-12-01")
    kinds = {r["kind"] for r in rows}
    assert kinds == {"decode", "prefill", "dflash", "ar-server", "ar", "ngram", "eagle3", "standalone"}
    assert len(rows) == 170
    assert {r["width"] for r in rows if r["kind"] == "dflash"} >= {2, 4, 8, 16, 32, 40, 64}  # widths 2-65
    assert {r["width"] for r in rows if r["kind"] == "ngram"} == {8, 32, 128}  # NGRAM trees of 8-128 nodes
    assert {r["width"] for r in rows if r["kind"] == "eagle3"} == {4, 8, 16, 64, 128}  # a chain, trees of 8-128
    assert {r["context"] for r in rows if r["kind"] == "eagle3"} >= {1104, 8272}  # 1k and 8k contexts
    assert max(r["shared"] for r in rows if r["kind"] == "ar") > 0.5 * 64 * 2995  # long prompts in flight twice
    ratios = [step_costs.simulated(cost, row) / row["seconds"] for row in rows]
    assert all(0.90 <= ratio <= 1.10 for ratio in ratios), min(ratios, key=lambda r: -abs(r - 1))


def test_overlap_scheduler_hides_cpu_work_up_to_the_gpu_step():
    base = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    cost = CostModel(base.gpu, base.model, {**base.runtime, "cpu_step": 0.004}, 1)
    contexts = [1000] * 8
    gpu = CostModel(base.gpu, base.model, {**base.runtime, "cpu_step": 0.0}, 1).decode_step(Decoding("ar"), contexts)
    assert cost.decode_step(Decoding("ar", overlap=False), contexts) == pytest.approx(gpu + 0.004)
    assert cost.decode_step(Decoding("ar"), contexts) == pytest.approx(max(gpu, 0.004))
    # a speculative round's per-request bookkeeping grows with the batch
    spec = Decoding("dflash", overlap=False)
    assert base.decode_step(spec, [1000] * 32) - base.decode_step(spec, [1000] * 16) > 16 * 0.0005


def test_overlap_scheduler_gains_what_sglang_measured_for_dflash_at_concurrency_1():
    # sgl-project/sglang PR 23000 (B200, Qwen3-8B, GSM8K, TP1): DFlash output 846 -> 1,162 tok/s at c=1 (+37%) and
    # 11,406 -> 15,327 at c=32 (+34%) with the overlap scheduler, at the same acceptance, so the gain is the ratio of
    # the steps. The CPU work it hides is its host's (host-bound: cpu_step and spec_cpu_per_request do not follow the
    # GPU), read from its cycle times: 7.5 - 5.5 = 2.0 ms hidden at c=1, 18.2 - 13.5 = 4.7 ms at c=32. With them the
    # generic runtime's own B200 GPU step gives the gain at c=1; at c=32 its step is triton attention's (the H200
    # records' backend), dearer than the published run's, so the gain there is smaller (benchmarks/README.md).
    spec_cpu = (4.7e-3 - 2.0e-3) / 31
    generic = CostModel.named("B200", "qwen3-8b", "sglang")
    runtime = {**generic.runtime, "cpu_step": 2.0e-3 - spec_cpu, "spec_cpu_per_request": spec_cpu}
    cost = CostModel(generic.gpu, generic.model, runtime)
    steps = {
        (c, overlap): cost.decode_step(Decoding("dflash", 16, overlap=overlap), [1000] * c)
        for c in (1, 32)
        for overlap in (False, True)
    }
    gain = {c: steps[c, False] / steps[c, True] - 1 for c in (1, 32)}
    assert gain[1] == pytest.approx(0.37, abs=0.05)
    assert 0 < gain[32] < 0.34
    hidden = {c: steps[c, False] - steps[c, True] for c in (1, 32)}
    assert hidden[32] - hidden[1] == pytest.approx(31 * cost.runtime["spec_cpu_per_request"])


def test_eager_step_is_launch_bound_and_its_attention_grows_with_nodes_times_context():
    # HF transformers without CUDA graphs (the DDTree paper's runtime), published on an A800 for Qwen3-8B: ~34 ms
    # flat up to ~128 tree nodes at short context, ~55 ms at 512, 57 -> 117 ms from 128 -> 512 nodes at 8k context
    cost = CostModel.named("H200", "qwen3-8b", "hf-eager")

    def ms(nodes, context):
        return cost.verify_seconds(nodes, [context]) * 1e3

    for (nodes, context), published in {(1, 1000): 34, (128, 1000): 34, (512, 1000): 55, (128, 8000): 57}.items():
        assert ms(nodes, context) == pytest.approx(published, rel=0.10)
    assert ms(512, 8000) == pytest.approx(117, rel=0.10)
    # the context's cost grows with the nodes that attend to it (the dense mask: nodes x (context + nodes) pairs)
    assert ms(512, 8000) - ms(512, 1000) > 2 * (ms(128, 8000) - ms(128, 1000))
    # launch-bound: most of a short step is the layers' launches, the same on any GPU, so a B200's bandwidth saves
    # little; a model of more layers and weights costs more
    launches = cost.model["layers"] * cost.runtime["eager_layer_launch"] * 1e3
    assert launches > 0.7 * ms(1, 1000)
    b200 = CostModel.named("B200", "qwen3-8b", "hf-eager").verify_seconds(1, [1000]) * 1e3
    assert launches < b200 < ms(1, 1000)
    assert CostModel.named("H200", "llama-70b", "hf-eager").verify_seconds(1, [1000]) * 1e3 > 2 * ms(1, 1000)


def test_moe_step_reads_the_experts_its_tokens_touch():
    moe = CostModel.named("H200", "qwen3-30b-a3b")
    experts, k = moe.model["experts"], moe.model["experts_per_token"]
    assert moe.experts_touched(1) == pytest.approx(k)
    touched = [moe.experts_touched(n, requests=n) for n in (1, 2, 16, 64, 256, 4096)]  # one token a request
    assert touched == sorted(touched) and touched[-1] == pytest.approx(experts)
    # tokens of different requests share an expert only by chance, (1 - k/E)^n that none picks one: a Monte Carlo
    # of uniform routing agrees
    rng = random.Random(7)
    draws = [len({e for _ in range(16) for e in rng.sample(range(experts), k)}) for _ in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(moe.experts_touched(16, requests=16), rel=0.02)
    # tokens of one sequence route within its own working set of E / f experts (f: how many times more often than
    # chance consecutive tokens repeat a first choice, Mixtral's 2.11): a Monte Carlo of that routing (f = 2, a set
    # of 64) agrees on the repeat rate and on the experts of one sequence and of two independent ones
    local = CostModel(moe.gpu, {**moe.model, "expert_repeat_factor": 2.0}, moe.runtime)
    sets = [rng.sample(range(experts), experts // 2) for _ in range(20000)]
    repeats = sum(rng.choice(ws) == rng.choice(ws) for ws in sets) / len(sets)
    assert repeats == pytest.approx(2.0 / experts, rel=0.15)
    one = [len({e for _ in range(16) for e in rng.sample(ws, k)}) for ws in sets[:2000]]
    assert sum(one) / len(one) == pytest.approx(local.experts_touched(16), rel=0.02)
    pairs = zip(sets[:4000:2], sets[1:4000:2])
    two = [len({e for ws in pair for _ in range(16) for e in rng.sample(ws, k)}) for pair in pairs]
    assert sum(two) / len(two) == pytest.approx(local.experts_touched(32, requests=2), rel=0.02)
    # the shipped profile: a DFlash verify of 16 tokens of one request touches well under the 82 of uniform routing,
    # 16 requests' single tokens exactly those
    assert moe.experts_touched(16) < 0.7 * moe.experts_touched(16, requests=16)
    assert moe.experts_touched(16, requests=16) == pytest.approx(experts * (1 - (1 - k / experts) ** 16))
    per_token = moe._bytes_read(1)
    assert per_token == pytest.approx(6.6e9, rel=0.02)  # the model card's 3.3e9 active parameters in bf16
    assert moe._bytes_read(4096, requests=4096) == pytest.approx(moe.model["weight_bytes"], rel=0.001)
    assert moe._bytes_read(16) == pytest.approx(
        per_token + moe.model["expert_bytes"] * (moe.experts_touched(16) - k) / experts
    )
    dense = CostModel.named("H200", "qwen3-8b")
    assert dense._bytes_read(1) == dense._bytes_read(16) == dense.model["weight_bytes"]
    # at batch 1 on B200 and H200 a DFlash round committing 6 tokens (math, findings' SGLang DFlash on a 3B-active
    # MoE) beats six AR steps; one committing 2 (the slowdown reported at accept length ~2) does not beat two
    for gpu in ("B200", "H200"):
        cost = CostModel.named(gpu, "qwen3-30b-a3b")
        ar, dflash = cost.decode_step(Decoding("ar"), [1000]), cost.decode_step(Decoding("dflash", 16), [1000])
        assert 6 * ar / dflash > 1.5 and 2 * ar / dflash < 1.0


def test_moe_steps_follow_the_recorded_h200_steps_and_published_dflash_figures():
    # the shipped H200 profile against SGLang 0.5.16's steps with Qwen3-30B-A3B's shape (benchmarks/moe_check.py):
    # AR at 1-64 requests within 10%, speculative rounds of 16 and 64 requests (bound by the routed experts'
    # arithmetic whatever the routing) within 15%, and rounds of 1 and 4 requests between the bounds of their
    # routing (a random drafter's drafts route to fewer experts than real text, so only the bounds are checked there)
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import moe_check

    cost = CostModel.named("H200", "qwen3-30b-a3b", "sglang-0.5.16-h200")
    rows = moe_check.record_rows()
    assert sorted((r["kind"], r["batch"]) for r in rows) == sorted(
        (kind, batch) for kind in ("ar-server", "dflash", "ngram") for batch in (1, 4, 16, 64)
    )
    for row in rows:
        ratio = moe_check.step_costs.simulated(cost, row) / row["seconds"]
        if row["kind"] == "ar-server":
            assert 0.90 <= ratio <= 1.10, (row, ratio)
        elif row["batch"] >= 16:
            assert 0.85 <= ratio <= 1.15, (row, ratio)
        else:
            least, most = moe_check.routing_bounds(cost, row)
            assert least <= row["seconds"] <= most, (row, least, most)
    # a DFlash drafter is dense: its pass costs the same however the target routes its experts
    local = CostModel(cost.gpu, {**cost.model, "expert_repeat_factor": 1.0}, cost.runtime)
    chain = Decoding("dflash", 16)
    assert local.draft_seconds(chain, [1000]) == pytest.approx(cost.draft_seconds(chain, [1000]))
    assert local.decode_step(chain, [1000]) > cost.decode_step(chain, [1000])  # the verify does not
    # a prefill runs the same grouped GEMMs: slower than the same model's arithmetic at the dense rate; a share of
    # 0 is refused by name
    assert cost.prefill(1024) > 2 * cost.dense_equivalent().prefill(1024) - cost.runtime["prefill_fixed"]
    with pytest.raises(ValueError, match="moe_compute_efficiency"):
        CostModel(cost.gpu, cost.model, {**cost.runtime, "moe_compute_efficiency": 0}).prefill(1024)
    # published SGLang DFlash/AR on MoE at concurrency 1 (moe_check.PUBLISHED), within 10% with the generic runtime
    for gpu, tau, published, _ in moe_check.PUBLISHED:
        generic = CostModel.named(gpu, "qwen3-30b-a3b", "sglang")
        assert moe_check.dflash_over_ar(generic, tau) == pytest.approx(published, rel=0.10), gpu


def _probe_tables(log_text: str) -> list[list[tuple[int, list[float]]]]:
    """The rank-probe tables in a server log: per table, (reached, hit rates at t1..t32) per depth."""
    tables, rows = [], None
    for line in log_text.splitlines():
        if line.startswith("[DDTREE rank-probe]"):
            rows = []
            tables.append(rows)
        elif rows is not None and line.startswith("d") and line[1:2].isdigit():
            fields = line.split()
            rows.append((int(fields[1]), [float(x) for x in fields[2:]]))
    return tables


def test_ddtree_rank_probe_logs_where_the_target_token_ranks_as_the_pull_request_does(tmp_path):
    prompt = "Write a Python function that parses a CSV file and returns the rows as dictionaries. " * 4
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 700, "temperature": 0, "ignore_eos": True}}
    logs = {}
    for name, budget, env in (
        ("tree", "32", {"SGLANG_DDTREE_RANK_PROBE": "1"}),
        ("off", "32", {}),
        ("spine", "15", {"SGLANG_DDTREE_RANK_PROBE": "true"}),
    ):
        flags = [f if f != "32" else budget for f in DDTREE]
        server = start_sim(tmp_path / name, *flags, env=env)
        try:
            reply = requests.post(server.url + "/generate", json=body, timeout=60).json()
        finally:
            server.stop()
        logs[name] = (server.log_path.read_text(), reply["meta_info"])
    assert not _probe_tables(logs["off"][0]) and not _probe_tables(logs["spine"][0])  # tree mode only, when on
    tables = _probe_tables(logs["tree"][0])
    rounds = logs["tree"][1]["spec_verify_ct"]
    assert len(tables) == rounds // 50 >= 1  # one table per 50 verify steps, cumulative
    table = tables[-1]
    assert table[0][0] == 50 * len(tables)  # one request: every step reaches depth 0
    for d, (reached, rates) in enumerate(table):
        assert rates == sorted(rates) and 0 < rates[0] <= rates[-1] <= 1  # cumulative over wider top-t
        if d + 1 < len(table):
            # the walk goes on only through a token in the tree, whose rank is below the width: budget 32,
            # block 16 -> min(max(32 // 15 + 1, 2), 6) = 3, so within the top 4
            assert table[d + 1][0] <= round(rates[2] * reached) + 1
            assert table[d + 1][0] <= reached
    # a wider tree would catch what ranks 4-32 hold: the probe's point; the drafter has candidates there
    assert any(rates[5] > rates[2] for _, rates in table)


def test_rank_probe_costs_its_logits_read_and_walk_only_in_tree_mode():
    cost = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    contexts = [1000] * 8
    for budget, mode in ((15, "chain"), (32, "tree")):
        plain = Decoding("ddtree", 16, budget, overlap=False)
        probed = Decoding("ddtree", 16, budget, overlap=False, rank_probe=True)
        extra = cost.decode_step(probed, contexts) - cost.decode_step(plain, contexts)
        if mode == "chain":
            assert extra == 0
        else:
            logits = 8 * 15 * 151936 * 4 / (cost.gpu["bandwidth"] * cost.runtime["bandwidth_efficiency"])
            assert extra == pytest.approx(logits + 8 * cost.runtime["rank_probe_cpu_per_request"])
        assert repr(plain) == repr(probed)  # the acceptance draws do not change


def test_every_shipped_profile_value_is_a_number():
    from specsweep.modelling.profiles import default_profiles

    # YAML 1.1 reads 2e-06 (no dot) as a string: a profile copied by hand must still be numbers throughout
    shipped = default_profiles()
    for kind, entries in shipped.items():
        for name, entry in entries.items():
            if kind == "measured":  # which GPU and models a runtime was measured on: names of shipped profiles
                assert name in shipped["runtimes"] and entry["gpu"] in shipped["gpus"], name
                assert entry["models"] and set(entry["models"]) <= set(shipped["models"]), name
                continue
            if kind == "drafter_families":  # a family: {drafter: {parameter: number}}
                values = {f"{d}.{k}": v for d, params in entry.items() for k, v in (params or {}).items()}
            else:
                values = dict(entry)
            if kind == "models":  # the family of its drafters: the name of a shipped family
                assert values.pop("drafter_family", None) in (None, *shipped["drafter_families"]), name
            for key, value in values.items():
                assert isinstance(value, (int, float)), f"sim_profiles.yaml {kind}.{name}.{key} = {value!r}"


def test_the_builds_depth_bonus_variable_reaches_the_tree_the_server_and_the_plan():
    from specsweep.ddtree import build

    default = Decoding.of_build("ddtree", 16, 64, None, False, "sglang-pr29907", {})
    wide = Decoding.of_build("ddtree", 16, 64, None, False, "sglang-pr29907", {"SGLANG_DDTREE_DEPTH_BONUS": "-3"})
    assert default.depth_bonus is None and wide.depth_bonus == -3.0
    # the paper's build has no such variable: the environment leaves it alone
    assert (
        Decoding.of_build("ddtree", 16, 64, 8, False, "paper", {"SGLANG_DDTREE_DEPTH_BONUS": "-3"}).depth_bonus is None
    )

    def depth(tree):
        return max(len(prefix) for prefix in tree)

    def branches(tree):
        return sum(1 for prefix in tree if any(prefix))

    a = 0.8
    deep = build_tree(a, 15, 64, None, "sglang-pr29907")
    shallow = build_tree(a, 15, 64, None, "sglang-pr29907", -3.0)
    assert deep == build_tree(a, 15, 64, None, "sglang-pr29907", build("sglang-pr29907").depth_bonus)
    # the bonus moves nodes: a negative one sinks deep branches under the early-stop threshold (fewer nodes off
    # the spine), while the rank-0 spine stays whole, as the build guarantees
    assert branches(shallow) < branches(deep) and depth(shallow) == depth(deep) == 15
    assert all(tuple([0] * n) in shallow for n in range(1, 16))
    # the server takes it from its environment, as SGLang's build does
    from specsweep.sim.args import decoding_from_args, parse_args

    args = parse_args(["--model-path", "m", *DDTREE])
    os.environ["SGLANG_DDTREE_DEPTH_BONUS"] = "-3"
    try:
        assert decoding_from_args(args).depth_bonus == -3.0
    finally:
        del os.environ["SGLANG_DDTREE_DEPTH_BONUS"]
    # and the plan from the method's env in config
    from conftest import fast_config, validated
    from specsweep.methods import expand_methods

    config = fast_config()
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 64, "env": {"SGLANG_DDTREE_DEPTH_BONUS": "-3"}}]
    assert expand_methods(validated(config))[0].decoding.depth_bonus == -3.0


def test_a_prompt_in_flight_twice_is_read_once_at_the_measured_share():
    """The same prompt decoding in two requests holds one copy of its KV pages (the radix cache): the step reads
    the copy's pages again at shared_kv_reads of their cost, as the workflow's long cells on the H200 measured;
    distinct prompts share nothing, and a runtime that never measured it charges every copy in full."""
    from specsweep.sim.replay import engine
    from specsweep.sim.engine import PAGE

    sim = engine("ar")
    prompt = " ".join(f"word{i}" for i in range(2000))
    twins = [sim.submit(prompt, {"max_new_tokens": 8, "temperature": 0}) for _ in range(2)]
    other = sim.submit(prompt.replace("word1 ", "other "), {"max_new_tokens": 8, "temperature": 0})
    pages = len(twins[0].prompt_tokens) // PAGE
    assert pages > 10
    assert sim.shared_tokens(twins) == PAGE * pages
    assert sim.shared_tokens([twins[0], other]) == 0  # they differ from the second word on: no common page
    assert sim.shared_tokens(twins + [other]) == PAGE * pages
    h200 = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    share = h200.runtime["shared_kv_reads"]
    assert 0 < share < 1
    contexts, shared = [3000] * 64, 40 * 3000
    saved = h200.decode_step(Decoding("ar"), contexts) - h200.decode_step(Decoding("ar"), contexts, shared)
    kv_bw = h200.gpu["bandwidth"] * h200.runtime["attention_bandwidth_efficiency"]
    assert saved == pytest.approx((1 - share) * shared * h200.model["kv_bytes_per_token"] / kv_bw)
    generic = CostModel.named("H200", "qwen3-8b", "sglang")
    assert generic.decode_step(Decoding("ar"), contexts, shared) == generic.decode_step(Decoding("ar"), contexts)


def test_a_ddtree_tree_is_drafted_by_one_block_pass_whatever_its_budget():
    """DDTree builds its tree from the drafter's per-position distributions of one pass over the block: its drafting
    costs what DFlash's does for the same block at every budget (the tree's nodes cost their verify, not a wider
    drafter pass)."""
    h200 = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    assert h200.runtime["drafter_per_token"]
    for contexts in ([1024] * 16, [8192] * 64):
        dflash = h200.draft_seconds(Decoding("dflash", block_size=16), contexts)
        for budget in (15, 32, 128):
            tree = Decoding("ddtree", block_size=16, budget=budget, overlap=False)
            assert h200.draft_seconds(tree, contexts) == pytest.approx(dflash)
        assert h200.draft_seconds(Decoding("dflash", block_size=32), contexts) > 1.2 * dflash


def test_a_block_drafter_server_prefills_its_drafter_too_and_a_request_waits_outside_the_steps():
    """A DFlash or DDTree server's prefill step adds drafter_prefill_fraction x the target's weights' work (not its
    attention) + drafter_prefill_fixed; an NGRAM or AR server's is the target's alone; a request waits
    request_latency + request_latency_per_token x prompt tokens outside the steps."""
    p = profiles()
    runtime = {**p["runtimes"]["sglang"], "drafter_prefill_fraction": 0.25, "drafter_prefill_fixed": 0.003}
    runtime.update(request_latency=0.004, request_latency_per_token=2e-6, attention_compute_efficiency=0.2)
    runtime.update(prefill_fixed=0.0)
    cost = CostModel(p["gpus"]["H200"], p["models"]["qwen3-8b"], runtime)
    flops = p["gpus"]["H200"]["flops"] * runtime["compute_efficiency"]
    weights = 2 * p["models"]["qwen3-8b"]["active_params"] * 4096 / flops
    target = cost.prefill(4096, 4096**2 / 2)
    extra = 0.25 * weights + 0.003
    assert cost.prefill(4096) == pytest.approx(weights) and target > 1.05 * weights  # the attention pairs cost too
    for drafter in (Decoding("dflash", block_size=16), Decoding("ddtree", block_size=16, budget=32)):
        assert cost.prefill(4096, 4096**2 / 2, drafter) == pytest.approx(target + extra)
    assert cost.prefill(4096, 4096**2 / 2, Decoding("ngram", num_draft_tokens=8)) == target
    assert cost.prefill(4096, 4096**2 / 2, Decoding()) == target
    assert cost.request_latency(1000) == pytest.approx(0.006)


def _acceptance_by_session(records: list[dict]) -> dict:
    return {r["session"]: (r["output_tokens"], r["verify_ct"]) for r in records}


def test_the_overlap_scheduler_changes_the_steps_not_the_draws():
    sessions = build({"name": "short", "family": "short", "requests": 12, "max_new_tokens": 128}, seed=3)
    on = replay.closed_loop(replay.engine("dflash"), sessions, 1)
    off = replay.closed_loop(replay.engine("dflash", overlap=False), sessions, 1)
    assert _acceptance_by_session(on) == _acceptance_by_session(off)
    assert max(r["t_end"] for r in off) > max(r["t_end"] for r in on)  # its steps do cost more


def test_acceptance_moves_a_little_with_the_batch_and_never_for_a_request_alone():
    """bf16 batch numerics: a request that shares its steps accepts slightly differently (the outputs are the
    same tokens); the same request alone accepts the same whatever else the server ran."""
    sessions = build({"name": "short", "family": "short", "requests": 24, "max_new_tokens": 192}, seed=5)
    alone = _acceptance_by_session(replay.closed_loop(replay.engine("dflash"), sessions, 1))
    again = _acceptance_by_session(replay.closed_loop(replay.engine("dflash"), list(reversed(sessions)), 1))
    batched = _acceptance_by_session(replay.closed_loop(replay.engine("dflash"), sessions, 8))
    assert alone == again
    assert {s: v[0] for s, v in batched.items()} == {s: v[0] for s, v in alone.items()}  # the same tokens
    moved = [s for s in alone if batched[s][1] != alone[s][1]]
    assert moved  # some requests' rounds differ in a batch ...
    rounds = [sum(v[1] for v in side.values()) for side in (alone, batched)]
    assert rounds[1] == pytest.approx(rounds[0], rel=0.03)  # ... by little


def test_a_drafters_round_alone_is_its_own_draw_and_in_a_batch_a_few_depths_are_drawn_afresh():
    decoding = Decoding("dflash", block_size=16)
    acceptance = {**ACCEPTANCE, "batch_numerics": 0.05}
    alone = RankedDrafter(decoding, 0.8, random.Random("r"), acceptance)
    plain = RankedDrafter(decoding, 0.8, random.Random("r"), {**acceptance, "batch_numerics": 0.0})
    batched = RankedDrafter(decoding, 0.8, random.Random("r"), acceptance)
    same = changed = 0
    for _ in range(400):
        a, p, b = alone.round(0, 1), plain.round(0, 8), batched.round(0, 8)
        assert a == p  # alone: numerics off, the request's own draw
        changed += sum(x != y for x, y in zip(a[1], b[1]))
        same += len(a[1])
    # each depth drawn afresh with probability 0.05, and a fresh draw lands elsewhere in about 40% of them
    assert 0.005 < changed / same < 0.04


def test_dflash_acceptance_by_content_lands_in_the_published_ranges():
    """Chat, math, code and JSON tool calls each within their published DFlash range (PUBLISHED_DFLASH_BY_CONTENT,
    a 5% margin for the draws), from the prompts' own features (repetition, digits, structure symbols)."""
    predicted = predict_content(count=12, rounds=200)
    for kind, tau in predicted.items():
        low, high, _ = PUBLISHED_DFLASH_BY_CONTENT[kind]
        assert 0.95 * low <= tau <= 1.05 * high, (kind, tau, low, high)
    assert predicted["chat"] == min(predicted.values())


def test_every_model_profile_states_the_sizes_of_its_config_json():
    """Every shipped model profile states hidden_size, q_dim, kv_dim and vocab; q_dim and kv_dim are its heads and KV
    heads x head_dim; a non-hybrid model's KV cache a token is its layers' K and V in bf16 (2 x kv_dim x 2 bytes
    each); Qwen3-30B-A3B's sizes are those of the config.json its GPU records ran with."""
    models = profiles()["models"]
    assert set(models) >= {"qwen3-8b", "qwen3-30b-a3b", "hybrid-27b", "qwen3-0.6b", "llama-70b"}
    for name, m in models.items():
        assert model_problems(name, m) == [], name
        assert all(key in m for key in MODEL_DIMS), name
        assert m["q_dim"] == m["heads"] * m["head_dim"] and m["kv_dim"] == m["kv_heads"] * m["head_dim"], name
        if not m["hybrid"]:
            assert m["kv_bytes_per_token"] == pytest.approx(m["layers"] * 2 * m["kv_dim"] * 2, rel=0.01), name
    published = json.loads((REPO / "benchmarks/gpu/models/qwen3-30b-a3b.config.json").read_text())
    moe = models["qwen3-30b-a3b"]
    assert (moe["hidden_size"], moe["heads"], moe["kv_heads"], moe["head_dim"], moe["vocab"], moe["layers"]) == (
        published["hidden_size"],
        published["num_attention_heads"],
        published["num_key_value_heads"],
        published["head_dim"],
        published["vocab_size"],
        published["num_hidden_layers"],
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("q_dim"), r"model profile 'mine': q_dim missing, .*num_attention_heads x head_dim.*"),
        (lambda m: m.pop("hidden_size"), r"model profile 'mine': hidden_size missing, .*config\.json"),
        (lambda m: m.update(q_dim=4000), r"model profile 'mine': q_dim 4000 is not heads x head_dim \(32 x 128\)"),
        (lambda m: m.update(kv_dim=0), r"model profile 'mine': kv_dim: 0 is not a positive whole number"),
        (lambda m: m.pop("layers"), r"model profile 'mine': layers missing"),
    ],
)
def test_a_model_profile_without_its_sizes_is_refused_at_load(change, message):
    """A user's model profile lacking a size the cost model needs (or stating one that contradicts its heads) is
    refused where the profiles load and where the configuration loads, naming the profile and the key: no size
    is assumed."""
    mine = dict(profiles()["models"]["qwen3-8b"])
    change(mine)
    with pytest.raises(ProfileError, match=message):
        profiles({"models": {"mine": mine}})
    config = fast_config()
    config["sim"].update(model_profile="mine", profiles={"models": {"mine": mine}})
    with pytest.raises(ConfigError, match=r"^sim\.profiles: " + message):
        validated(config)
    assert profiles({"models": {"mine": profiles()["models"]["qwen3-8b"]}})["models"]["mine"]["q_dim"] == 4096


def test_the_eagle3_head_of_qwen3_30b_a3b_is_as_wide_as_its_hidden_size():
    """Qwen3-30B-A3B's hidden size is 2048 (its queries 4096 wide): its EAGLE-3 head's LM head and fused input
    projection are vocab x 2048 and 3 x 2048 x 2048, so a round drafts cheaper than with a 4096-wide head by the
    bytes saved, read once a forward (num_steps forwards at batch 1, where drafting reads weights), and the head
    of a model of 4096 hidden (Qwen3-8B) costs more than this one."""
    moe = CostModel.named("H200", "qwen3-30b-a3b")
    wide = CostModel(moe.gpu, {**moe.model, "hidden_size": 4096}, moe.runtime)
    head, wide_head = moe.draft_head(3), wide.draft_head(3)
    saved = 151936 * (4096 - 2048) * 2 + 3 * (4096**2 - 2048**2) * 2
    assert head["hidden_size"] == 2048 and head["q_dim"] == 4096
    assert wide_head["weight_bytes"] - head["weight_bytes"] == pytest.approx(saved)
    chain = Decoding("eagle3", topk=1, num_steps=3, num_draft_tokens=4)
    narrow_s, wide_s = moe.draft_seconds(chain, [1100]), wide.draft_seconds(chain, [1100])
    read = moe.gpu["bandwidth"] * moe.runtime["bandwidth_efficiency"]
    assert wide_s - narrow_s == pytest.approx(chain.num_steps * saved / read, rel=0.02)
    assert moe.decode_step(chain, [1100]) < wide.decode_step(chain, [1100])
    assert CostModel.named("H200", "qwen3-8b").draft_head(3)["weight_bytes"] > head["weight_bytes"]
