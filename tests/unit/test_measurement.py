"""Measurement: the real client against servers with known behaviour."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import statistics
import time
import warnings

import pytest

from conftest import DDTREE, load_default_config, one, patience, start_sim, start_stub, validated
from specsweep import metrics as m
from specsweep.cells import measure_cell
from specsweep.counters import scrape
from specsweep.client import Abort, LoadModel, measure, run_sessions
from specsweep.jobs import server_job
from specsweep.environment import probe
from specsweep.launcher import free_port, launch_command
from specsweep.workloads import WARMUP_FILL_TOKENS, build, workload_digest


def test_client_measures_a_known_schedule(tmp_path):
    schedule = [(0.08, 1), (0.03, 4), (0.02, 1), (0.04, 3)]
    server = start_stub(tmp_path, "--schedule", ",".join(f"{d}:{t}" for d, t in schedule), "--empty-first-chunk")
    try:
        records = [r.as_dict() for r in measure(server.url, [one()] * 5, 1, {}, timeout=patience(2))]
    finally:
        server.stop()
    due = [sum(d for d, _ in schedule[: i + 1]) for i in range(len(schedule))]  # each chunk's time after the send
    for r in records:
        assert r["chunk_tokens"] == [1, 4, 1, 3]  # the empty first chunk is not content
        assert r["output_tokens"] == 9
        # no chunk is dated before the stub could send it (the stub starts its schedule on receipt); how close
        # to the schedule the client dates them is a timing figure: benchmarks/client_overhead.py
        arrived = [t - r["t0"] for t in r["chunk_times"]]
        assert all(a >= d - 1e-3 for a, d in zip(arrived, due)) and arrived == sorted(arrived)
        assert m.ttft(r) == pytest.approx(arrived[0])
        gaps = m.chunk_gaps(r)
        assert gaps == pytest.approx([b - a for a, b in zip(arrived, arrived[1:])])
        # ITL spreads each gap over the tokens of the chunk that ended it; TPOT = (last - first chunk) / later tokens
        assert m.itl_per_token(r) == pytest.approx([gaps[0] / 4] * 4 + [gaps[1]] + [gaps[2] / 3] * 3)
        assert m.tpot(r) == pytest.approx((arrived[-1] - arrived[0]) / 8)
    assert m.tokens_per_chunk(records) == pytest.approx(8 / 3)


def test_cell_reports_the_window_delta_not_the_servers_cumulative_average(tmp_path):
    config = load_default_config()
    config["methods"] = [{"name": "ddtree", "algorithm": "ddtree", "budget": 32}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 6, "max_new_tokens": 64}]
    config["concurrency"] = [1]
    config["warmup"] = 0
    config = validated(config)
    params = server_job(config, 1, "ddtree")
    environment = probe("sim")
    argv, env = launch_command(params, free_port(), 8192)
    server = start_sim(tmp_path, *DDTREE)
    try:
        # earlier traffic the cell must not count: highly predictable code
        code = "def f(x):\n    return {'a': [x, x], 'b': (x, x)}\n" * 20
        measure(server.url, [one(code, 200)] * 4, 2, {"temperature": 0.0}, timeout=patience(12))
        sessions = build(params.workloads[0], 0)
        before = scrape(server.url)
        cell = {
            "tp": 1,
            "method": "ddtree",
            "workload": "short",
            "concurrency": 2,
            "repetition": 0,
            "requests": 6,
            "output": "results/cells/x.json",
            "key": "0" * 64,
        }
        result = measure_cell(server, params, cell, sessions, workload_digest(sessions), environment, argv, env)
    finally:
        server.stop()
    metrics = result.metrics
    cumulative = metrics["server_cumulative_accept_length_not_used"]
    delta = result.server_counters
    window = (delta["sglang:generation_tokens_total"] - metrics["requests_completed"]) / delta[
        "sglang:spec_verify_calls_total"
    ]
    assert metrics["acceptance_length_server"] == pytest.approx(window)
    assert abs(cumulative - window) / window > 0.05  # the cumulative value is different...
    assert metrics["acceptance_length_server"] != pytest.approx(cumulative, rel=0.05)  # ...and not used
    assert metrics["acceptance_length"] == pytest.approx(window, rel=0.02)
    assert metrics["acceptance_agreement"]["disagree"] is False
    assert before  # counters were scraped before the window


def test_a_cells_warm_up_fills_one_wave_of_its_concurrency_with_short_sessions(tmp_path):
    """warmup: 2 at concurrency 8: the two warm-up sessions and six more of at most WARMUP_FILL_TOKENS tokens each
    reach the server before the cell's own eight (so a batch of eight runs before the measurement), and the cell
    says so; at concurrency 1 the warm-up is the two sessions alone."""
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 16, "max_new_tokens": 48}]
    config["concurrency"] = [8]
    config["warmup"] = 2
    config["sampling"]["ignore_eos"] = True
    config = validated(config)
    params = server_job(config, 1, "ar")
    argv, env = launch_command(params, free_port(), 8192)
    server = start_sim(tmp_path)
    seen = []
    try:
        for concurrency in (8, 1):
            sessions = build(params.workloads[0], 0)
            before = scrape(server.url)
            cell = {"tp": 1, "method": "ar", "workload": "short", "concurrency": concurrency, "repetition": 0}
            cell |= {"requests": 8, "output": f"results/cells/c{concurrency}.json", "key": "0" * 64}
            result = measure_cell(server, params, cell, sessions, workload_digest(sessions), probe("sim"), argv, env)
            after = scrape(server.url)
            seen.append((before, after, result))
    finally:
        server.stop()
    for (before, after, result), fill in zip(seen, (6, 0)):
        delta = {k: after[k] - before[k] for k in ("sglang:num_requests_total", "sglang:generation_tokens_total")}
        warm_requests = delta["sglang:num_requests_total"] - 8
        warm_tokens = delta["sglang:generation_tokens_total"] - 8 * 48
        assert result.workload["warmup"] == 2 and result.workload["warmup_fill"] == fill
        assert warm_requests == 2 + fill
        assert warm_tokens == 2 * 48 + fill * WARMUP_FILL_TOKENS  # ignore_eos: every session its whole length


def test_multi_turn_sessions_turn_order_context_growth_and_think_time(tmp_path):
    sessions = build(
        {"name": "agent", "family": "agentic_1", "source": "builtin", "requests": 2, "turns": 3, "max_new_tokens": 32},
        0,
    )
    server = start_sim(tmp_path)
    try:
        records = measure(
            server.url, sessions, 1, {"temperature": 0.0}, timeout=patience(12), load=LoadModel(think_time=0.4)
        )
    finally:
        server.stop()
    rows = [r.as_dict() for r in records]
    assert [(r["session"], r["turn"]) for r in rows if r["session"] == sessions[0].id] == [
        (sessions[0].id, 0),
        (sessions[0].id, 1),
        (sessions[0].id, 2),
    ]
    # with one slot and think time, the second session's first turn goes while the first one thinks
    order = [(r["session"], r["turn"]) for r in rows]
    assert order.index((sessions[1].id, 0)) < order.index((sessions[0].id, 1))
    for sid in (s.id for s in sessions):
        turns = [r for r in rows if r["session"] == sid]
        prompts = [r["prompt_tokens"] for r in turns]
        assert prompts == sorted(prompts) and prompts[2] > prompts[0] + 500  # context grows by reply + tool result
        assert turns[2]["cached_tokens"] > 0  # the prefix cache serves earlier turns
        assert turns[1]["t_sched"] - turns[0]["chunk_times"][-1] >= 0.39  # think time before the next turn
    cell = m.cell_metrics(rows, tp=1, concurrency=1)
    assert set(cell["per_turn"]) == {"0", "1", "2"}
    assert cell["per_turn"]["2"]["cached_tokens_mean"] > 0
    assert cell["session_completion"]["n"] == 2 and cell["session_completion"]["p50"] > 0.8


def sim_gauges(url: str) -> dict:
    """The simulated server's running and queued requests, its aborted requests and generated tokens (/metrics)."""
    names = (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "specsweep_sim:aborted_requests_total",
        "sglang:generation_tokens_total",
    )
    return {name: scrape(url)[name] for name in names}


def test_an_abort_cancels_the_turns_under_way_and_the_server_stops_them(tmp_path):
    """Three slots: A's first turn (4 tokens) ends first and A's user thinks (its slot takes D), B (40 tokens) ends
    next and the abort decides on it, C and D (3000 tokens each) are under way. Their turns are cancelled without a
    record, A's next turn is dropped, and the server, seeing their client go away, stops them: its running requests
    fall to 0 with far fewer than their 6000 tokens generated. No task, socket or warning is left behind."""
    base = build({"name": "short", "family": "short", "requests": 4, "max_new_tokens": 8}, 0)
    lengths = {0: 4, 1: 40, 2: 3000, 3: 3000}
    sessions = [dataclasses.replace(s, max_new_tokens=lengths[i], ignore_eos=True) for i, s in enumerate(base)]
    a, b, c, d = (s.id for s in sessions)
    sessions[0] = dataclasses.replace(sessions[0], followups=[{"role": "user", "content": "Go on."}])
    abort = Abort(lambda records: records[-1].session == b)
    server = start_sim(tmp_path)

    async def run() -> tuple[list, set]:
        records = await run_sessions(
            server.url, sessions, 3, {"temperature": 0.0}, patience(60), load=LoadModel(think_time=60.0), abort=abort
        )
        return records, asyncio.all_tasks() - {asyncio.current_task()}

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records, pending = asyncio.run(run())
            gc.collect()  # an unclosed socket would warn here
        deadline = time.monotonic() + patience(10)
        while (gauges := sim_gauges(server.url))["sglang:num_running_reqs"] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    assert [(r.session, r.turn) for r in records] == [(a, 0), (b, 0)] and all(r.ok for r in records)
    assert abort.aborted and abort.turns == 2 and abort.sessions == {a, c, d}
    assert not pending and not caught, (pending, [str(w.message) for w in caught])
    assert gauges["sglang:num_running_reqs"] == 0 and gauges["sglang:num_queue_reqs"] == 0
    assert gauges["specsweep_sim:aborted_requests_total"] == 2  # C and D, stopped
    assert gauges["sglang:generation_tokens_total"] < 4 + 40 + 3000  # neither ran to its end


def test_openai_protocols_match_native(tmp_path):
    sessions = build({"name": "s", "family": "short", "requests": 3, "max_new_tokens": 40}, 1)
    server = start_sim(tmp_path)
    try:
        results = {
            p: [
                r.as_dict()
                for r in measure(server.url, sessions, 1, {"temperature": 0.0}, 30, load=LoadModel(protocol=p))
            ]
            for p in ("native", "openai-chat", "openai-completions")
        }
    finally:
        server.stop()
    for protocol, rows in results.items():
        assert all(r["error"] is None for r in rows), protocol
        assert [r["output_tokens"] for r in rows] == [r["output_tokens"] for r in results["native"]]
        assert [r["output_text"] for r in rows] == [r["output_text"] for r in results["native"]]
        assert all(r["chunk_tokens"][0] == 1 and sum(r["chunk_tokens"]) == r["output_tokens"] for r in rows)


def test_poisson_arrivals_and_queue_delay(tmp_path):
    sessions = build({"name": "s", "family": "short", "requests": 30, "max_new_tokens": 16}, 2)
    server = start_sim(tmp_path)
    try:
        rows = [
            r.as_dict()
            for r in measure(
                server.url, sessions, 64, {"temperature": 0.0}, 30, load=LoadModel("poisson", rate=40.0, seed=1)
            )
        ]
    finally:
        server.stop()
    scheduled = sorted(r["t_sched"] for r in rows)
    gaps = [b - a for a, b in zip(scheduled, scheduled[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 40, rel=0.5)
    assert statistics.pstdev(gaps) > 0.3 * statistics.mean(gaps)  # random arrivals, not a fixed interval
    assert all(m.queue_delay(r) >= 0 for r in rows)  # never sent before its arrival time


def test_percentiles_with_failures_as_infinite():
    values = [0.1, 0.2, 0.3, 0.4]
    assert m.summarise_with_failures(values, 0)["p50"] == pytest.approx(0.25)
    with_failures = m.summarise_with_failures(values, 4)  # half the requests failed
    assert with_failures["p50"] == pytest.approx(0.4)
    assert with_failures["p90"] == math.inf  # the 90th percentile is a failure


def test_first_divergence():
    assert m.first_divergence(list("abc"), list("abc")) is None
    assert m.first_divergence(list("abx"), list("abc")) == 2
    assert m.first_divergence(list("ab"), list("abc")) == 2
