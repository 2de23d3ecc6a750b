"""Per content kind and per draft depth: speedup of a kind on records whose throughputs are known by hand, and the
acceptance rate at each draft depth from hand-made histograms, from a simulated cell at forced acceptance and from
real GPU cells recorded with SGLang's rounds by drafts accepted."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest

from conftest import REPO, fast_config, validated
from specsweep import aggregate, algorithms
from specsweep import metrics as m


def serial(requests: list[tuple[str, float, int, int]]) -> list[dict]:
    """Records of requests sent one after another at concurrency 1, each (kind, seconds, tokens, chunks): its chunks
    evenly spaced over its seconds, its tokens evenly split among them; a session each, named by its position."""
    records, t = [], 0.0
    for i, (kind, seconds, tokens, chunks) in enumerate(requests):
        times = [t + seconds * (k + 1) / chunks for k in range(chunks)]
        records.append(
            {
                "session": f"s{i}",
                "turn": 0,
                "kind": kind,
                "t_sched": t,
                "t0": t,
                "t_end": times[-1],
                "chunk_times": times,
                "chunk_tokens": [tokens // chunks] * chunks,
                "output_tokens": tokens,
                "error": None,
                "verify_ct": chunks - 1 if chunks > 1 else None,
            }
        )
        t = times[-1]
    return records


def cell(method: str, algorithm: str, records: list[dict], params: dict | None = None, repetition=None) -> dict:
    """A cell JSON's fields that the kind and depth tables read."""
    return {
        "cell": {"tp": 1, "method": method, "workload": "short", "concurrency": 1, "repetition": repetition},
        "method": {"algorithm": algorithm, "params": params or {}},
        "requests": records,
        "load": {"model": "closed"},
        "seed": 0,
        "simulated": True,
    }


# AR: 10 tokens a second for every kind; the method: chat in half the time (20 tokens/s), code in a fifth (50 tokens/s)
AR = [("chat", 1.0, 10, 10), ("code", 1.0, 10, 10)] * 3
METHOD = [("chat", 0.5, 10, 5), ("code", 0.2, 10, 2)] * 3


def test_a_kinds_speedup_is_its_throughput_against_ars_with_the_engine_time_charged_over_the_whole_cell():
    ar, method = serial(AR), serial(METHOD)
    windows = [m.concurrency_report(r, 1)["window"] for r in (method, ar)]
    assert m.kind_throughput(method, "chat", windows[0]) == pytest.approx(30 / 1.5)  # 3 x 10 tokens in 3 x 0.5 s
    assert m.kind_throughput(method, "code", windows[0]) == pytest.approx(30 / 0.6)
    assert m.kind_throughput(ar, "code", windows[1]) == pytest.approx(30 / 3.0)
    assert m.kind_throughput(method, "math", windows[0]) is None  # no session of that kind
    chat = m.speedup(method, ar, *windows, kind="chat")
    code = m.speedup(method, ar, *windows, kind="code")
    assert chat["speedup"] == pytest.approx(2.0) and code["speedup"] == pytest.approx(5.0)
    assert chat["pairs"] == code["pairs"] == 3 and chat["speedup_ci"] is None  # below MIN_SESSIONS: no interval
    whole = m.speedup(method, ar, *windows)["speedup"]
    assert whole == pytest.approx((60 / 2.1) / (60 / 6.0))  # the cell's: 60 tokens in 2.1 s against 6 s
    # the kinds' rates weighted by the seconds charged to them give the cell's throughput
    assert (20 * 1.5 + 50 * 0.6) / 2.1 == pytest.approx(m.output_throughput(method, windows[0]))


def test_a_kinds_interval_is_over_its_own_sessions_and_none_below_min_sessions():
    # twelve code sessions of varied speed and four chat ones: an interval for code alone
    varied = [("code", 0.2 + 0.02 * (i % 5), 10, 2) for i in range(12)] + [("chat", 0.5, 10, 5)] * 4
    ar, method = serial([("code", 1.0, 10, 10)] * 12 + [("chat", 1.0, 10, 10)] * 4), serial(varied)
    windows = [m.concurrency_report(r, 1)["window"] for r in (method, ar)]
    code = m.speedup(method, ar, *windows, kind="code")
    lo, hi = code["speedup_ci"]
    assert code["pairs"] == 12 and lo < code["speedup"] < hi
    assert 1.0 / 0.28 <= lo and hi <= 1.0 / 0.2  # between the slowest and the fastest session's own speedup
    assert m.speedup(method, ar, *windows, kind="chat")["speedup_ci"] is None
    assert m.throughput_ci(method, windows[0], kind="code") is not None
    assert m.throughput_ci(method, windows[0], kind="chat") is None
    rows = aggregate.combine_kind_launches(
        aggregate.kind_rows({"ar.json": cell("ar", "ar", ar), "m.json": cell("fast", "dflash", method)})
    ).set_index(["method", "kind"])
    assert rows.loc[("fast", "code"), "sessions"] == 12 and rows.loc[("fast", "chat"), "sessions"] == 4
    assert rows.loc[("fast", "code"), "speedup_lo"] == pytest.approx(lo)
    assert rows.loc[("fast", "chat"), "speedup"] == pytest.approx(2.0) and math.isnan(
        rows.loc[("fast", "chat"), "speedup_lo"]
    )
    assert rows.loc[("fast", "chat"), "output_throughput"] == pytest.approx(20.0)
    assert rows.loc[("ar", "chat"), "speedup"] == pytest.approx(1.0)


def test_launches_of_a_kind_are_combined_with_an_interval_across_them():
    ar = serial(AR)
    slower = serial([("chat", 0.5 * 1.25, 10, 5), ("code", 0.2, 10, 2)] * 3)  # chat: 16 tokens/s
    cells = {
        "ar0": cell("ar", "ar", ar, repetition=0),
        "ar1": cell("ar", "ar", ar, repetition=1),
        "m0": cell("fast", "dflash", serial(METHOD), repetition=0),
        "m1": cell("fast", "dflash", slower, repetition=1),
    }
    rows = aggregate.combine_kind_launches(aggregate.kind_rows(cells)).set_index(["method", "kind"])
    chat = rows.loc[("fast", "chat")]
    assert chat["launches"] == 2 and chat["speedup"] == pytest.approx((2.0 + 1.6) / 2)
    assert chat["speedup_lo"] == pytest.approx(m.combine_launches([2.0, 1.6])["ci"][0])


def hand(histograms: list[list[int]]) -> list[dict]:
    records = serial([("chat", 1.0, 10, 2)] * len(histograms))
    for r, h in zip(records, histograms):
        r["correct_drafts_histogram"] = h
    return records


def test_acceptance_at_each_depth_is_the_share_of_rounds_that_accepted_at_least_that_many_drafts():
    # rounds that accepted 0, 1 and 3 drafts, and two that accepted 2: five rounds
    records = hand([[1, 1, 0, 1], [0, 0, 2]])
    assert m.acceptance_by_depth(records) == pytest.approx([4 / 5, 3 / 5, 1 / 5])
    rates = m.acceptance_by_depth(records, depth=5)  # the method drafts 5: no round reached depths 4 and 5
    assert rates == pytest.approx([4 / 5, 3 / 5, 1 / 5, 0, 0])
    assert m.conditional_acceptance(rates) == pytest.approx([4 / 5, 3 / 4, 1 / 3, 0, None])
    assert m.drafts_accepted(records) == [1, 1, 2, 1]


def test_the_depth_table_has_a_row_per_depth_to_the_methods_draft_depth_and_says_where_nothing_was_reported():
    spec = hand([[1, 1, 0, 1], [0, 0, 2]])
    spec[1]["kind"] = "code"
    silent = [dict(r, correct_drafts_histogram=None) for r in serial([("chat", 1.0, 10, 2)])]  # the client looked
    ngram = {"num_draft_tokens": 8, "max_bfs_breadth": 1, "match_type": "BFS"}
    cells = {
        "ar": cell("ar", "ar", serial(AR)),
        "dflash": cell("dflash", "dflash", spec, {"block_size": 6}),  # drafts 5 a round
        "ngram": cell("ngram", "ngram", silent, ngram),
        "older": cell("older", "ngram", serial([("chat", 1.0, 10, 2)]), ngram),  # a client that did not look
    }
    table = aggregate.depth_rows(cells)
    assert set(table["method"]) == {"dflash", "ngram", "older"}  # AR drafts nothing
    dflash = table[(table["method"] == "dflash") & (table["kind"] == aggregate.ALL_KINDS)]
    assert list(dflash["depth"]) == [1, 2, 3, 4, 5] and (dflash["draft_depth"] == 5).all()
    assert list(dflash["acceptance"]) == pytest.approx([4 / 5, 3 / 5, 1 / 5, 0, 0])
    assert (dflash["rounds"] == 5).all() and (dflash["requests_reported"] == 2).all()
    code = table[(table["method"] == "dflash") & (table["kind"] == "code")]
    assert list(code["acceptance"]) == pytest.approx([1, 1, 0, 0, 0])  # its one request: two rounds of 2 drafts
    (ngram,) = table[(table["method"] == "ngram") & (table["kind"] == aggregate.ALL_KINDS)].to_dict("records")
    assert not ngram["reported"] and ngram["requests_reported"] == 0 and ngram["requests_completed"] == 1
    assert ngram["note"] == aggregate.NOT_REPORTED and pd.isna(ngram["depth"])
    assert set(table.loc[table["method"] == "older", "note"]) == {aggregate.NOT_RECORDED}


def test_a_real_cell_recorded_before_the_client_read_the_rounds_says_so():
    path = REPO / "benchmarks/gpu/engines-2026-12-02/cells/tp1/ngram@sglang-0.5.16/short/c1.json"
    table = aggregate.depth_rows({str(path): json.loads(path.read_text())})
    assert len(table) and (~table["reported"]).all() and set(table["note"]) == {aggregate.NOT_RECORDED}


@pytest.mark.parametrize(
    ("algorithm", "params", "depth"),
    [
        ("dflash", {"block_size": 16}, 15),
        ("ddtree", {"block_size": 16, "budget": 8}, 8),
        ("ddtree", {"block_size": 16, "budget": 64}, 15),
        ("ngram", {"num_draft_tokens": 12}, 11),
        ("eagle3", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}, 3),
        ("eagle3", {"num_steps": 4, "topk": 4, "num_draft_tokens": 16}, 4),
        ("eagle3", {"num_steps": 6, "topk": 4, "num_draft_tokens": 4}, 3),
        ("ar", {}, 0),
    ],
)
def test_a_methods_draft_depth_is_the_most_drafts_a_round_can_accept(algorithm, params, depth):
    assert algorithms.get(algorithm).draft_depth(params) == depth


def depth_invariants(cell: dict) -> list[float]:
    """A cell's acceptance rates per depth (all sessions), checked against what any build's rounds must give: every
    request reported its rounds, one a verify round; rates in [0, 1], falling with depth, to the method's draft
    depth; their sum the mean drafts accepted a round, at least the delivered tokens' (tau - 1) and above it by no
    more than one round of drafts a request cut short (max_new_tokens or a stop)."""
    records = [r for r in cell["requests"] if r["error"] is None]
    algorithm = algorithms.get(cell["method"]["algorithm"])
    depth = algorithm.draft_depth(cell["method"]["params"])
    assert all(sum(r["correct_drafts_histogram"]) == r["verify_ct"] for r in records)
    rates = m.acceptance_by_depth(records, depth)
    assert rates is not None and len(rates) == depth
    assert all(0 <= b <= a <= 1 for a, b in zip([1.0, *rates], rates))
    rounds = sum(r["verify_ct"] for r in records)
    tau = m.acceptance_length(records)
    assert tau - 1 <= sum(rates) + 1e-9 <= tau - 1 + depth * len(records) / rounds
    return rates


def forced(cell: dict) -> list[float]:
    """The rates at acceptance forced to an integer L (SGLANG_SIMULATE_ACC_LEN): every round accepts L - 1 drafts."""
    accepted = int(cell["method"]["params"]["accept_length"]) - 1
    depth = algorithms.get(cell["method"]["algorithm"]).draft_depth(cell["method"]["params"])
    return [1.0] * accepted + [0.0] * (depth - accepted)


# Real GPU cells recorded with SGLang's rounds by drafts accepted (spec_correct_drafts_histogram): a glob and the
# rates its cells must give (None: the drafter's own acceptance, held to depth_invariants alone). One line a record.
REAL_CELLS = [
    ("benchmarks/gpu/forced-2026-12-02/cells/tp1/eagle3-*/short/c*.json", forced),  # SGLang 0.5.16, EAGLE-3, H200
    ("benchmarks/gpu/forced-moe-2026-12-02/cells/tp1/eagle3-*/*/c*.json", forced),  # the same on a MoE target
    # SGLang 0.5.16's NGRAM (8 draft tokens) on the H200, acceptance its own: a random model's looping output
    ("benchmarks/gpu/spec-2026-12-02/cells/tp1/ngram-d8/*/c*.json", None),
    # the same record's other speculative methods: NGRAM with 32 draft tokens, and drafters with random weights
    ("benchmarks/gpu/spec-2026-12-02/cells/tp1/ngram-d32/*/c*.json", None),
    ("benchmarks/gpu/spec-2026-12-02/cells/tp1/dflash/*/c*.json", None),
    ("benchmarks/gpu/spec-2026-12-02/cells/tp1/eagle3-*/*/c*.json", None),
    ("benchmarks/gpu/spec-2026-12-02/cells/tp1/standalone/*/c*.json", None),
]


@pytest.mark.parametrize(
    ("pattern", "expected"), REAL_CELLS, ids=["/".join(p.split("/")[2:6:3]) for p, _ in REAL_CELLS]
)
def test_acceptance_per_depth_of_real_gpu_cells(pattern, expected):
    paths = sorted(REPO.glob(pattern))
    assert paths, f"no cell matches {pattern}"
    for path in paths:
        cell = json.loads(path.read_text())
        rates = depth_invariants(cell)
        if expected is not None:
            assert rates == pytest.approx(expected(cell)), path
        table = aggregate.depth_rows({str(path): cell})
        whole = table[table["kind"] == aggregate.ALL_KINDS]
        assert list(whole["acceptance"]) == pytest.approx(rates), path
        for kind in set(table["kind"]) - {aggregate.ALL_KINDS}:  # each kind's rounds: forced alike
            of_kind = table[table["kind"] == kind]
            assert expected is None or list(of_kind["acceptance"]) == pytest.approx(expected(cell)), (path, kind)


def test_acceptance_per_depth_of_a_simulated_cell_at_forced_acceptance(tmp_path, monkeypatch):
    """The simulated server forces acceptance as SGLang does: at 3 tokens a round every round accepts 2 drafts of
    the chain's 3 (rates 1, 1, 0); at 2.5 half the rounds accept 1 and half 2 (rates 1, about 0.5, 0: within four
    binomial standard errors of the rounds)."""
    from specsweep.bench import bench_server
    from specsweep.cells import keyed_cells
    from specsweep.environment import probe
    from specsweep.jobs import server_job

    config = fast_config(requests=8, max_new_tokens=97)  # 96 tokens after the prefill's: 32 whole rounds of 3
    config["methods"] = [
        {"name": "e3", "algorithm": "eagle3", "drafter": "heads/eagle3", "num_steps": 3, "accept_length": [3, 2.5]}
    ]
    config["concurrency"] = [1]
    environment = probe("sim")
    monkeypatch.chdir(tmp_path)
    rates = {}
    for name in ("e3-a3", "e3-a2.5"):
        job = replace(server_job(validated(config), 1, name), cache_dir=str(tmp_path / "cache"))
        expected, _ = keyed_cells(job, environment["identity_digest"])
        bench_server(job, [c["path"] for c in expected], environment, tmp_path / "logs", all_methods=[job.method])
        (path,) = [c["path"] for c in expected]
        simulated = json.loads((tmp_path / path).read_text())
        assert simulated["simulated"]
        rates[name] = depth_invariants(simulated)
        table = aggregate.depth_rows({path: simulated})
        assert list(table.loc[table["kind"] == aggregate.ALL_KINDS, "acceptance"]) == pytest.approx(rates[name])
    assert rates["e3-a3"] == pytest.approx([1.0, 1.0, 0.0])
    rounds = 8 * 96 / 2.5
    assert rates["e3-a2.5"][0] == 1.0 and rates["e3-a2.5"][2] == 0.0
    assert abs(rates["e3-a2.5"][1] - 0.5) <= 4 * math.sqrt(0.25 / rounds)
