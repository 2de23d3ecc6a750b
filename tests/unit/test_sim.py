"""The simulated backend: algorithms, the HTTP API over loopback, the lifecycle of its process."""

from __future__ import annotations

import asyncio

import json
import random
import sys
import time
from collections import Counter

import pytest
import requests

from conftest import DDTREE, DFLASH, patience, start_sim
from specsweep.client import measure
from specsweep.counters import scrape
from specsweep.metrics import acceptance_by_depth
from specsweep.launcher import Server, ServerError, free_port
from specsweep.modelling.acceptance import accepted_tokens, build_tree, request_skill
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.profiles import profiles
from specsweep.sim.args import parse_args
from specsweep.sim.engine import Engine
from specsweep.workloads import build


SHORT = {"name": "short", "family": "short", "requests": 6, "max_new_tokens": 64}


def test_pull_request_build_runs_a_chain_up_to_block_minus_one_and_a_widening_tree_above():
    shapes = {b: Decoding("ddtree", 16, b, 8).tree_shape() for b in (4, 8, 15, 16, 32, 64, 128)}
    assert shapes == {
        4: ("chain", 1),
        8: ("chain", 1),
        15: ("chain", 1),
        16: ("tree", 2),
        32: ("tree", 3),
        64: ("tree", 5),
        128: ("tree", 8),
    }  # min(budget // 15 + 1, topk): the cap binds at 128
    assert Decoding("ddtree", 16, 128, None).tree_shape() == ("tree", 6)  # the build's own cap when unset
    assert Decoding("ddtree", 16, 8, 8, tree_build="paper").tree_shape() == ("tree", 8)
    assert Decoding("dflash", 16).tree_shape() is None
    # spine mode verifies the top-1 chain of `budget` tokens, where the paper's tree already branches
    assert build_tree(0.8, 15, 8, 8) == {tuple([0] * d) for d in range(1, 9)}
    assert max(max(p) for p in build_tree(0.5, 15, 8, 8, "paper")) > 0
    for a in (0.5, 0.8):
        tree = build_tree(a, 15, 32, 8)
        assert len(tree) == 32 and max(max(p) for p in tree) < 3  # width 3 at budget 32
        assert all(prefix[:-1] in tree or len(prefix) == 1 for prefix in tree)  # closed under parents
        # the depth bonus grows it deeper than the paper's tree of the same width and size
        paper = build_tree(a, 15, 32, 3, "paper")
        assert max(map(len, tree)) >= max(map(len, paper))
    assert max(map(len, build_tree(0.3, 15, 32, 8))) > max(map(len, build_tree(0.3, 15, 32, 3, "paper")))
    # early stop: for a weak drafter, unlikely branches are skipped and the tree stays below its budget;
    # the rank-0 spine still reaches the last depth
    weak = build_tree(0.3, 15, 128, 8)
    assert len(weak) < 128 and tuple([0] * 15) in weak


def test_spine_mode_accepts_no_more_than_its_chain():
    def tau(decoding):
        rng = random.Random(0)
        return sum(accepted_tokens(decoding, 0.8, rng) for _ in range(3000)) / 3000

    chain15 = tau(Decoding("dflash", 16))
    assert tau(Decoding("ddtree", 16, 15, 8)) == pytest.approx(chain15, rel=0.03)  # the same chain
    rng = random.Random(1)
    assert max(accepted_tokens(Decoding("ddtree", 16, 8, 8), 0.95, rng) for _ in range(500)) == 9  # 8 + bonus


def test_tree_has_budget_nodes_and_contains_the_chain():
    """The paper's build: the budget most probable prefixes at every budget."""
    tree = build_tree(0.8, 15, 32, 8, "paper")
    assert len(tree) == 32
    assert all(prefix[:-1] in tree or len(prefix) == 1 for prefix in tree)  # closed under parents
    assert max(max(p) for p in tree) < 8  # top-k cap
    chain = build_tree(0.8, 15, 15, 1, "paper")
    assert chain == {tuple([0] * d) for d in range(1, 16)}


def test_tree_acceptance_rises_with_budget_and_saturates():
    def tau(decoding):
        rng = random.Random(0)
        return sum(accepted_tokens(decoding, 0.8, rng) for _ in range(3000)) / 3000

    chain = tau(Decoding("dflash", 16))
    values = [tau(Decoding("ddtree", 16, b, 8, tree_build="paper")) for b in (4, 16, 64, 256)]
    assert values == sorted(values)
    assert values[1] >= chain * 0.97  # a budget-16 tree roughly matches a 15-token chain...
    assert values[3] > chain * 1.15  # ...larger trees accept more
    # diminishing returns: tokens gained per extra node fall, and tau never exceeds the block
    assert (values[3] - values[2]) / (256 - 64) < (values[1] - values[0]) / (16 - 4)
    assert values[3] <= 16


def test_predictable_text_is_drafted_better():
    code = "def f(x):\n    return {'a': [x, x + 1], 'b': (x, x)}\n" * 5
    chat = "I wonder whether the weather will be nice for our walk in the hills tomorrow afternoon."
    assert request_skill(code, 0.0, False).per_depth() > request_skill(chat, 0.0, False).per_depth()
    assert request_skill(chat, 1.0, False).per_depth() < request_skill(chat, 0.0, False).per_depth()
    assert request_skill(chat, 0.0, True).per_depth() < request_skill(chat, 0.0, False).per_depth()


def test_server_info_names_the_ddtree_mode_its_build_runs(tmp_path):
    chain = [f if f != "32" else "8" for f in DDTREE]
    for flags, env, expected in (
        (DDTREE, {}, ("tree", 3)),
        (chain, {}, ("chain", 1)),
        (DDTREE + ["--sim-ddtree-build", "paper"], {"SGLANG_DDTREE_MAX_TOPK": "4"}, ("tree", 4)),
    ):
        server = start_sim(tmp_path, *flags, env=env)
        try:
            info = requests.get(server.url + "/server_info", timeout=10).json()
        finally:
            server.stop()
        assert (info["ddtree_mode"], info["ddtree_width"]) == expected


def test_api_surface_and_streaming(tmp_path):
    server = start_sim(tmp_path, *DFLASH)
    try:
        info = requests.get(server.url + "/get_server_info", timeout=10).json()
        assert info["simulated"] is True
        assert requests.get(server.url + "/get_model_info", timeout=10).json()["model_path"] == "Qwen/Qwen3-8B"
        assert requests.get(server.url + "/health", timeout=10).status_code == 200
        body = {
            "text": "<|im_start|>user\nWrite JSON for a cat.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "sampling_params": {"max_new_tokens": 48, "temperature": 0},
            "stream": True,
        }
        with requests.post(server.url + "/generate", json=body, stream=True, timeout=30) as resp:
            lines = [l for l in resp.iter_lines() if l]
        assert lines[-1] == b"data: [DONE]"
        chunks = [json.loads(l[5:]) for l in lines[:-1]]
        meta = chunks[-1]["meta_info"]
        for key in ("prompt_tokens", "completion_tokens", "finish_reason", "spec_verify_ct", "spec_accept_length"):
            assert key in meta
        counts = [c["meta_info"]["completion_tokens"] for c in chunks]
        assert counts == sorted(counts) and counts[0] == 1
        assert max(b - a for a, b in zip(counts, counts[1:])) > 1  # speculative chunks carry several tokens
        assert meta["spec_verify_ct"] == len(chunks) - 1
        plain = requests.post(server.url + "/generate", json=dict(body, stream=False), timeout=30).json()
        assert plain["text"] == chunks[-1]["text"]
        text = requests.get(server.url + "/metrics", timeout=10).text
        assert "sglang:generation_tokens_total" in text and "sglang:spec_verify_calls_total" in text
    finally:
        server.stop()
    assert not server.alive()


def test_greedy_outputs_identical_across_methods(tmp_path):
    sessions = build(SHORT, seed=3)
    outputs = {}
    for name, flags in (("ar", []), ("dflash", DFLASH), ("ddtree", DDTREE)):
        server = start_sim(tmp_path, *flags)
        try:
            records = measure(server.url, sessions, 2, {"temperature": 0.0}, timeout=patience(12))
        finally:
            server.stop()
        assert all(r.ok for r in records)
        outputs[name] = [r.output_text for r in sorted(records, key=lambda r: r.session)]
        if name != "ar":
            assert all(r.verify_ct and r.verify_ct < r.output_tokens for r in records)
    assert outputs["ar"] == outputs["dflash"] == outputs["ddtree"]


def test_bad_flag_fails_start_with_log_tail(tmp_path):
    with pytest.raises(ServerError, match="unrecognized arguments: --speculative-bogus"):
        start_sim(tmp_path, "--speculative-bogus", "1")


def test_readiness_timeout_quotes_log_and_leaves_no_process(tmp_path):
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "specsweep.sim",
        "--model-path",
        "m",
        "--port",
        str(port),
        "--sim-startup-seconds",
        "60",
    ]
    server = Server(argv, {}, "127.0.0.1", port, tmp_path / "slow.log")
    with pytest.raises(ServerError, match=r"(?s)not ready after 2 s.*SIMULATED"):
        try:
            server.start(2.0)
        finally:
            server.stop()
    assert not server.alive()


def test_model_path_with_shell_metacharacters_arrives_unchanged(tmp_path):
    path = "/models/a b;$(touch pwned)&`id`|'x'\"y\""
    server = start_sim(tmp_path, model=path)
    try:
        assert requests.get(server.url + "/get_model_info", timeout=10).json()["model_path"] == path
    finally:
        server.stop()
    assert not (tmp_path / "pwned").exists()


def test_each_engine_step_is_a_chunk_of_its_own_even_when_read_late():
    from itertools import accumulate

    from specsweep.sim.replay import engine
    from specsweep.text import chat_prompt

    dflash = engine("dflash")
    req = dflash.submit(
        chat_prompt([{"role": "user", "content": "Write a Python function that sorts a list."}]),
        {"max_new_tokens": 200, "temperature": 0},
    )
    for _ in range(6):  # six steps before anyone reads the stream
        admitted, batch, _ = dflash.next_step()
        dflash.commit_step(admitted, batch)
    steps = [req.queue.get_nowait() for _ in range(req.queue.qsize())]
    assert [s.verify_ct for s in steps] == list(range(6))  # the prefill token, then one verify round per step
    assert [s.produced for s in steps] == list(accumulate(s.tokens for s in steps))
    assert max(s.tokens for s in steps[1:]) > 1  # a round's accepted draft tokens arrive together, as one chunk
    meta = [dflash.meta_info(req, "r", s) for s in steps]
    assert [m["completion_tokens"] for m in meta] == [s.produced for s in steps]
    assert [m["spec_verify_ct"] for m in meta] == list(range(6))


def test_stream_chunks_match_the_acceptance_counters_under_load(tmp_path):
    server = start_sim(tmp_path, *DFLASH)
    try:
        sessions = build({"name": "short", "family": "short", "requests": 24, "max_new_tokens": 128}, seed=5)
        records = measure(server.url, sessions, 12, {"temperature": 0.0}, timeout=patience(24))
    finally:
        server.stop()
    assert len(records) == 24 and all(r.ok for r in records)
    for r in records:
        assert sum(r.chunk_tokens) == r.output_tokens
        assert len(r.chunk_tokens) - 1 == r.verify_ct, (r.chunk_tokens, r.verify_ct)  # one chunk per verify round
        # the rounds by drafts accepted, as the client read them from the server's meta_info: one entry a round,
        # each round's chunk its drafts accepted plus the target's own token (the last round's may be cut short)
        rounds = Counter(n - 1 for n in r.chunk_tokens[1:-1])
        histogram = r.correct_drafts_histogram
        assert sum(histogram) == r.verify_ct and all(histogram[k] >= rounds[k] for k in rounds), (histogram, r)
    depths = acceptance_by_depth([r.as_dict() for r in records])
    assert depths and all(a >= b for a, b in zip(depths, depths[1:]))  # a deeper draft is accepted no more often
    drafts = sum(r.output_tokens - 1 - r.verify_ct for r in records) / sum(r.verify_ct for r in records)
    assert sum(depths) >= drafts and sum(depths) == pytest.approx(drafts, rel=0.05)  # the mean drafts a round


def test_generate_takes_token_ids_and_model_info_answers_as_sglangs_client_expects(tmp_path):
    from specsweep.workloads import tokenizer

    ids = tokenizer().encode("<|im_start|>user\nSort a list in Python.<|im_end|>\n<|im_start|>assistant\n").ids
    server = start_sim(tmp_path)
    try:
        r = requests.post(
            server.url + "/generate",
            json={"input_ids": ids, "stream": False, "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["prompt_tokens"] == len(ids)
        assert r.json()["meta_info"]["completion_tokens"] == 16
        bad = requests.post(server.url + "/generate", json={"input_ids": "not ids"}, timeout=30)
        assert bad.status_code == 400 and "input_ids" in bad.text
        info = requests.get(server.url + "/model_info", timeout=30)
        assert info.status_code == 200 and info.json()["model_path"] == "Qwen/Qwen3-8B"
        for path, body in (
            ("/v1/completions", {"prompt": "Say hi."}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}]}),
        ):
            exact = requests.post(server.url + path, json={**body, "max_tokens": 300, "ignore_eos": True}, timeout=60)
            assert exact.json()["usage"]["completion_tokens"] == 300, path  # the OpenAI API honours ignore_eos too
    finally:
        server.stop()


def test_a_scaled_clock_serves_modelled_minutes_in_moments_and_reports_them_in_modelled_seconds(tmp_path):
    """--sim-time-scale 1000: ten modelled minutes of start-up and a request of over a modelled minute of engine
    steps each end well inside a timeout far below their modelled length, while the server reports the request's
    e2e_latency in modelled seconds (at least the sum of its steps, taken in virtual time) and its scale."""
    prompt = "<|im_start|>user\nWrite a long story.<|im_end|>\n<|im_start|>assistant\n"
    sampling = {"max_new_tokens": 8000, "ignore_eos": True, "temperature": 0}
    reference = Engine(parse_args(["--model-path", "Qwen/Qwen3-8B", "--sim-gpu", "RTX-PRO-6000"]))
    req, modelled = reference.submit(prompt, sampling), 0.0
    while req.produced < len(req.reply):
        admitted, batch, seconds = reference.next_step()
        modelled += seconds
        reference.commit_step(admitted, batch)
    assert modelled > 60
    server = start_sim(
        tmp_path, "--sim-gpu", "RTX-PRO-6000", "--sim-time-scale", "1000", startup=600, timeout=patience(12)
    )
    try:
        reply = requests.post(server.url + "/generate", json={"text": prompt, "sampling_params": sampling}, timeout=30)
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
    finally:
        server.stop()
    meta = reply.json()["meta_info"]
    assert meta["completion_tokens"] == 8000
    assert meta["e2e_latency"] >= 0.999 * modelled and meta["queue_time"] >= 0
    assert info["sim_time_scale"] == 1000
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "m", "--sim-time-scale", "0"])


def _steps(sim: Engine, count: int) -> list[tuple[int, int, float]]:
    """(requests whose prefill completed, requests decoded, modelled seconds) of the next ``count`` steps."""
    out = []
    for _ in range(count):
        admitted, batch, seconds = sim.next_step()
        sim.commit_step(admitted, batch)
        out.append((len(admitted), len(batch), seconds))
    return out


def test_a_long_prompt_is_prefilled_in_chunks_while_the_running_batch_waits():
    """SGLang's default schedule: a prefill step of at most --chunked-prefill-size new tokens runs ahead of the
    decode steps; a 4,000-token prompt at 1,024 a step takes four prefill steps, in which the request already
    running gets no token, and the steps cost what prefilling its chunks costs."""
    long_prompt = " ".join(f"w{i}" for i in range(4000))

    def engine(chunk: int) -> Engine:
        sim = Engine(parse_args(["--model-path", "m", "--chunked-prefill-size", str(chunk)]))
        running = sim.submit("a short prompt", {"max_new_tokens": 64, "temperature": 0})
        _steps(sim, 3)  # its prefill, then two decode steps
        assert running.produced == 3
        sim.submit(long_prompt, {"max_new_tokens": 8, "temperature": 0})
        return sim

    chunked = engine(1024)
    tokens = len(chunked.waiting[0].prompt_tokens)
    steps = _steps(chunked, 5)
    prefills = -(-tokens // 1024)
    assert [(a, b) for a, b, _ in steps[:prefills]] == [(0, 0)] * (prefills - 1) + [(1, 0)]
    assert steps[prefills][:2] == (0, 2)  # then both decode together
    assert chunked.running[0].produced == 4  # one decode step's token since the prefill began
    whole = engine(-1)  # no limit: one prefill step
    assert [(a, b) for a, b, _ in _steps(whole, 2)] == [(1, 0), (0, 2)]
    assert sum(s for _, _, s in steps[:prefills]) > whole.cost.prefill(tokens, tokens * tokens / 2)


def test_a_burst_of_chunked_prompts_at_the_running_limit_runs_one_fewer_as_sglang_does():
    """SGLang 0.5.16 at --max-running-requests 16, 16 prompts of about 4k tokens sent together (the real record's
    long cells at concurrency 16): 15 are prefilled two a step, the step finishing the 15th's chunk counts it twice
    and shuts the 16th out until a request finishes; 16 short prompts (no chunk) all run at once."""

    def burst(words: int) -> tuple[Engine, list]:
        sim = Engine(parse_args(["--model-path", "m", "--max-running-requests", "16"]))
        sampling = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        reqs = [sim.submit(" ".join(f"r{i}w{j}" for j in range(words)), sampling) for i in range(16)]
        return sim, reqs

    sim, reqs = burst(3990)
    first_token_step = {}
    for step in range(200):
        _steps(sim, 1)
        for i, req in enumerate(reqs):
            if req.produced and i not in first_token_step:
                first_token_step[i] = step
        if sim.idle:
            break
    assert sorted(first_token_step) == list(range(16))
    late = [i for i, step in first_token_step.items() if step > 8]
    assert late == [15]  # the last of the burst, after the others' eight tokens
    assert first_token_step[15] == max(s for i, s in first_token_step.items() if i != 15) + 8  # their 7 decode steps
    sim, reqs = burst(100)
    _steps(sim, 1)
    assert all(req.produced == 1 for req in reqs)


def test_a_request_waits_its_request_latency_before_the_queue_in_arrival_order():
    """In real time a request reaches the queue request_latency + request_latency_per_token x prompt tokens after it
    arrived, and not before one that arrived earlier; its queue_time counts from there; stepped in virtual time it
    is queued at once."""
    runtime = {**profiles()["runtimes"]["sglang"], "request_latency": 0.02, "request_latency_per_token": 2e-5}
    args = ["--model-path", "m", "--sim-runtime", "slow", "--sim-profiles", json.dumps({"runtimes": {"slow": runtime}})]

    async def arrivals():
        sim = Engine(parse_args(args))
        sim.real_time = True
        long = sim.submit(" ".join(f"w{i}" for i in range(2000)), {"max_new_tokens": 4})  # 20 + 40 ms
        short = sim.submit("a short prompt", {"max_new_tokens": 4})  # 20 ms, but after the long one
        await asyncio.sleep(0.01)
        assert sim.waiting == []
        await asyncio.sleep(0.1)
        assert sim.waiting == [long, short]
        assert long.queued - long.started >= 0.06 and short.queued >= long.queued

    asyncio.run(arrivals())
    stepped = Engine(parse_args(args))
    req = stepped.submit("a short prompt", {"max_new_tokens": 4})
    assert stepped.waiting == [req]


def test_dummy_weights_loop_the_output_and_a_random_drafter_accepts_nothing():
    """--load-format dummy: the reply is its first three tokens over and over; DFlash commits one token a round
    (SGLang's accept length 1), NGRAM accepts the loop; the outputs are the same whatever the method."""
    from specsweep.sim.replay import engine
    from specsweep.text import chat_prompt

    prompt = chat_prompt([{"role": "user", "content": "Write a JSON parser in Python, with tests."}])
    sampling = {"max_new_tokens": 96, "temperature": 0, "ignore_eos": True}
    outputs, rounds = {}, {}
    for name, kwargs in (("ar", {}), ("dflash", {}), ("ngram", {"num_draft_tokens": 8})):
        sim = engine(name, load_format="dummy", **kwargs)
        req = sim.submit(prompt, sampling)
        while not sim.idle:
            _steps(sim, 1)
        outputs[name], rounds[name] = req.reply, req.verify_ct
    assert outputs["ar"] == outputs["dflash"] == outputs["ngram"]
    assert outputs["ar"] == (outputs["ar"][:3] * 40)[:96] and len(set(outputs["ar"])) > 1
    assert rounds["dflash"] == 95  # every round after the prefill's token commits one token
    assert rounds["ngram"] < 95 / 4  # the loop is drafted from the reply itself
    real = engine("dflash")
    req = real.submit(prompt, sampling)
    while not real.idle:
        _steps(real, 1)
    assert req.verify_ct < 95 and req.reply != outputs["ar"]  # with real weights the drafter accepts


def test_prompt_tokens_are_counted_as_the_model_counts_them():
    """sim.tokenizer model: a prompt's tokens (its steps' context, meta_info, usage, the context-length check) are
    the model's tokenizer's, as a real server counts them; approximate keeps the word splitter's."""
    from specsweep.workloads import count_tokens

    code = "def parse(text):\n    return json.loads(text)  # a JSON parser, with tests\n" * 60
    counted = {}
    for mode in ("model", "approximate"):
        sim = Engine(parse_args(["--model-path", "m", "--sim-tokenizer", mode, "--context-length", "8192"]))
        req = sim.submit(code, {"max_new_tokens": 8, "temperature": 0})
        counted[mode] = (req.length, sim.meta_info(req, "r")["prompt_tokens"], len(req.prompt_tokens))
    assert counted["model"][:2] == (count_tokens(code, "m"),) * 2
    assert counted["approximate"][:2] == (counted["approximate"][2],) * 2
    assert counted["model"][0] != counted["approximate"][0]
    tight = Engine(parse_args(["--model-path", "m", "--sim-tokenizer", "model", "--context-length", "700"]))
    with pytest.raises(ValueError, match=f"prompt of {counted['model'][0]} tokens"):
        tight.submit(code, {"max_new_tokens": 8, "temperature": 0})


def test_an_aborted_request_leaves_the_batch_and_a_step_under_way_emits_nothing_for_it():
    """Engine.abort: a running request aborted while a step that holds it is under way gets nothing from that step
    and is out of the next one (the other request decodes alone); a queued one never runs; a finished one is not
    counted."""
    sim = Engine(parse_args(["--model-path", "m"]))
    kept = sim.submit("a short prompt", {"max_new_tokens": 64, "temperature": 0})
    gone = sim.submit("another short prompt", {"max_new_tokens": 64, "temperature": 0})
    _steps(sim, 2)  # both prefilled, one decode step
    produced = gone.produced
    admitted, batch, _ = sim.next_step()
    assert gone in batch
    sim.abort(gone)  # its client went away while the step ran
    sim.commit_step(admitted, batch)
    assert gone.produced == produced and [r is kept for r in sim.running] == [True]
    assert sim.next_step()[1] == [kept]
    queued = sim.submit("a third prompt", {"max_new_tokens": 8, "temperature": 0})
    sim.abort(queued)
    assert not sim.waiting and queued.produced == 0
    sim.abort(kept)
    sim.abort(kept)  # once
    assert sim.idle and sim.counters["aborted_requests"] == 3
    done = sim.submit("a last prompt", {"max_new_tokens": 4, "temperature": 0})
    for _ in range(64):  # bounded: four tokens take a prefill and a few decode steps
        if done.produced >= len(done.reply):
            break
        _steps(sim, 1)
    assert done.produced == len(done.reply)
    sim.abort(done)  # its client went away after its last token: not an abort
    assert not done.aborted and sim.counters["aborted_requests"] == 3


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_a_stream_the_client_closes_is_stopped_and_frees_its_slot(tmp_path, path):
    """As SGLang aborts a streaming request whose client disconnects: a request for 4000 tokens whose client closes
    the connection after its first chunks leaves the running batch, long before its end."""
    server = start_sim(tmp_path)
    prompt = "<|im_start|>user\nTell a long story.<|im_end|>\n<|im_start|>assistant\n"
    sampling = {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}
    body = (
        {"text": prompt, "sampling_params": sampling, "stream": True}
        if path == "/generate"
        else {"prompt": prompt, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    )
    try:
        with requests.post(server.url + path, json=body, stream=True, timeout=30) as resp:
            lines = resp.iter_lines()
            assert [next(lines) for _ in range(3)]  # under way
        metrics: dict = {}
        deadline = time.monotonic() + patience(10)
        while time.monotonic() < deadline:
            metrics = scrape(server.url)
            if metrics["sglang:num_running_reqs"] == 0:
                break
            time.sleep(0.05)
    finally:
        server.stop()
    assert metrics["sglang:num_running_reqs"] == 0 and metrics["specsweep_sim:aborted_requests_total"] == 1
    assert metrics["sglang:generation_tokens_total"] < 2000
