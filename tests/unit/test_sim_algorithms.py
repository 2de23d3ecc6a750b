"""The simulated backend's NGRAM and draft-model mechanisms: acceptance from their own mechanism, costs from the
drafter's size, SGLang's flags and answers over HTTP."""

from __future__ import annotations

import random

import pytest
import requests

from conftest import patience, start_sim
from specsweep.modelling.acceptance import ACCEPTANCE, LookupDrafter, accepted_tokens, beam_tree, mean_tau
from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.profiles import default_profiles


def ngram(tokens=16, breadth=8, match="BFS"):
    return Decoding("ngram", num_draft_tokens=tokens, max_bfs_breadth=breadth, match_type=match)


def rounds(decoding, prompt, reply):
    """Tokens per round over a whole reply (the first token from the prefill), and the drafter."""
    drafter = LookupDrafter(decoding, prompt, reply)
    produced, count = 1, 0
    while produced < len(reply):
        produced += drafter.round(produced)[0]
        count += 1
    return (len(reply) - 1) / count, drafter


def test_ngram_acceptance_follows_the_repetition_of_the_output():
    prompt = [f"p{i}" for i in range(40)]
    loop = ["a", "b", "c"] * 40
    distinct = [f"t{i}" for i in range(120)]
    tau_loop, _ = rounds(ngram(16), prompt, loop)
    tau_distinct, _ = rounds(ngram(16), prompt, distinct)
    assert tau_distinct == 1.0  # nothing ever recurs: every round commits its bonus token only
    assert tau_loop > 8
    # once the loop is established, a round commits the whole tree's depth: 15 drafted nodes and the bonus
    assert LookupDrafter(ngram(16), prompt, loop).round(60)[0] == 16
    assert rounds(ngram(32), prompt, loop)[0] >= tau_loop  # a larger tree reaches no less far
    # a phrase the output repeats from earlier in itself is drafted when it recurs
    phrase = [f"w{i}" for i in range(12)]
    repeat = [f"x{i}" for i in range(20)] + phrase + [f"y{i}" for i in range(20)] + phrase
    drafter = LookupDrafter(ngram(16), prompt, repeat)
    start = 20 + 12 + 20 + 1  # the repeat's first token is known: its continuation comes from the first occurrence
    assert drafter.round(start)[0] >= 8
    assert drafter.round(5)[0] == 1


def test_ngram_indexes_the_output_and_the_prompts_last_tokens_as_sglang_0_5_16_inserts():
    body = [f"b{i}" for i in range(60)]
    prompt = body + [f"tail{i}" for i in range(20)]
    copy_of_body = body[10:50]  # an answer quoting the prompt's middle
    tau, _ = rounds(ngram(16), prompt, ["start"] + copy_of_body)
    assert tau == 1.0  # SGLang never inserts a prompt's body into its trie
    tail_copy = ["x"] + prompt[-12:]  # the prompt's last tokens are in it
    drafter = LookupDrafter(ngram(16), prompt, tail_copy)
    assert drafter.round(2)[0] > 1


def test_simulated_ngram_accepts_most_on_copying_heavy_content_and_least_on_open_generation():
    """As published n-gram lookup does (specsweep.modelling.published.PUBLISHED_NGRAM_BY_CONTENT): every
    copying-heavy kind (code, JSON tool calls, long documents) accepts more a round than every open one (chat,
    math), with SGLang 0.5.16's defaults over the workloads' own prompts."""
    from specsweep.modelling.published import COPYING_KINDS, OPEN_KINDS, predict_ngram_content

    taus = predict_ngram_content(count=10, new_tokens=192)
    assert set(taus) == set(COPYING_KINDS) | set(OPEN_KINDS)
    assert min(taus[k] for k in COPYING_KINDS) > max(taus[k] for k in OPEN_KINDS), taus


def test_the_simulated_server_orders_ngram_acceptance_by_content_within_its_draft_size():
    """The same order end to end: the simulated engine (sim.replay, virtual time) serving the short workload with
    SGLang 0.5.16's NGRAM defaults accepts more a round (SGLang's accept length: completion tokens / verify rounds,
    per kind over its requests) on code and JSON tool calls than on chat and math, and no round commits more than
    num_draft_tokens tokens (the tree's num_draft_tokens - 1 nodes and the bonus token)."""
    from specsweep.metrics import acceptance_length_sglang, of_kind
    from specsweep.modelling.published import COPYING_KINDS, OPEN_KINDS
    from specsweep.sim.replay import closed_loop, engine
    from specsweep.workloads import build

    sim, served = engine("ngram"), []
    submit = sim.submit
    sim.submit = lambda *args, **kwargs: served.append(submit(*args, **kwargs)) or served[-1]  # type: ignore[method-assign]
    sessions = build({"name": "short", "family": "short", "requests": 80, "max_new_tokens": 192}, seed=1)
    records = closed_loop(sim, sessions, 4, {"ignore_eos": True})
    accept = {kind: acceptance_length_sglang(of_kind(records, kind)) for kind in {r["kind"] for r in records}}
    copying, open_ = [k for k in COPYING_KINDS if k in accept], [k for k in OPEN_KINDS if k in accept]
    assert copying and open_, accept
    assert min(accept[k] for k in copying) > max(accept[k] for k in open_), accept
    size = sim.decoding.num_draft_tokens
    assert len(served) == len(records) and max(len(req.correct_drafts) for req in served) <= size
    assert max(accept.values()) <= size


def test_a_reply_to_open_chat_writes_its_own_words_and_a_grounded_one_repeats_itself():
    """The simulated reply (acceptance.reply_tokens) by copying(): open chat brings words its prompt does not
    have; code copies from its prompt (far fewer words of its own) and re-uses its own passages, so more of its
    4-grams recur."""
    from specsweep.modelling.acceptance import copying, reply_tokens
    from specsweep.modelling.published import content_prompts

    prompts = content_prompts(10)

    def recurring(reply):
        grams = [tuple(reply[i : i + 4]) for i in range(len(reply) - 3)]
        return 1 - len(set(grams)) / len(grams)

    chat, code = prompts["chat"], prompts["code"]
    assert max(map(copying, chat)) < min(map(copying, code))

    def new_words(prompt):
        reply, _ = reply_tokens(prompt, 256, ignore_eos=True)
        return sum(t.strip() not in prompt for t in reply) / len(reply)

    assert min(map(new_words, chat)) > 0.05
    assert sum(map(new_words, code)) / len(code) < min(map(new_words, chat)) / 2
    chat_repeat = sum(recurring(reply_tokens(p, 256, ignore_eos=True)[0]) for p in chat) / len(chat)
    code_repeat = sum(recurring(reply_tokens(p, 256, ignore_eos=True)[0]) for p in code) / len(code)
    assert code_repeat > chat_repeat


def test_ngram_tree_keeps_its_node_budget_and_breadth():
    prompt = [f"p{i}" for i in range(5)]
    # many different continuations of the same token: a bushy tree
    reply = [tok for i in range(30) for tok in ("k", f"v{i % 13}", f"u{i % 7}")]
    for tokens, breadth in ((8, 8), (32, 4), (64, 2), (128, 8)):
        drafter = LookupDrafter(ngram(tokens, breadth), prompt, reply)
        drafter._catch_up(len(reply) - 1)
        children = drafter.draft()
        assert len(children) - 1 <= tokens - 1  # the root (the last token) and num_draft_tokens - 1 nodes
        assert max(len(c) for c in children) <= breadth


def test_ngram_bfs_drafts_the_latest_continuation_prob_the_most_frequent():
    prompt = ["p"]
    # after "k": "often" three times, then "late" once, most recently
    reply = ["k", "often", "z1", "k", "often", "z2", "k", "often", "z3", "k", "late", "z4", "k"]
    latest, frequent = ngram(4, 1, "BFS"), ngram(4, 1, "PROB")
    for decoding, expected in ((latest, "late"), (frequent, "often")):
        drafter = LookupDrafter(decoding, prompt, reply + [expected, "end"])
        assert drafter.round(len(reply))[0] >= 2, decoding  # the drafted child is the one the reply takes


def eagle(topk=1, steps=3, tokens=None):
    return Decoding("eagle3", topk=topk, num_steps=steps, num_draft_tokens=tokens or steps + 1)


def draws(decoding, a, acceptance, n=4000):
    rng = random.Random(3)
    return sum(accepted_tokens(decoding, a, rng, acceptance=acceptance) for _ in range(n)) / n


def test_a_draft_models_tree_holds_only_candidates_of_its_beams():
    """SGLang keeps the topk best paths a step: a node's parent is among them, never a path the beam dropped."""
    for steps, topk, nodes in ((3, 2, 10), (4, 4, 15), (8, 8, 63), (5, 3, 5)):
        tree = beam_tree(0.3, steps, nodes, topk)
        assert len(tree) == min(nodes, topk + (steps - 1) * topk * topk)
        assert all(len(p) == 1 or p[:-1] in tree for p in tree)  # a tree
        for depth in range(2, steps + 1):  # at most topk parents a depth
            assert len({p[:-1] for p in tree if len(p) == depth}) <= topk


def test_draft_model_chains_and_trees_accept_as_their_shape_allows():
    profile = {**ACCEPTANCE, **default_profiles()["drafters"]["eagle3"]}
    taus = [draws(eagle(1, k), 0.8, profile) for k in (1, 3, 5, 7)]
    assert taus == sorted(taus) and all(t <= k + 1 for t, k in zip(taus, (1, 3, 5, 7)))
    assert max(accepted_tokens(eagle(1, 3), 0.95, random.Random(1), acceptance=profile) for _ in range(300)) == 4
    # a tree of many nodes catches what the chain misses
    assert draws(eagle(4, 5, 40), 0.6, profile) > draws(eagle(1, 5), 0.6, profile) + 0.2
    # a drafter less sure of itself than it is right branches early: at a few nodes its tree accepts less than
    # the chain of as many nodes (SGLang's measured 5/3/6 and 7/4/8 trees against 5- and 7-step chains)
    unsure = {**profile, "tree_confidence": 0.5}
    assert draws(eagle(3, 5, 6), 0.8, unsure) < draws(eagle(1, 5), 0.8, unsure) - 0.3
    sure = {**profile, "tree_confidence": 1.0}
    assert draws(eagle(3, 5, 6), 0.8, sure) == pytest.approx(draws(eagle(1, 5), 0.8, sure), abs=0.05)


def test_a_drafters_cost_comes_from_its_size_and_its_steps():
    cost = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    contexts = [1000] * 4
    head = cost.draft_seconds(eagle(1, 4), contexts)
    small_model = cost.draft_seconds(Decoding("standalone", topk=1, num_steps=4, num_draft_tokens=5), contexts)
    assert small_model > 2 * head > 0  # 28 layers against one
    steps = [cost.draft_seconds(eagle(1, k), contexts) for k in (1, 3, 6)]
    assert steps == sorted(steps) and steps[2] - steps[1] > 0
    # NGRAM drafts on the CPU: no drafter pass, a lookup that grows with the batch, a verify with the tree's nodes
    assert cost.draft_seconds(ngram(16), contexts) == 0
    lookup = [cost.decode_step(ngram(16), [1000] * b) - cost.decode_step(Decoding("ar"), [1000] * b) for b in (1, 16)]
    assert lookup[1] > lookup[0] > 0
    widths = [cost.decode_step(ngram(n), [1000] * 16) for n in (8, 32, 128)]
    assert widths == sorted(widths) and widths[2] > widths[0] * 1.5


def test_plan_expects_ngram_to_draft_a_random_models_loop_and_nothing_else_to_accept():
    prompts = ["<|im_start|>user\nWrite a haiku about rivers.<|im_end|>\n<|im_start|>assistant\n"] * 2
    assert mean_tau(prompts, ngram(16), looping=True) > 8
    assert mean_tau(prompts, ngram(16), looping=True) > mean_tau(prompts, ngram(16))


def test_the_simulated_server_speaks_sglangs_ngram_and_eagle3_flags(tmp_path):
    prompt = "Repeat after me: alpha beta gamma delta. " * 8
    body = {
        "text": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
    }
    flags = {
        "ngram": [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            "16",
            "--speculative-ngram-max-bfs-breadth",
            "4",
        ],
        "eagle3": [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "head",
            "--speculative-num-steps",
            "4",
            "--speculative-eagle-topk",
            "4",
            "--speculative-num-draft-tokens",
            "12",
        ],
    }
    for name, argv in flags.items():
        server = start_sim(tmp_path / name, *argv)
        try:
            with requests.post(server.url + "/generate", json=body, stream=True, timeout=60) as resp:
                chunks = [line for line in resp.iter_lines() if line.startswith(b"data: {")]
            import json

            last = json.loads(chunks[-1][6:])["meta_info"]
            assert last["completion_tokens"] == 200 and last["spec_verify_ct"] >= 1
            assert last["spec_accept_length"] == pytest.approx(200 / last["spec_verify_ct"])
            assert len(chunks) == last["spec_verify_ct"] + 1  # one chunk per round, after the prefill's
            info = requests.get(server.url + "/server_info", timeout=10).json()
            expected = {"ngram": (16, 4, 4), "eagle3": (12, 4, 4)}[name]
            assert (
                info["speculative_num_draft_tokens"],
                info["speculative_eagle_topk"],
                info["speculative_num_steps"],
            ) == expected
            if name == "ngram":  # resolved as SGLang reports them, the match type from its default
                assert (info["speculative_ngram_max_bfs_breadth"], info["speculative_ngram_match_type"]) == (4, "BFS")
        finally:
            server.stop()
    with pytest.raises(Exception, match="exited with code 2"):
        start_sim(tmp_path / "bad", "--speculative-algorithm", "EAGLE3", timeout=patience(2))  # no draft model
    with pytest.raises(Exception, match="exited with code 2"):
        start_sim(tmp_path / "bad2", *flags["ngram"], "--speculative-draft-model-path", "d", timeout=patience(2))


def test_draft_model_acceptance_within_12_percent_of_every_published_engine_figure():
    """The shipped drafter profiles against PUBLISHED_DRAFT_MODELS (benchmarks/README.md has the whole table)."""
    from specsweep.modelling.published import predict_draft_models

    rows = predict_draft_models(count=20, rounds=150)
    assert {r["algorithm"] for r in rows} == {"eagle", "eagle3", "standalone"}
    for r in rows:
        assert r["predicted"] == pytest.approx(r["published"], rel=0.12), r
    # the shape SGLang measured: a tree of 6 nodes accepts less than the chain of 6
    by = {(r["prompts"], r["num_steps"], r["topk"]): r["predicted"] for r in rows if r["algorithm"] == "eagle3"}
    assert by["alpaca", 5, 3] < by["alpaca", 5, 1]


@pytest.mark.parametrize("forced, topk", [(2.5, 1), (3.0, 4)])
def test_forced_acceptance_commits_its_length_whatever_the_drafter_as_sglang_does(tmp_path, forced, topk):
    """SGLANG_SIMULATE_ACC_LEN on an EAGLE-3 server with dummy weights (whose own drafter never accepts): each round
    commits floor(a) or floor(a) + 1 tokens, their mean a, on a chain and on a tree alike."""
    from specsweep.client import measure
    from specsweep.metrics import acceptance_length
    from specsweep.workloads import build

    tree = ["--speculative-num-draft-tokens", "8"] if topk > 1 else []
    argv = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "head", "--load-format", "dummy"]
    argv += ["--speculative-num-steps", "4", "--speculative-eagle-topk", str(topk), *tree]
    sessions = build({"name": "short", "family": "short", "requests": 8, "max_new_tokens": 160}, seed=2)
    measured = {}
    for env in ({}, {"SGLANG_SIMULATE_ACC_LEN": str(forced)}):
        server = start_sim(tmp_path, *argv, env=env)
        try:
            records = [r.as_dict() for r in measure(server.url, sessions, 4, {"temperature": 0.0}, timeout=120)]
        finally:
            server.stop()
        assert all(r["error"] is None for r in records)
        measured[bool(env)] = records
    assert acceptance_length(measured[False]) == 1.0  # the dummy drafter alone: the target's own token a round
    assert acceptance_length(measured[True]) == pytest.approx(forced, rel=0.05)  # the last round may be cut short
    lengths = {k for r in measured[True] for k, rounds in enumerate(r["correct_drafts_histogram"]) if rounds}
    assert lengths <= {int(forced) - 1, int(forced)}  # drafts accepted a round: floor(a) - 1 or floor(a)
